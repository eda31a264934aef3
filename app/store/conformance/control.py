"""Rules for operator control (the durable level from revision 0004): pause and resume, the
rate limiter's bucket, redrive and acknowledgement in bulk, park, search, attempt history and
the audit log."""

from __future__ import annotations

import json

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
from app.store.contract import OperatorStore
from app.store.operator_types import ExhaustionFilter, UpdateFilter
from app.store.types import ClaimIdentity, Completed, Failed, HandedBack

OPERATOR = "conformance-key"


async def _exhausted(
    store: OperatorStore,
    update_id: int,
    *,
    bot: str = BOT,
    at: int = 20,
    chat: str | None = None,
    error: str = "HTTP 400",
) -> ClaimIdentity:
    """Record `update_id` and exhaust its first attempt at `at` with `error`."""
    await store.add(bot, update_id, _body(update_id), 0, update_type="message", queue_key=chat)
    identity = await store.claim_owned(bot, update_id, now=10, lease_until=100, max_attempts=MAX)
    if identity is None or not await store.exhaust(identity, at, error):
        raise AssertionError(f"could not exhaust {bot}/{update_id}")
    return identity


@_rule("a paused bot's updates are recorded but not claimed until it resumes", "durable")
async def _pause_holds_claims(store: OperatorStore, f: _Findings) -> None:
    f.equal(await store.pause(BOT, at=5, by=OPERATOR, reason="maintenance"), True, "pause")
    f.equal(await store.pause(BOT, at=6, by="other"), False, "a second pause")
    await _record(store, 1, 2)
    await _record(store, 3, bot=OTHER_BOT)
    controls = await store.bot_controls([BOT, OTHER_BOT])
    f.equal(
        [(c.bot, c.paused_at, c.paused_by, c.paused_reason) for c in controls],
        [(BOT, 5, OPERATOR, "maintenance"), (OTHER_BOT, None, None, None)],
        "the controls",
    )
    taken = await store.claim_next_owned(now=10, lease_until=100, max_attempts=MAX, limit=10)
    f.equal([(c.identity.bot, c.identity.update_id) for c in taken], [(OTHER_BOT, 3)], "claims")
    single = await store.claim_owned(BOT, 1, now=10, lease_until=100, max_attempts=MAX)
    f.equal(single, None, "claim_owned of a paused bot's row")
    f.equal(await store.resume(BOT, at=20, by=OPERATOR), True, "resume")
    f.equal(await store.resume(BOT, at=21, by=OPERATOR), False, "a second resume")
    taken = await store.claim_next_owned(
        now=30, lease_until=100, max_attempts=MAX, limit=10, bots=[BOT], ordering="none"
    )
    f.equal([c.identity.update_id for c in taken], [1, 2], "claims after the resume")


@_rule("the rate limit's bucket starts empty, refills at its rate and holds a second", "durable")
async def _bucket(store: OperatorStore, f: _Findings) -> None:
    f.equal(await store.take_tokens(BOT, 7, now=0), 7, "a bot without a limit")
    await store.set_rate_limit(BOT, 4.0, at=1_000, by=OPERATOR)
    f.equal(await store.take_tokens(BOT, 10, now=1_000), 0, "at once")
    f.equal(await store.take_tokens(BOT, 10, now=1_500), 2, "half a second later")
    f.equal(await store.take_tokens(BOT, 1, now=1_500), 0, "then")
    f.equal(await store.take_tokens(BOT, 10, now=9_000), 4, "after a long idle time")
    await store.return_tokens(BOT, 3)
    f.equal(await store.take_tokens(BOT, 10, now=9_000), 3, "tokens given back")
    f.equal(await store.take_tokens(OTHER_BOT, 5, now=9_000), 5, "another bot")
    controls = await store.bot_controls([BOT])
    f.equal([c.rate_per_second for c in controls], [4.0], "the rate")
    await store.set_rate_limit(BOT, None, at=9_000, by=OPERATOR)
    f.equal(await store.take_tokens(BOT, 10, now=9_000), 10, "after the limit is lifted")


