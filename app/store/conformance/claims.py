"""Rules for taking and keeping a lease: claim, renew, claim_owned, claim_next_owned."""

from __future__ import annotations

import asyncio

from app.store.conformance._core import (
    BOT,
    MAX,
    OTHER_BOT,
    _body,
    _Findings,
    _other,
    _record,
    _rule,
    _two_claims,
    stored_key,
)
from app.store.contract import FencedUpdateStore, UpdateStore
from app.store.types import ClaimIdentity, Completed, Failed, NewUpdate

# -- base ------------------------------------------------------------------------------------


@_rule("a live lease is not taken, a lapsed one is", "base")
async def _live_lease(store: UpdateStore, f: _Findings) -> None:
    await _record(store, 1)
    f.equal(await store.claim(BOT, 1, now=10, lease_until=100, max_attempts=MAX), 1, "claim at 10")
    f.equal(await store.claim(BOT, 1, now=50, lease_until=150, max_attempts=MAX), None, "at 50")
    f.equal(await store.claim(BOT, 1, now=100, lease_until=150, max_attempts=MAX), None, "at 100")
    f.equal(await store.due(now=50, pending_before=50, limit=10), [], "due(now=50)")
    due = await store.due(now=101, pending_before=101, limit=10)
    f.equal([(d.bot, d.update_id) for d in due], [(BOT, 1)], "due(now=101)")
    f.equal(await store.claim(BOT, 1, now=101, lease_until=200, max_attempts=MAX), 2, "at 101")
    f.equal(await store.claim(BOT, 2, now=101, lease_until=200, max_attempts=MAX), None, "absent")


@_rule("of 8 concurrent claims exactly one takes the update", "base")
async def _concurrent_claims(store: UpdateStore, f: _Findings) -> None:
    await _record(store, 1)
    results = await asyncio.gather(
        *(store.claim(BOT, 1, now=10, lease_until=100, max_attempts=MAX) for _ in range(8))
    )
    f.equal(sorted(results, key=lambda r: r is None), [1] + [None] * 7, "claim results")


@_rule("renewal never shortens a live lease", "base")
async def _renew_never_shortens(store: UpdateStore, f: _Findings) -> None:
    await _record(store, 1)
    await store.claim(BOT, 1, now=10, lease_until=100, max_attempts=3)
    f.equal(await store.renew(BOT, 1, 1, 50), True, "renew to an earlier time")
    f.equal(
        await store.claim(BOT, 1, now=60, lease_until=200, max_attempts=3),
        None,
        "claim at 60 after a shorter renew",
    )
    f.equal(await store.renew(BOT, 1, 1, 200, now=100), True, "renew at exactly the lease")
    f.equal(await store.claim(BOT, 1, now=150, lease_until=300, max_attempts=3), None, "at 150")
    f.equal(await store.renew(BOT, 1, 1, 400, now=201), False, "renew of a lapsed lease")
    f.equal(await store.claim(BOT, 1, now=201, lease_until=300, max_attempts=3), 2, "at 201")


# -- fenced ----------------------------------------------------------------------------------


@_rule("a claim returns a fresh identity", "fenced")
async def _fresh_identity(store: FencedUpdateStore, f: _Findings) -> None:
    if (claims := await _two_claims(store, f)) is None:
        return
    first, second = claims
    f.equal((first.bot, first.update_id, first.attempt), (BOT, 1, 1), "first identity")
    f.equal(second.attempt, 2, "second attempt")
    f.expect(first.claim_id != second.claim_id, "two claims share a claim_id")
    f.equal(await store.owns(second, 150), True, "owns by attempt 2 while it holds the lease")
    attempt = await store.claim(BOT, 1, now=201, lease_until=300, max_attempts=3)
    f.equal(attempt, 3, "a base claim after fenced ones")
    f.equal(await store.owns(second, 250), False, "owns by attempt 2 after a base reclaim")
    adopted = _other(second, attempt=3)
    f.equal(await store.owns(adopted, 250), False, "a base claim kept the old claim_id")


