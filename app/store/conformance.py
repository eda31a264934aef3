"""The one conformance check for update stores, shipped so a custom store can be checked too.

    violations = await check_update_store(make_store)

`make_store` is an async callable returning a fresh, empty store; each rule runs on its own
store, which the check closes. Base rules run on every store, fenced rules on fenced and
durable stores, durable rules on durable stores. Each violation reads "<rule>: <what>".
Times are epoch milliseconds; unless a rule says otherwise max_attempts is 2.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

from app.store.contract import DurableUpdateStore, FencedUpdateStore, UpdateStore
from app.store.types import Abandoned, Capability, ClaimIdentity, Completed, Failed, NewUpdate

MakeStore = Callable[[], Awaitable[UpdateStore]]
_LEVELS: dict[Capability, int] = {"base": 0, "fenced": 1, "durable": 2}
BOT = "conformance"
OTHER_BOT = "conformance-b"
MAX = 2


@dataclass
class _Findings:
    rule: str
    found: list[str] = field(default_factory=list)

    def expect(self, holds: bool, what: str) -> None:
        if not holds:
            self.found.append(f"{self.rule}: {what}")

    def equal(self, actual: object, expected: object, what: str) -> None:
        self.expect(actual == expected, f"{what}: expected {expected!r}, got {actual!r}")


Rule = Callable[[Any, _Findings], Awaitable[None]]
_RULES: list[tuple[str, Capability, Rule]] = []


def _rule(name: str, level: Capability) -> Callable[[Rule], Rule]:
    def register(function: Rule) -> Rule:
        _RULES.append((name, level, function))
        return function

    return register


def _body(update_id: int) -> str:
    return f'{{"update_id": {update_id}, "message": {{"text": "u{update_id}"}}}}'


async def _record(store: UpdateStore, *update_ids: int, bot: str = BOT, at: int = 0) -> None:
    for update_id in update_ids:
        await store.add(bot, update_id, _body(update_id), at)


def _other(
    identity: ClaimIdentity, *, attempt: int | None = None, claim_id: str = ""
) -> ClaimIdentity:
    """The same key with another attempt or claim_id: an identity that must never match."""
    return dataclasses.replace(
        identity,
        attempt=identity.attempt if attempt is None else attempt,
        claim_id=claim_id or identity.claim_id,
    )


async def check_update_store(make_store: MakeStore) -> list[str]:
    """Run every rule the store's capability calls for; the violations, empty when it conforms."""
    probe = await make_store()
    try:
        capability = probe.capability
    finally:
        await probe.close()
    if capability not in _LEVELS:
        return [f"capability: {capability!r} is not base, fenced or durable"]
    violations: list[str] = []
    for name, level, rule in _RULES:
        if _LEVELS[level] > _LEVELS[capability]:
            continue
        findings = _Findings(name)
        store = await make_store()
        try:
            await rule(store, findings)
        except Exception as error:  # a rule that crashes names the store's fault, not ours
            findings.found.append(f"{name}: raised {type(error).__name__}: {error}")
        finally:
            await store.close()
        violations += findings.found
    return violations


# -- base ------------------------------------------------------------------------------------


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
        other is not None and (other.update_type, other.queue_key) == ("message", "7"),
        f"a batch row's type and queue: {other!r}",
    )
    f.equal(await store.add_many([]), set(), "an empty batch")


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


async def _claimed(
    store: FencedUpdateStore, f: _Findings, update_id: int = 1, *, max_attempts: int = MAX
) -> ClaimIdentity | None:
    """Claim the recorded `update_id` at 10 with a lease until 100; None (a finding) if refused."""
    identity = await store.claim_owned(
        BOT, update_id, now=10, lease_until=100, max_attempts=max_attempts
    )
    if identity is None:
        f.expect(False, f"claim_owned of pending row {update_id} gave None")
    return identity


async def _two_claims(
    store: FencedUpdateStore, f: _Findings
) -> tuple[ClaimIdentity, ClaimIdentity] | None:
    """Record update 1 and claim it twice around a lapse: leases until 100, then until 200."""
    await _record(store, 1)
    first = await store.claim_owned(BOT, 1, now=10, lease_until=100, max_attempts=3)
    second = await store.claim_owned(BOT, 1, now=101, lease_until=200, max_attempts=3)
    if first is None or second is None:
        f.expect(False, f"claims around a lapse gave {first!r} and {second!r}")
        return None
    return first, second


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
    open_rows = {chat: list(ids) for chat, ids in chats.items()}
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


# -- durable ---------------------------------------------------------------------------------


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