@_rule("redrive takes what its dry run counted and no earlier identity matches again", "durable")
async def _redrive(store: OperatorStore, f: _Findings) -> None:
    first = await _exhausted(store, 1)
    second = await _exhausted(store, 2)
    await _exhausted(store, 3, bot=OTHER_BOT)
    chosen = ExhaustionFilter(bots=(BOT,))
    dry = await store.redrive(chosen, at=50, by=OPERATOR, dry_run=True)
    f.equal((dry.matched, dry.changed), (2, 0), "the dry run")
    f.equal([e.identity for e in dry.sample], [first, second], "the dry run's sample")
    f.equal(len(await store.due_exhaustions(limit=10)), 3, "exhaustions after the dry run")
    done = await store.redrive(chosen, at=50, by=OPERATOR)
    f.equal((done.matched, done.changed), (2, 2), "the real run")
    listed = await store.due_exhaustions(limit=10)
    f.equal([e.identity.bot for e in listed], [OTHER_BOT], "exhaustions after the run")
    again = await store.claim_next_owned(
        now=50, lease_until=150, max_attempts=MAX, limit=10, bots=[BOT], ordering="none"
    )
    f.equal(
        [(c.identity.update_id, c.identity.attempt, c.counted) for c in again],
        [(1, 2, 1), (2, 2, 1)],
        "claims of the redriven rows (attempt numbers go on, the budget is fresh)",
    )
    for old in (first, second):
        f.equal(await store.owns(old, 60), False, f"owns of the old identity {old}")
        f.equal(await store.settle_owned(old, Completed(60)), False, "its settle")
        f.equal(await store.exhaust(old, 60, "late"), False, "its exhaust")
        f.equal(await store.acknowledge_exhaustion(old, 60), False, "its acknowledgement")
    later = await store.redrive(chosen, at=70, by=OPERATOR)
    f.equal(later.matched, 0, "a second redrive")


@_rule("redrive by identities takes exactly those, paced in key order", "durable")
async def _redrive_paced(store: OperatorStore, f: _Findings) -> None:
    exhausted = [await _exhausted(store, update_id) for update_id in (1, 2, 3)]
    chosen = [exhausted[2], exhausted[0], _other(exhausted[1], claim_id="x")]
    done = await store.redrive(chosen, at=1_000, by=OPERATOR, rate_per_second=10.0)
    f.equal(done.matched, 2, "the exact identities redriven")
    due = {
        update_id: (row.state, row.due_at)
        for update_id in (1, 2, 3)
        if (row := await store.get_update(BOT, update_id)) is not None
    }
    f.equal(
        due,
        {1: ("failed", 1_000), 2: ("abandoned", 20), 3: ("failed", 1_100)},
        "the rows (state, due_at)",
    )
    f.equal(
        await store.redrive([], at=1_000, by=OPERATOR),
        await store.redrive([], at=1_000, by=OPERATOR, dry_run=True),
        "an empty list of identities",
    )


@_rule("acknowledge by filter takes what its dry run counted, by every criterion", "durable")
async def _acknowledge_by_filter(store: OperatorStore, f: _Findings) -> None:
    await _exhausted(store, 1, chat="a", error="HTTP 400 bad chat", at=20)
    await _exhausted(store, 2, chat="b", error="HTTP 400 bad chat", at=30)
    await _exhausted(store, 3, chat="a", error="HTTP 403 blocked", at=40)
    await _exhausted(store, 4, bot=OTHER_BOT, chat="a", error="HTTP 400 bad chat", at=20)
    cases = [
        (ExhaustionFilter(bots=(BOT,), chat="a"), {1, 3}),
        (ExhaustionFilter(error_contains="bad chat"), {1, 2, 4}),
        (ExhaustionFilter(error_contains="%"), set()),
        (ExhaustionFilter(exhausted_after=30), {2, 3}),
        (ExhaustionFilter(exhausted_before=30), {1, 4}),
        (ExhaustionFilter(bots=(BOT,), update_type="edited_message"), set()),
        (ExhaustionFilter(bots=(), chat="a"), set()),
    ]
    for chosen, expected in cases:
        dry = await store.acknowledge_exhaustions(chosen, at=50, by=OPERATOR, dry_run=True)
        f.equal(dry.matched, len(expected), f"dry run of {chosen}")
        f.expect(
            {e.identity.update_id for e in dry.sample} <= expected,
            f"the sample of {chosen} is {dry.sample}",
        )
    done = await store.acknowledge_exhaustions(
        ExhaustionFilter(bots=(BOT,), error_contains="HTTP 400"), at=50, by=OPERATOR
    )
    f.equal(done.matched, 2, "the real run")
    left = await store.due_exhaustions(limit=10)
    f.equal(sorted(e.identity.update_id for e in left), [3, 4], "open exhaustions after it")
    f.equal(await store.prune(51), 2, "prune after the acknowledgement")