@_rule("a claim carries the trace its update was recorded under, attempt after attempt", "fenced")
async def _claimed_trace(store: FencedUpdateStore, f: _Findings) -> None:
    traced = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    await store.add_many(
        [NewUpdate(BOT, 1, _body(1), 0, trace_context=traced), NewUpdate(BOT, 2, _body(2), 0)]
    )
    again = "00-" + "12" * 16 + "-" + "34" * 8 + "-01"  # Telegram's second delivery, traced anew
    await store.add_many([NewUpdate(BOT, 1, _body(1), 5, trace_context=again)])
    for now, attempt in ((10, 1), (101, 2)):  # the second after the first lease lapsed
        claimed = await store.claim_next_owned(
            now=now, lease_until=now + 90, max_attempts=MAX, limit=10, ordering="none"
        )
        f.equal(
            {(c.identity.update_id, c.identity.attempt): c.trace_context for c in claimed},
            {(1, attempt): traced, (2, attempt): None},
            f"the traces of attempt {attempt}",
        )


@_rule("of 8 concurrent claim_owned calls exactly one takes the update", "fenced")
async def _concurrent_claim_owned(store: FencedUpdateStore, f: _Findings) -> None:
    await _record(store, 1)
    results = await asyncio.gather(
        *(store.claim_owned(BOT, 1, now=10, lease_until=100, max_attempts=MAX) for _ in range(8))
    )
    winners = [r for r in results if r is not None]
    f.equal(len(winners), 1, "number of winning claims")


@_rule("claim_next_owned: concurrent callers take disjoint sets covering every due row", "fenced")
async def _claim_next_disjoint(store: FencedUpdateStore, f: _Findings) -> None:
    expected = {(bot, n) for bot in (BOT, OTHER_BOT) for n in range(1, 41)}
    for bot, update_id in sorted(expected):
        await store.add(bot, update_id, _body(update_id), 0)

    async def drain() -> list[tuple[str, int]]:
        taken: list[tuple[str, int]] = []
        while batch := await store.claim_next_owned(
            now=10, lease_until=1000, max_attempts=MAX, limit=7, ordering="none"
        ):
            f.expect(len(batch) <= 7, f"a batch of {len(batch)} rows with limit 7")
            taken += [(c.identity.bot, c.identity.update_id) for c in batch]
        return taken

    takes = await asyncio.gather(*(drain() for _ in range(4)))
    every = [key for take in takes for key in take]
    f.equal(len(every), len(set(every)), "rows taken by two callers")
    f.equal(set(every), expected, "rows taken in all")
    again = await store.claim_next_owned(now=20, lease_until=1000, max_attempts=MAX, limit=100)
    f.equal(again, [], "a second pass while every lease is live")
    lapsed = await store.claim_next_owned(
        now=1001, lease_until=2000, max_attempts=MAX, limit=100, ordering="none", bots=[BOT]
    )
    f.equal(
        {(c.identity.bot, c.identity.update_id) for c in lapsed},
        {(BOT, n) for n in range(1, 41)},
        "lapsed rows of one bot",
    )
    f.expect(all(c.identity.attempt == 2 for c in lapsed), "lapsed rows come back as attempt 2")
    one = lapsed[0] if lapsed else None
    if one is not None:
        f.equal(await store.owns(one.identity, 2000), True, "owns by a batch-claimed identity")
        f.equal(one.body, _body(one.identity.update_id), "the claimed body")


