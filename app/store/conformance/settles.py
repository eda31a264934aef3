"""Rules for what only the holder of a claim may write: settle, settle_owned, settle_many_owned,
and the fence they share (owns, owned_leases, renew_owned, owns inside a transaction)."""

from __future__ import annotations

import asyncio
import time

from app.store.conformance._core import (
    BOT,
    MAX,
    _body,
    _claimed,
    _Findings,
    _other,
    _record,
    _rule,
    _two_claims,
)
from app.store.contract import FencedUpdateStore, UpdateStore
from app.store.types import Abandoned, ClaimIdentity, Completed, Failed, HandedBack

# -- base ------------------------------------------------------------------------------------


@_rule("only the attempt holding the update renews or settles it", "base")
async def _holder_only(store: UpdateStore, f: _Findings) -> None:
    await _record(store, 1)
    stale = await store.claim(BOT, 1, now=10, lease_until=100, max_attempts=3)
    fresh = await store.claim(BOT, 1, now=101, lease_until=200, max_attempts=3)
    f.equal((stale, fresh), (1, 2), "two claims around a lapse")
    f.equal(await store.renew(BOT, 1, 1, 300), False, "renew by the stale attempt")
    await store.settle(BOT, 1, 1, Completed(150))
    f.equal(
        await store.claim(BOT, 1, now=150, lease_until=300, max_attempts=3),
        None,
        "claim after the stale settle (the row must still be leased by attempt 2)",
    )
    f.equal(await store.renew(BOT, 1, 2, 250), True, "renew by the holder")
    await store.settle(BOT, 1, 2, Completed(251))
    f.equal(
        await store.claim(BOT, 1, now=252, lease_until=400, max_attempts=3),
        3,
        "claim after a settle past the lease (it must have been ignored)",
    )
    await store.settle(BOT, 1, 3, Completed(400))
    f.equal(await store.due(now=500, pending_before=500, limit=10), [], "due after completion")
    f.equal(await store.prune(401), 1, "prune of the completed row")


@_rule("a failed update is due at its retry time and not before", "base")
async def _retry_time(store: UpdateStore, f: _Findings) -> None:
    await _record(store, 1)
    attempt = await store.claim(BOT, 1, now=10, lease_until=100, max_attempts=MAX)
    f.equal(attempt, 1, "first claim")
    await store.settle(BOT, 1, 1, Failed(20, 50, "HTTP 500"))
    f.equal(await store.due(now=49, pending_before=49, limit=10), [], "due before the retry")
    f.equal(await store.claim(BOT, 1, now=49, lease_until=100, max_attempts=MAX), None, "at 49")
    due = await store.due(now=50, pending_before=50, limit=10)
    f.equal([d.update_id for d in due], [1], "due at the retry time")
    f.equal(await store.claim(BOT, 1, now=50, lease_until=100, max_attempts=MAX), 2, "at 50")
    await store.settle(BOT, 1, 2, Failed(60, 70, "HTTP 500"))
    f.equal(
        await store.claim(BOT, 1, now=70, lease_until=100, max_attempts=MAX),
        None,
        "claim with spent attempts",
    )
    f.equal(await store.due(now=1000, pending_before=1000, limit=10), [], "due after abandon")
    f.equal(await store.prune(71), 1, "prune of the abandoned row (settled when abandoned)")


# -- fenced ----------------------------------------------------------------------------------


@_rule("an attempt fence expires and never adopts a later claim", "fenced")
async def _fence(store: FencedUpdateStore, f: _Findings) -> None:
    await _record(store, 1)
    if (first := await _claimed(store, f)) is None:
        return
    f.equal(await store.owns(first, 100), True, "owns at exactly due_at")
    f.equal(await store.owns(first, 101), False, "owns 1 ms after due_at")
    for name, wrong in (
        ("claim_id", _other(first, claim_id=first.claim_id + "-wrong")),
        ("attempt", _other(first, attempt=first.attempt + 1)),
    ):
        f.equal(await store.owns(wrong, 50), False, f"owns with a wrong {name}")
        f.equal(await store.renew_owned(wrong, 200), False, f"renew_owned with a wrong {name}")
        f.equal(
            await store.settle_owned(wrong, Completed(50)), False, f"settle with a wrong {name}"
        )
    f.equal(await store.owns(first, 50), True, "owns after the wrong claim_id's attempts")
    f.equal(await store.settle_owned(first, Completed(50)), True, "settle by the holder")
    f.equal(await store.prune(51), 1, "prune after settle")
    f.equal(await store.add(BOT, 1, _body(1), 60), True, "re-add after prune")
    recycled = await store.claim_owned(BOT, 1, now=60, lease_until=160, max_attempts=MAX)
    if recycled is None:
        f.expect(False, "claim_owned of the re-recorded row gave None")
        return
    f.equal(recycled.attempt, first.attempt, "the recycled claim's attempt number")
    f.expect(recycled.claim_id != first.claim_id, "the recycled claim reuses the old claim_id")
    f.equal(await store.owns(first, 70), False, "owns by the first identity after recycling")
    f.equal(await store.renew_owned(first, 300), False, "renew by the first identity")
    f.equal(await store.settle_owned(first, Completed(70)), False, "settle by the first identity")
    f.equal(await store.owns(recycled, 160), True, "owns by the recycled identity")