@_rule("park ends exactly its identity's attempt as an exhaustion and frees its chat", "durable")
async def _park(store: OperatorStore, f: _Findings) -> None:
    await store.add(BOT, 1, _body(1), 0, queue_key="chat")
    await store.add(BOT, 2, _body(2), 0, queue_key="chat")
    if (live := await _claimed(store, f)) is None:
        return
    f.equal(
        await store.park(_other(live, claim_id="x"), at=20, by=OPERATOR, reason="poison"),
        False,
        "park with a wrong claim_id",
    )
    blocked = await store.claim_next_owned(now=20, lease_until=100, max_attempts=MAX, limit=5)
    f.equal(blocked, [], "claims while the chat's head is leased")
    f.equal(await store.park(live, at=20, by=OPERATOR, reason="poison"), True, "park")
    listed = await store.due_exhaustions(limit=10)
    f.equal(
        [(e.identity, e.error, e.exhausted_at) for e in listed],
        [(live, "parked: poison", 20)],
        "the exhaustion",
    )
    f.equal(await store.settle_owned(live, Completed(30)), False, "the parked attempt's settle")
    freed = await store.claim_next_owned(now=30, lease_until=100, max_attempts=MAX, limit=5)
    f.equal([c.identity.update_id for c in freed], [2], "claims after the park")
    if freed:  # a waiting retry parks too
        waiting = freed[0].identity
        await store.settle_owned(waiting, Failed(40, 1_000, "HTTP 502"))
        f.equal(await store.park(waiting, at=50, by=OPERATOR, reason="stuck"), True, "a retry")
    history = await store.attempt_history(BOT, 1)
    f.equal([(a.attempt, a.outcome) for a in history or []], [(1, "parked")], "the parked history")


@_rule("every attempt is recorded with how it ended, as long as its row", "durable")
async def _history(store: OperatorStore, f: _Findings) -> None:
    await _record(store, 1, 2)
    f.equal(await store.attempt_history(BOT, 9), None, "history of an unknown update")
    f.equal(await store.attempt_history(BOT, 1), [], "history of a pending update")
    if (first := await _claimed(store, f, max_attempts=5)) is None:
        return
    await store.settle_owned(first, Failed(20, 30, "HTTP 502 " + "x" * 600, status=502))
    second = await store.claim_owned(BOT, 1, now=40, lease_until=100, max_attempts=5)
    third = await store.claim_owned(BOT, 1, now=101, lease_until=200, max_attempts=5)
    if second is None or third is None:
        f.expect(False, f"claims gave {second!r} then {third!r}")
        return
    running = await store.attempt_history(BOT, 1)
    f.equal(
        [(a.attempt, a.claim_id, a.outcome) for a in running or []],
        [
            (1, first.claim_id, "failed"),
            (2, second.claim_id, "lost"),
            (3, third.claim_id, "running"),
        ],
        "attempts while the third runs",
    )
    if running:
        head = running[0]
        f.equal((head.started_at, head.ended_at, head.duration_ms), (10, 20, 10), "its times")
        f.equal((head.status_code, len(head.error or "")), (502, 500), "its status and error")
    await store.settle_owned(third, HandedBack(150))
    fourth = await store.claim_owned(BOT, 1, now=160, lease_until=300, max_attempts=5)
    if fourth is not None:
        await store.settle_owned(fourth, Completed(170, status=200))
    ended = await store.attempt_history(BOT, 1)
    f.equal(
        [(a.attempt, a.outcome, a.status_code) for a in ended or []][2:],
        [(3, "handed_back", None), (4, "completed", 200)],
        "the ends of a hand-back and a delivery",
    )
    f.equal(await store.prune(10**12), 1, "prune")
    await _record(store, 1)  # the same key again: its history starts afresh
    f.equal(await store.attempt_history(BOT, 1), [], "history of a key recorded again")


@_rule("search finds rows by every filter, newest first, paging without gaps", "durable")
async def _search(store: OperatorStore, f: _Findings) -> None:
    rows = [  # (bot, update_id, received_at, type, chat): ties in received_at across bots
        (BOT, 1, 100, "message", "a"),
        (BOT, 2, 200, "callback_query", "b"),
        (OTHER_BOT, 7, 200, "message", "a"),
        (BOT, 3, 200, "message", "a"),
        (OTHER_BOT, 8, 300, "message", "b"),
        (BOT, 4, 400, "edited_message", "a"),
    ]
    for bot, update_id, received_at, kind, chat in rows:
        body = json.dumps({"update_id": update_id, "text": f"needle-{chat}{update_id}"})
        await store.add(bot, update_id, body, received_at, update_type=kind, queue_key=chat)
    both = (BOT, OTHER_BOT)
    newest = [(BOT, 4), (OTHER_BOT, 8), (OTHER_BOT, 7), (BOT, 3), (BOT, 2), (BOT, 1)]
    cases = [
        (UpdateFilter(bots=both), newest),
        (UpdateFilter(bots=(BOT,), chat="a"), [(BOT, 4), (BOT, 3), (BOT, 1)]),
        (
            UpdateFilter(bots=both, update_type="message"),
            [k for k in newest if k[1] in (8, 7, 3, 1)],
        ),
        (UpdateFilter(bots=both, received_after=200, received_before=400), newest[1:5]),
        (
            UpdateFilter(bots=both, state="pending", contains="needle-a"),
            [(BOT, 4), (OTHER_BOT, 7), (BOT, 3), (BOT, 1)],
        ),
        (UpdateFilter(bots=both, state="completed"), []),
    ]
    for chosen, expected in cases:
        for size in (1, 2, 10):
            found: list[tuple[str, int]] = []
            cursor = None
            for _ in range(20):
                page = await store.search_updates(chosen, after=cursor, limit=size)
                found += [(u.bot, u.update_id) for u in page.items]
                if (cursor := page.next) is None:
                    break
            f.equal(found, expected, f"{chosen} in pages of {size}")


