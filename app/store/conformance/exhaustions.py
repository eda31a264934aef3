"""Rules for the durable level: exhaust, due_exhaustions, acknowledge_exhaustion, the delivery
lease (take_exhaustions, delivery_failed), and which
spent claims and settles end as a listed exhaustion."""

from __future__ import annotations

from typing import cast

from app.store.conformance._core import (
    BOT,
    MAX,
    OTHER_BOT,
    _body,
    _claimed,
    _Findings,
    _other,
    _record,
    _rule,
)
from app.store.contract import DurableUpdateStore, UpdateStore
from app.store.types import Abandoned, ClaimIdentity, Completed


async def _spent(store: DurableUpdateStore, update_id: int, bot: str = BOT) -> ClaimIdentity:
    """Record `update_id`, let two attempts lapse, and exhaust it with a third claim."""
    await store.add(bot, update_id, _body(update_id), 0)
    await store.claim_owned(bot, update_id, now=10, lease_until=100, max_attempts=MAX)
    last = await store.claim_owned(bot, update_id, now=101, lease_until=200, max_attempts=MAX)
    spent = await store.claim_owned(
        bot, update_id, now=201, lease_until=300, max_attempts=MAX, durable_exhaustion=True
    )
    if last is None or spent is not None:
        raise AssertionError(f"claims of {update_id} gave attempt 2 {last!r}, then {spent!r}")
    return last


@_rule("durable exhaustion survives owner loss until its exact acknowledgement", "durable")
async def _exhaustion_survives(store: DurableUpdateStore, f: _Findings) -> None:
    last = await _spent(store, 1)
    listed = await store.due_exhaustions(limit=10)
    f.equal([e.identity for e in listed], [last], "exhaustions after spent attempts")
    if listed:
        f.equal((listed[0].error, listed[0].exhausted_at), ("attempts spent", 201), "its record")
        f.equal(listed[0].body, _body(1), "its body")
    f.equal(await store.prune(10**12), 0, "prune of an unacknowledged exhaustion")
    f.equal(
        await store.acknowledge_exhaustion(_other(last, claim_id="x"), 300),
        False,
        "acknowledge with a wrong claim_id",
    )
    f.equal(
        await store.acknowledge_exhaustion(_other(last, attempt=1), 300),
        False,
        "acknowledge with a wrong attempt",
    )
    f.equal(len(await store.due_exhaustions(limit=10)), 1, "listed after wrong acknowledgements")
    f.equal(await store.acknowledge_exhaustion(last, 300), True, "the exact acknowledgement")
    f.equal(await store.acknowledge_exhaustion(last, 301), False, "a second acknowledgement")
    f.equal(await store.due_exhaustions(limit=10), [], "listed after the acknowledgement")
    f.equal(await store.prune(300), 0, "prune before the acknowledgement time")
    f.equal(await store.prune(301), 1, "prune after the acknowledgement")


@_rule("exhaust takes only the exact live claim and keeps its error", "durable")
async def _exhaust_fenced(store: DurableUpdateStore, f: _Findings) -> None:
    await _record(store, 1, 2)
    if (first := await _claimed(store, f, max_attempts=3)) is None:
        return
    f.equal(
        await store.exhaust(_other(first, claim_id="x"), 50, "HTTP 400"),
        False,
        "exhaust with a wrong claim_id",
    )
    f.equal(
        await store.exhaust(_other(first, attempt=2), 50, "HTTP 400"),
        False,
        "exhaust with a wrong attempt",
    )
    f.equal(await store.exhaust(first, 101, "HTTP 400"), False, "exhaust after the lapse")
    f.equal(await store.due_exhaustions(limit=10), [], "exhaustions after refused exhausts")
    second = await store.claim_owned(BOT, 1, now=101, lease_until=200, max_attempts=3)
    f.equal(None if second is None else second.attempt, 2, "the claim after a refused exhaust")
    if (other := await _claimed(store, f, 2, max_attempts=3)) is None:
        return
    error = "HTTP 403: bot was blocked by the user \u2713"
    f.equal(await store.exhaust(other, 100, error), True, "exhaust at exactly the lease")
    listed = await store.due_exhaustions(limit=10)
    f.equal(
        [(e.identity, e.error, e.exhausted_at) for e in listed],
        [(other, error, 100)],
        "the exhaustion with its error",
    )
    f.equal(await store.owns(other, 100), False, "owns after exhaust")
    f.equal(await store.settle_owned(other, Completed(100)), False, "settle after exhaust")
    f.equal(
        await store.claim_owned(BOT, 2, now=10**6, lease_until=10**6 + 1, max_attempts=3),
        None,
        "claim of an exhausted row",
    )
    f.equal(await store.prune(10**12), 0, "prune of the exhausted row (and a processing one)")
    f.equal(len(await store.due_exhaustions(limit=10)), 1, "the exhaustion after prune")


@_rule("claim_next_owned ends spent rows as claim does", "durable")
async def _claim_next_spent(store: DurableUpdateStore, f: _Findings) -> None:
    await _record(store, 1, 2)
    taken = await store.claim_next_owned(now=10, lease_until=100, max_attempts=1, limit=10)
    f.equal(sorted(c.identity.update_id for c in taken), [1, 2], "first claims")
    durable = await store.claim_next_owned(
        now=101, lease_until=200, max_attempts=1, limit=10, bots=[BOT], durable_exhaustion=True
    )
    f.equal(durable, [], "a claim that meets only spent rows")
    listed = await store.due_exhaustions(limit=10)
    f.equal(
        [(e.identity.update_id, e.identity.attempt, e.error) for e in listed],
        [(1, 1, "attempts spent"), (2, 1, "attempts spent")],
        "spent rows met with durable_exhaustion",
    )
    await _record(store, 3)
    await store.claim_next_owned(now=10, lease_until=100, max_attempts=1, limit=10)
    plain = await store.claim_next_owned(now=101, lease_until=200, max_attempts=1, limit=10)
    f.equal(plain, [], "a plain claim that meets a spent row")
    f.equal(len(await store.due_exhaustions(limit=10)), 2, "exhaustions after a plain claim")
    f.equal(await store.prune(102), 1, "prune of the plainly abandoned row")