@_rule("only the attempt holding the update renews or settles it (fenced)", "fenced")
async def _holder_only_fenced(store: FencedUpdateStore, f: _Findings) -> None:
    if (claims := await _two_claims(store, f)) is None:
        return
    stale, fresh = claims
    f.equal(await store.renew_owned(stale, 300), False, "renew_owned by the stale attempt")
    f.equal(await store.settle_owned(stale, Completed(150)), False, "settle by the stale attempt")
    f.equal(await store.owns(fresh, 150), True, "owns by the holder after the stale settle")
    f.equal(await store.renew_owned(fresh, 250, now=200), True, "renew_owned at exactly the lease")
    f.equal(await store.renew_owned(fresh, 240), True, "renew_owned to an earlier time")
    f.equal(await store.owns(fresh, 250), True, "owns at 250 after a shorter renew")
    f.equal(await store.renew_owned(fresh, 400, now=251), False, "renew_owned of a lapsed lease")
    f.equal(await store.settle_owned(fresh, Completed(251)), False, "settle after the lapse")
    third = await store.claim_owned(BOT, 1, now=251, lease_until=400, max_attempts=3)
    f.equal(None if third is None else third.attempt, 3, "claim after the refused settle")


async def _four_identities(
    store: FencedUpdateStore, f: _Findings
) -> tuple[ClaimIdentity, ClaimIdentity, ClaimIdentity, ClaimIdentity] | None:
    """For the batch rules: update 1's holder (leased until 200) and its stale attempt (lapsed
    at 100), update 2's holder (leased until 180), and a forgery of update 1's holder."""
    if (claims := await _two_claims(store, f)) is None:
        return None
    stale, fresh = claims
    await _record(store, 2)
    other = await store.claim_owned(BOT, 2, now=150, lease_until=180, max_attempts=MAX)
    if other is None:
        f.expect(False, "claim_owned of update 2 gave None")
        return None
    return fresh, stale, other, _other(fresh, claim_id=fresh.claim_id + "-wrong")


@_rule("a batch of owns answers each identity as owns does", "fenced")
async def _owned_leases(store: FencedUpdateStore, f: _Findings) -> None:
    if (leases := await _four_identities(store, f)) is None:
        return
    fresh, stale, other, forged = leases
    asked = [fresh, stale, other, forged, fresh]
    f.equal(
        await store.owned_leases(asked, 150),
        [200, None, 180, None, 200],
        "owned_leases at 150 (the holder twice, a stale attempt, another update, a forgery)",
    )
    f.equal(await store.owned_leases(asked, 181), [200, None, None, None, 200], "at 181")
    f.equal(await store.owned_leases(asked, 201), [None] * 5, "after every lease lapsed")
    f.equal(await store.owned_leases([], 150), [], "no identities")


@_rule("a batch of renewals extends each exact live lease, never shortening one", "fenced")
async def _renewed_leases(store: FencedUpdateStore, f: _Findings) -> None:
    if (leases := await _four_identities(store, f)) is None:
        return
    fresh, stale, other, forged = leases
    renewals = [(fresh, 300), (stale, 900), (other, 170), (forged, 900), (fresh, 250)]
    f.equal(
        await store.renewed_leases(renewals, 150),
        [300, None, 180, None, 300],
        "renewed_leases at 150 (the holder twice, a stale attempt, a shorter renewal, a forgery)",
    )
    f.equal(await store.owned_leases([fresh, other], 150), [300, 180], "the leases after it")
    f.equal(await store.renewed_leases([(other, 900)], 181), [None], "a lapsed lease")
    f.equal(await store.owned_leases([other], 180), [180], "the lapsed lease, not revived")
    f.equal(await store.renewed_leases([], 150), [], "no renewals")


