"""Rules for long polling (the durable level from revision 0004): one poller of a bot holds its
lease across every process, and a batch is recorded, with the offset that confirms it, only
under that lease."""

from __future__ import annotations

from app.store.conformance._core import BOT, OTHER_BOT, _body, _Findings, _rule
from app.store.contract import OperatorStore
from app.store.types import NewUpdate


def _polled(*update_ids: int, bot: str = BOT) -> list[NewUpdate]:
    return [NewUpdate(bot, n, _body(n), 1_000, "message", f"chat:{n % 2}") for n in update_ids]


@_rule("one poller holds a bot's lease; a batch and its offset commit only under it", "durable")
async def _poller_lease(store: OperatorStore, f: _Findings) -> None:
    f.equal(await store.take_poller(BOT, holder="a", now=0, lease_until=100), 0, "the first take")
    f.equal(await store.take_poller(BOT, holder="b", now=50, lease_until=150), None, "a rival")
    f.equal(
        await store.take_poller(OTHER_BOT, holder="b", now=50, lease_until=150), 0, "a bot each"
    )
    f.equal(await store.take_poller(BOT, holder="a", now=60, lease_until=160), 0, "a renewal")
    added = await store.record_polled(BOT, _polled(5, 6), holder="a", now=70, offset=7)
    f.equal(added, {(BOT, 5), (BOT, 6)}, "a batch under the lease")
    again = await store.record_polled(BOT, _polled(6, 7), holder="a", now=80, offset=8)
    f.equal(again, {(BOT, 7)}, "a batch fetched again: its duplicates change nothing")
    stolen = await store.record_polled(BOT, _polled(9), holder="b", now=90, offset=10)
    f.equal(stolen, None, "a batch of a process without the lease")
    f.equal(await store.get_update(BOT, 9), None, "what it could not record")
    f.equal(await store.take_poller(BOT, holder="b", now=161, lease_until=300), 8, "a takeover")
    late = await store.record_polled(BOT, _polled(9), holder="a", now=170, offset=10)
    f.equal(late, None, "the old holder's batch after the takeover")
    f.equal(await store.take_poller(BOT, holder="a", now=170, lease_until=400), None, "then")
    f.equal(await store.release_poller(BOT, holder="a"), False, "a release by a non-holder")
    f.equal(await store.release_poller(BOT, holder="b"), True, "a release")
    f.equal(await store.take_poller(BOT, holder="a", now=171, lease_until=400), 8, "after it")