@_rule("every operator action is in the audit log under its key's name, newest first", "durable")
async def _audit(store: OperatorStore, f: _Findings) -> None:
    identity = await _exhausted(store, 1)
    await _record(store, 2)
    waiting = await store.claim_owned(BOT, 2, now=10, lease_until=100, max_attempts=MAX)
    await store.pause(BOT, at=100, by="alice", reason="deploy")
    await store.resume(BOT, at=101, by="bob")
    await store.set_rate_limit(BOT, 5.0, at=102, by="alice")
    await store.redrive(ExhaustionFilter(bots=(BOT,)), at=103, by="carol", dry_run=True)
    await store.redrive([identity], at=104, by="carol")
    await store.acknowledge_exhaustions(ExhaustionFilter(chat="none"), at=105, by="dave")
    if waiting is not None:
        await store.park(waiting, at=106, by="erin", reason="poison")
    entries = await store.audit_log(limit=100)
    f.equal(
        [(e.at, e.key_name, e.action, e.target) for e in entries],
        [
            (106, "erin", "park", f"{BOT}/2"),
            (105, "dave", "acknowledge", "exhaustions"),
            (104, "carol", "redrive", BOT),
            (102, "alice", "rate_limit", BOT),
            (101, "bob", "resume", BOT),
            (100, "alice", "pause", BOT),
        ],
        "the audit log (a dry run is not an action)",
    )
    if len(entries) == 6:
        f.equal((entries[2].matched, entries[2].changed), (1, 1), "the redrive's counts")
        f.equal(json.loads(entries[5].detail or "{}"), {"reason": "deploy"}, "the pause's reason")
        page = await store.audit_log(after=entries[1].id, limit=2)
        f.equal([e.id for e in page], [e.id for e in entries[2:4]], "the page after the second")


@_rule("a redrive of one bot without a rate goes at that bot's rate limit", "durable")
async def _redrive_at_the_bots_rate(store: OperatorStore, f: _Findings) -> None:
    for update_id in (1, 2, 3):
        await _exhausted(store, update_id)
    await _exhausted(store, 4, bot=OTHER_BOT)
    await store.set_rate_limit(BOT, 5.0, at=0, by=OPERATOR)
    done = await store.redrive(ExhaustionFilter(bots=(BOT,)), at=1_000, by=OPERATOR)
    f.equal(done.matched, 3, "the redrive")
    due = [row.due_at for i in (1, 2, 3) if (row := await store.get_update(BOT, i))]
    f.equal(due, [1_000, 1_200, 1_400], "due times at 5 per second")
    other = await store.redrive(ExhaustionFilter(bots=(OTHER_BOT,)), at=1_000, by=OPERATOR)
    row = await store.get_update(OTHER_BOT, 4)
    f.equal((other.matched, row and row.due_at), (1, 1_000), "a bot without a limit")


@_rule("activity counts received and completed rows per bot and slot", "durable")
async def _activity(store: OperatorStore, f: _Findings) -> None:
    for update_id, at in ((1, 1_000), (2, 1_500), (3, 61_000), (4, 200_000)):
        await store.add(BOT, update_id, _body(update_id), at)
    await store.add(OTHER_BOT, 9, _body(9), 59_999)
    first = await store.claim_owned(BOT, 1, now=2_000, lease_until=90_000, max_attempts=MAX)
    if first is None:
        f.expect(False, "claim_owned of a fresh row took nothing")
        return
    await store.settle_owned(first, Completed(65_000))
    slots = await store.activity([BOT, OTHER_BOT], since=0, until=180_000, slot_ms=60_000)
    f.equal(
        [(s.bot, s.start, s.received, s.delivered) for s in slots],
        [
            (BOT, 0, 2, 0),
            (OTHER_BOT, 0, 1, 0),
            (BOT, 60_000, 1, 1),
            (OTHER_BOT, 60_000, 0, 0),
            (BOT, 120_000, 0, 0),
            (OTHER_BOT, 120_000, 0, 0),
        ],
        "slots of a minute over three minutes (a row after `until` left out)",
    )
    f.equal(await store.activity([], since=0, until=1, slot_ms=1), [], "no bots")
