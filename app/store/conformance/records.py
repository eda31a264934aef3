"""Rules for how rows are recorded, listed and forgotten: add, add_many, due, prune, and the
upkeep beside them (refresh_statistics, reclaim_space)."""

from __future__ import annotations

from app.store.conformance._core import (
    BOT,
    MAX,
    OTHER_BOT,
    _body,
    _Findings,
    _record,
    _rule,
    stored_key,
)
from app.store.contract import UpdateStore
from app.store.types import Completed, Failed, NewUpdate


@_rule("one record per key", "base")
async def _one_record_per_key(store: UpdateStore, f: _Findings) -> None:
    f.equal(await store.add(BOT, 1, _body(1), 0), True, "add of a new key")
    f.equal(await store.add(BOT, 1, '{"update_id": 1, "other": true}', 5), False, "add of a dup")
    f.equal(await store.add(OTHER_BOT, 1, _body(1), 0), True, "same update_id, another bot")
    due = await store.due(now=10, pending_before=10, limit=10)
    f.equal(
        [(d.bot, d.update_id, d.body) for d in due],
        sorted([(BOT, 1, _body(1)), (OTHER_BOT, 1, _body(1))]),
        "due after adds (the first body is kept)",
    )
    attempt = await store.claim(BOT, 1, now=10, lease_until=100, max_attempts=MAX)
    f.equal(await store.add(BOT, 1, _body(1), 20), False, "add of a processing key")
    if attempt is not None:
        await store.settle(BOT, 1, attempt, Completed(50))
    f.equal(await store.add(BOT, 1, _body(1), 60), False, "add of a completed key")


@_rule("a batch insert records each new key once and leaves every recorded key as it was", "base")
async def _add_many(store: UpdateStore, f: _Findings) -> None:
    await _record(store, 1)
    attempt = await store.claim(BOT, 1, now=10, lease_until=100, max_attempts=MAX)
    f.expect(attempt == 1, f"claim of a recorded row gave {attempt!r}")
    new = await store.add_many(
        [
            NewUpdate(BOT, 1, '{"update_id": 1, "again": true}', 20),  # recorded, leased
            NewUpdate(BOT, 2, _body(2), 20),
            NewUpdate(BOT, 2, '{"update_id": 2, "second": true}', 21),  # twice in the batch
            NewUpdate(OTHER_BOT, 1, _body(1), 20, update_type="message", queue_key="7"),
        ]
    )
    f.equal(new, {(BOT, 2), (OTHER_BOT, 1)}, "the keys that were new")
    held = await store.get_update(BOT, 1)
    f.expect(
        held is not None and (held.state, held.attempts, held.due_at) == ("processing", 1, 100),
        f"the leased row after a batch naming it again: {held!r}",
    )
    due = await store.due(now=30, pending_before=30, limit=10)
    f.equal(
        [(d.bot, d.update_id, d.body) for d in due],
        sorted([(BOT, 2, _body(2)), (OTHER_BOT, 1, _body(1))]),
        "due after the batch (the first body of each new key, the leased row not)",
    )
    other = await store.get_update(OTHER_BOT, 1)
    f.expect(
        other is not None
        and (other.update_type, other.queue_key) == ("message", stored_key(store, "7")),
        f"a batch row's type and queue: {other!r}",
    )
    f.equal(await store.add_many([]), set(), "an empty batch")


@_rule("due is ordered by key and honours limit", "base")
async def _due_order(store: UpdateStore, f: _Findings) -> None:
    for bot, update_id in [(OTHER_BOT, 3), (BOT, 9), (BOT, 2), (OTHER_BOT, 1), (BOT, 5)]:
        await store.add(bot, update_id, _body(update_id), 0)
    expected = [(BOT, 2), (BOT, 5), (BOT, 9), (OTHER_BOT, 1), (OTHER_BOT, 3)]
    due = await store.due(now=1, pending_before=1, limit=10)
    f.equal([(d.bot, d.update_id) for d in due], expected, "due order")
    due = await store.due(now=1, pending_before=1, limit=3)
    f.equal([(d.bot, d.update_id) for d in due], expected[:3], "due with limit 3")
    await store.add(BOT, 20, _body(20), 100)
    due = await store.due(now=1, pending_before=99, limit=10)
    f.expect(
        (BOT, 20) not in [(d.bot, d.update_id) for d in due],
        "a row received after pending_before is listed",
    )
    due = await store.due(now=1, pending_before=1, limit=2, bots=[OTHER_BOT])
    f.equal([(d.bot, d.update_id) for d in due], expected[3:], "due for one bot")


@_rule("settled updates are forgotten after prune, with a strict bound", "base")
async def _prune(store: UpdateStore, f: _Findings) -> None:
    await _record(store, 1, 2, 3, 4)
    await store.claim(BOT, 1, now=10, lease_until=100, max_attempts=MAX)
    await store.settle(BOT, 1, 1, Completed(36))
    await store.claim(BOT, 2, now=10, lease_until=100, max_attempts=MAX)
    await store.claim(BOT, 3, now=10, lease_until=100, max_attempts=MAX)
    await store.settle(BOT, 3, 1, Failed(20, 10_000, "later"))
    f.equal(await store.prune(36), 0, "prune(36) of a row settled at 36")
    f.equal(await store.add(BOT, 1, _body(1), 40), False, "add before prune")
    f.equal(await store.prune(37), 1, "prune(37) of a row settled at 36")
    f.equal(await store.add(BOT, 1, _body(1), 40), True, "add after prune")
    f.equal(await store.prune(10**12), 0, "prune of pending, processing and failed rows")
    f.equal(
        await store.claim(BOT, 1, now=50, lease_until=150, max_attempts=MAX),
        1,
        "claim of the re-recorded update (its attempts restart)",
    )


@_rule("upkeep (statistics, reclaiming space) leaves every row as it was", "base")
async def _upkeep(store: UpdateStore, f: _Findings) -> None:
    await _record(store, 1, 2, 3)
    await store.claim(BOT, 1, now=10, lease_until=100, max_attempts=MAX)
    await store.settle(BOT, 1, 1, Completed(20))
    await store.claim(BOT, 2, now=10, lease_until=100, max_attempts=MAX)
    before = [await store.get_update(BOT, update_id) for update_id in (1, 2, 3)]
    for _ in range(2):  # the first may do it; the second finds it done
        refreshed = await store.refresh_statistics(min_changes=1, min_age_seconds=0)
        f.expect(isinstance(refreshed, bool), f"refresh_statistics answered {refreshed!r}")
        reclaimed = await store.reclaim_space(min_dead_rows=1, scale=0, min_age_seconds=0)
        f.expect(isinstance(reclaimed, bool), f"reclaim_space answered {reclaimed!r}")
    after = [await store.get_update(BOT, update_id) for update_id in (1, 2, 3)]
    f.equal(after, before, "the rows after the upkeep")