@_rule("cursor paging returns exactly the rows after the cursor, across bots", "durable")
async def _exhaustion_paging(store: DurableUpdateStore, f: _Findings) -> None:
    keys = [(BOT, 3), (BOT, 8), (BOT, 11), (OTHER_BOT, 1), (OTHER_BOT, 2)]
    for bot, update_id in keys:
        await _spent(store, update_id, bot)
    await store.add(BOT, 5, _body(5), 0)  # pending: never listed
    pages: list[tuple[str, int]] = []
    after: tuple[str, int] | None = None
    for _ in range(10):
        page = await store.due_exhaustions(limit=2, after=after)
        if not page:
            break
        f.expect(len(page) <= 2, f"a page of {len(page)} rows with limit 2")
        pages += [(e.identity.bot, e.identity.update_id) for e in page]
        after = pages[-1]
    f.equal(pages, keys, "pages in order")
    rest = await store.due_exhaustions(limit=10, after=(BOT, 8))
    f.equal([(e.identity.bot, e.identity.update_id) for e in rest], keys[2:], "after (bot, 8)")
    mid = await store.due_exhaustions(limit=10, after=(BOT, 9))
    f.equal([(e.identity.bot, e.identity.update_id) for e in mid], keys[2:], "after (bot, 9)")
    only = await store.due_exhaustions(limit=10, bots=[OTHER_BOT])
    f.equal([(e.identity.bot, e.identity.update_id) for e in only], keys[3:], "one bot")


@_rule("a base claim with durable_exhaustion also ends as a listed exhaustion", "durable")
async def _base_durable_claim(store: DurableUpdateStore, f: _Findings) -> None:
    await _record(store, 1)
    f.equal(await store.claim(BOT, 1, now=10, lease_until=100, max_attempts=1), 1, "claim")
    f.equal(
        await store.claim(
            BOT, 1, now=101, lease_until=200, max_attempts=1, durable_exhaustion=True
        ),
        None,
        "claim with spent attempts",
    )
    listed = await store.due_exhaustions(limit=10)
    f.equal(
        [(e.identity.update_id, e.identity.attempt, e.error) for e in listed],
        [(1, 1, "attempts spent")],
        "the exhaustion",
    )
    f.equal(await store.prune(10**12), 0, "prune of the exhaustion")
    if listed:
        f.equal(await store.acknowledge_exhaustion(listed[0].identity, 500), True, "acknowledge")
    plain = cast(UpdateStore, store)
    await plain.add(BOT, 2, _body(2), 0)
    await plain.claim(BOT, 2, now=10, lease_until=100, max_attempts=1)
    await plain.claim(BOT, 2, now=101, lease_until=200, max_attempts=1)
    f.equal(
        [e.identity.update_id for e in await store.due_exhaustions(limit=10)],
        [],
        "a plain spent claim is not an exhaustion",
    )
    f.equal(await plain.prune(10**12), 2, "prune of the plain abandon and the acknowledged row")


@_rule("abandon settles for good and is not an exhaustion", "durable")
async def _abandon(store: DurableUpdateStore, f: _Findings) -> None:
    await _record(store, 1)
    if (identity := await _claimed(store, f)) is None:
        return
    f.equal(await store.settle_owned(identity, Abandoned(20, "unsupported")), True, "abandon")
    f.equal(await store.due_exhaustions(limit=10), [], "exhaustions after abandon")
    f.equal(await store.prune(21), 1, "prune of the abandoned row")


@_rule("each open exhaustion is leased to one deliverer, and its backoff is kept", "durable")
async def _delivery_lease(store: DurableUpdateStore, f: _Findings) -> None:
    last = await _spent(store, 1)
    other = await _spent(store, 2, bot=OTHER_BOT)

    async def take(now: int, bot: str = BOT) -> list[tuple[ClaimIdentity, int]]:
        lease_until = max(400, now + 1)
        taken = await store.take_exhaustions(now=now, lease_until=lease_until, limit=10, bots=[bot])
        return [(e.identity, e.deliveries) for e in taken]

    f.equal(await take(200), [], "take before the exhaustion (at 201)")
    f.equal(await take(300), [(last, 0)], "take once it is due")
    f.equal(await take(300), [], "a second take while the first one's lease lives")
    f.equal(await take(399), [], "a take just before the lease ends")
    f.equal(await take(300, OTHER_BOT), [(other, 0)], "another bot's exhaustion")
    taken = await store.take_exhaustions(now=400, lease_until=500, limit=10, bots=[BOT])
    f.equal([e.identity for e in taken], [last], "a take once the lease has lapsed")
    if not taken:
        return
    f.equal(taken[0].body, _body(1), "the body taken")
    f.equal(await store.delivery_failed(taken[0], 1_000), True, "a failed delivery")
    f.equal(await store.delivery_failed(taken[0], 2_000), False, "the same failure again")
    f.equal(await take(999), [], "a take before the retry time")
    again = await store.take_exhaustions(now=1_000, lease_until=1_100, limit=10, bots=[BOT])
    f.equal([(e.identity, e.deliveries) for e in again], [(last, 1)], "a take at the retry")
    f.equal(await store.acknowledge_exhaustion(last, 1_050), True, "the acknowledgement")
    f.equal(await take(10**9), [], "a take after the acknowledgement")