@_rule("a batch settle applies each settlement only for its exact live identity", "fenced")
async def _settle_many(store: FencedUpdateStore, f: _Findings) -> None:
    settle_many = store.settle_many_owned
    await _record(store, 1, 2, 3, 4, 5)
    held = await store.claim_next_owned(now=10, lease_until=100, max_attempts=MAX, limit=10)
    ids = {c.identity.update_id: c.identity for c in held}
    if sorted(ids) != [1, 2, 3, 4, 5]:
        f.expect(False, f"claim_next_owned of five pending rows took {sorted(ids)}")
        return
    results = await settle_many(
        [
            (ids[1], Completed(100)),
            (_other(ids[2], claim_id="x"), Completed(50)),
            (ids[3], Completed(101)),
            (ids[4], Failed(50, 70, "HTTP 503")),
            (_other(ids[5], attempt=2), Abandoned(50, "stale")),
        ]
    )
    f.equal(results, [True, False, False, True, False], "results in input order")
    f.equal(await store.owns(ids[2], 60), True, "owns after a wrong claim_id's settle")
    f.equal(await store.owns(ids[5], 60), True, "owns after a wrong attempt's settle")
    due = await store.due(now=70, pending_before=70, limit=10)
    f.equal([d.update_id for d in due], [4], "due at the retry of the failed row")
    f.equal(await store.prune(101), 1, "prune of the one completed row")
    f.equal(await settle_many([]), [], "an empty batch")


@_rule("owns inside an open transaction blocks a concurrent reclaim", "fenced")
async def _owns_blocks_reclaim(store: FencedUpdateStore, f: _Findings) -> None:
    transaction = store.transaction
    await _record(store, 1)
    if (first := await _claimed(store, f)) is None:
        return
    held = asyncio.Event()
    hold_seconds = 0.2

    async def domain_write() -> float:
        async with transaction() as connection:
            f.equal(await store.owns(first, 100, connection=connection), True, "owns in the txn")
            held.set()
            await asyncio.sleep(hold_seconds)
        return time.monotonic()  # just after the commit

    async def reclaim() -> tuple[ClaimIdentity | None, float]:
        await held.wait()
        taken = await store.claim_owned(BOT, 1, now=101, lease_until=200, max_attempts=MAX)
        return taken, time.monotonic()

    committed, (second, finished) = await asyncio.gather(domain_write(), reclaim())
    # A reclaim that waited ends with the commit (either may be timed first); one that did not
    # wait ends a few milliseconds into the hold, long before.
    f.expect(
        finished >= committed - hold_seconds / 2,
        "the reclaim finished while the transaction still held the row",
    )
    f.equal(None if second is None else second.attempt, 2, "the reclaim after the commit")
    f.equal(await store.owns(first, 101), False, "owns by the first identity after the reclaim")


@_rule("a hand-back spends no attempt, keeps the last error and is fenced", "fenced")
async def _hand_back(store: FencedUpdateStore, f: _Findings) -> None:
    await _record(store, 1)
    current: ClaimIdentity | None = None

    async def claim(now: int) -> list[tuple[int, int]]:
        nonlocal current
        taken = await store.claim_next_owned(
            now=now, lease_until=now + 100, max_attempts=MAX, limit=10
        )
        current = taken[0].identity if taken else None
        return [(c.identity.attempt, c.counted) for c in taken]

    f.equal(await claim(10), [(1, 1)], "the first claim (attempt, counted)")
    if current is None:
        return
    f.equal(await store.settle_owned(current, Failed(20, 20, "HTTP 502")), True, "a retry")
    f.equal(await claim(30), [(2, 2)], "the retry's claim")
    if current is None:
        return
    f.equal(
        await store.settle_owned(_other(current, claim_id="x"), HandedBack(40)),
        False,
        "hand-back with a wrong claim_id",
    )
    f.equal(await store.settle_owned(current, HandedBack(40)), True, "the hand-back")
    row = await store.get_update(BOT, 1)
    f.equal(
        None if row is None else (row.state, row.attempts, row.due_at, row.error),
        ("failed", 2, 40, "HTTP 502"),
        "the row after the hand-back (state, attempts, due_at, error)",
    )
    f.equal(await claim(40), [(3, 2)], "the claim after a hand-back at budget's end")
    if current is None:
        return
    settled = await store.settle_many_owned([(current, HandedBack(50))])
    f.equal(settled, [True], "a hand-back in a batch")
    f.equal(await claim(60), [(4, 2)], "the claim after a batch hand-back")
    if current is None:
        return
    f.equal(await store.settle_owned(current, Failed(70, 80, "HTTP 503")), True, "a real retry")
    f.equal(await claim(80), [], "the claim once the budget is spent")
    row = await store.get_update(BOT, 1)
    f.equal(None if row is None else row.state, "abandoned", "the spent row's state")