@_rule("claim_next_owned with chat ordering never passes an older row of the queue", "fenced")
async def _chat_ordering(store: FencedUpdateStore, f: _Findings) -> None:
    chats = {"100": [1, 4, 7, 8], "200": [2, 5], "300": [3, 6, 9]}
    for chat, update_ids in chats.items():
        for update_id in update_ids:
            await store.add(
                BOT, update_id, _body(update_id), 0, update_type="message", queue_key=chat
            )
    await store.add(BOT, 10, _body(10), 0, update_type="poll")  # no queue: never held back
    open_rows = {stored_key(store, chat): list(ids) for chat, ids in chats.items()}
    now = 10
    failed_once: set[int] = set()
    for _ in range(20):
        batch = await store.claim_next_owned(
            now=now, lease_until=now + 50, max_attempts=3, limit=10, ordering="chat"
        )
        if not batch and not any(open_rows.values()):
            break
        seen: set[str] = set()
        for claimed in batch:
            key = claimed.queue_key
            if key is None:
                f.equal(claimed.identity.update_id, 10, "the unqueued row")
                await store.settle_owned(claimed.identity, Completed(now))
                continue
            f.expect(key not in seen, f"two rows of queue {key} in one batch")
            seen.add(key)
            head = open_rows[key][0] if open_rows[key] else None
            f.equal(claimed.identity.update_id, head, f"row taken from queue {key}")
            if (
                claimed.identity.update_id in (5, 7)
                and claimed.identity.update_id not in failed_once
            ):
                # A failed head keeps holding its queue until its retry succeeds.
                failed_once.add(claimed.identity.update_id)
                await store.settle_owned(claimed.identity, Failed(now, now + 30, "retry"))
            else:
                await store.settle_owned(claimed.identity, Completed(now))
                open_rows[key].remove(claimed.identity.update_id)
        now += 10
    f.equal({chat: ids for chat, ids in open_rows.items() if ids}, {}, "rows never delivered")

    for update_id in (20, 21):
        await store.add(BOT, update_id, _body(update_id), 0, queue_key="400")
    batches = await asyncio.gather(
        *(
            store.claim_next_owned(now=now, lease_until=now + 50, max_attempts=3, limit=10)
            for _ in range(4)
        )
    )
    taken = sorted(c.identity.update_id for batch in batches for c in batch)
    f.equal(taken, [20], "concurrent callers on one queue")


@_rule("claim_next_owned with chat ordering reaches the queues behind a long blocked one", "fenced")
async def _behind_a_blocked_queue(store: FencedUpdateStore, f: _Findings) -> None:
    # Queue "hot": its head failed and waits for its retry at 10_000, with 60 rows behind it,
    # all due before anything else. Behind those: queues a, b and c, an unqueued row, and a
    # row of the other bot due before all of them.
    await store.add(BOT, 1, _body(1), 0, update_type="message", queue_key="hot")
    head = await store.claim_owned(BOT, 1, now=5, lease_until=50, max_attempts=3)
    if head is None:
        f.expect(False, "claim_owned of the hot queue's head gave None")
        return
    await store.settle_owned(head, Failed(5, 10_000, "retry"))
    for update_id in range(2, 62):
        await store.add(BOT, update_id, _body(update_id), update_id, queue_key="hot")
    for update_id, queue_key in ((100, "a"), (101, "b"), (102, "c"), (104, "a"), (105, "b")):
        await store.add(BOT, update_id, _body(update_id), update_id, queue_key=queue_key)
    await store.add(BOT, 103, _body(103), 103, update_type="poll")
    await store.add(OTHER_BOT, 200, _body(200), 99, queue_key="a")
    held: dict[int, ClaimIdentity] = {}

    async def take(now: int, limit: int, bots: list[str] | None = None) -> list[int]:
        batch = await store.claim_next_owned(
            now=now, lease_until=50_000, max_attempts=3, limit=limit, bots=bots
        )
        held.update((c.identity.update_id, c.identity) for c in batch)
        return sorted(c.identity.update_id for c in batch)

    # Small limits: whatever window of due rows a store walks first, these lie past it.
    f.equal(await take(1_000, 2, [BOT]), [100, 101], "the two oldest due heads behind the queue")
    f.equal(await take(1_000, 2, [BOT]), [102, 103], "the next head and the unqueued row")
    f.equal(await take(1_000, 3, [BOT]), [], "with every other head in flight")
    for update_id in (100, 101):
        if update_id in held:
            await store.settle_owned(held[update_id], Completed(1_000))
    f.equal(await take(1_000, 5, [BOT]), [104, 105], "the heads freed by their settles")
    f.equal(await take(1_000, 5), [200], "the other bot's head, with no bot filter")
    f.equal(await take(10_000, 5), [1], "the hot queue's head once its retry is due")
