"""Rules for the console's minute samples (the durable level from revision 0011, docs/design.md
decision 8): what processes add up, the backlog sampled once a minute, a window, a prune."""

from __future__ import annotations

from app.store.conformance._core import BOT, OTHER_BOT, _Findings, _record, _rule
from app.store.contract import OperatorStore
from app.store.operator_types import MinuteCounts
from app.store.types import DEFAULT_DESTINATION

MINUTE = 60_000
T = 1_796_000_040_000  # a whole minute


def _counts(minute: int, bot: str = BOT, **counts: int) -> MinuteCounts:
    return MinuteCounts(bot, DEFAULT_DESTINATION, minute, counts)


@_rule("samples of one minute add up, whoever counted them", "durable")
async def _samples_add_up(store: OperatorStore, f: _Findings) -> None:
    await store.add_samples([_counts(T, received=2, within_100=1), _counts(T + MINUTE, received=1)])
    await store.add_samples([_counts(T, received=3, delivered=4, timeouts=1)])
    await store.add_samples([_counts(T, bot=OTHER_BOT, received=7)])
    found = await store.samples([BOT], since=T, until=T + 2 * MINUTE)
    f.equal([(s.minute, s.counts["received"]) for s in found], [(T, 5), (T + MINUTE, 1)], "rows")
    first = found[0].counts if found else {}
    f.equal(
        (first.get("delivered"), first.get("timeouts"), first.get("within_100"), first.get("over")),
        (4, 1, 1, 0),
        "each count added, the ones nobody counted 0",
    )
    f.equal(found[0].backlog if found else "none", None, "a minute whose backlog was not sampled")


@_rule("samples refuse what is not a count of a minute, and write nothing", "durable")
async def _samples_refuse(store: OperatorStore, f: _Findings) -> None:
    for bad in (
        _counts(T, received=-1),
        _counts(T, sideways=1),
        _counts(T + 1, received=1),
        MinuteCounts("Not A Bot", DEFAULT_DESTINATION, T, {"received": 1}),
    ):
        try:
            await store.add_samples([_counts(T, received=1), bad])
        except ValueError:
            pass
        else:
            f.expect(False, f"{bad} was taken")
    f.equal(await store.samples([BOT], since=0, until=2 * T), [], "nothing written")


@_rule("one process samples each minute's backlog", "durable")
async def _backlog_once(store: OperatorStore, f: _Findings) -> None:
    await _record(store, 1, 2, at=T - 5_000)
    await _record(store, 3, at=T - 1_000)
    f.equal(await store.sample_backlog(T, now=T), True, "the first to ask")
    f.equal(await store.sample_backlog(T, now=T + 1), False, "another process, the same minute")
    found = await store.samples([BOT], since=T, until=T + MINUTE)
    got = [(sample.backlog, sample.oldest_age_ms) for sample in found]
    f.equal(got, [(3, 5_000)], "the backlog and its oldest update's age")
    f.equal(await store.sample_backlog(T + MINUTE, now=T + MINUTE), True, "the next minute")


@_rule("samples are read by window and pruned by minute", "durable")
async def _samples_window(store: OperatorStore, f: _Findings) -> None:
    await store.add_samples([_counts(T + n * MINUTE, received=n + 1) for n in range(5)])
    window = await store.samples([BOT], since=T + MINUTE, until=T + 3 * MINUTE)
    f.equal([s.counts["received"] for s in window], [2, 3], "the window, start in, end out")
    f.equal(await store.prune_samples(T + 2 * MINUTE), 2, "the minutes before")
    left = await store.samples([BOT], since=0, until=2 * T)
    f.equal([s.minute for s in left], [T + n * MINUTE for n in (2, 3, 4)], "what is left")
