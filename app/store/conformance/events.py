"""Rules for operational events (the durable level from revision 0004): each action writes its
event with itself, the outbox is delivered under a lease, and the backlog and webhook watches
write one event an episode. They need a store that records events (`records_events`: opened
with `events=True`)."""

from __future__ import annotations

import json
from typing import Any

from app.store.conformance._core import BOT, MAX, OTHER_BOT, _body, _Findings, _record, _rule
from app.store.conformance.control import OPERATOR, _exhausted
from app.store.contract import OperatorStore
from app.store.operator_types import ExhaustionFilter, OperationalEvent, WebhookInfo
from app.store.types import NewUpdate

FAR = 10**12  # a time after every event of a rule, and a lease that outlives the rule


async def _taken(store: OperatorStore, f: _Findings) -> list[OperationalEvent] | None:
    """Every event due by FAR, leased for the rest of the rule; None (a finding) when the
    store does not record events."""
    if not store.records_events:
        f.expect(False, "the store does not record events: open it with events=True")
        return None
    return await store.take_events(now=FAR, lease_until=FAR + 1, limit=100)


def _events(taken: list[OperationalEvent]) -> list[tuple[str, dict[str, Any]]]:
    """(type, data) of each event, from the body as it is delivered."""
    found = []
    for event in taken:
        body = json.loads(event.payload)
        found.append((body["type"], body["data"]))
    return found


async def _spend(store: OperatorStore, bot: str, times: tuple[int, int, int]) -> None:
    """Claims of `bot` at each of `times`, each lease 100 ms: with MAX attempts of 2, the
    first two attempts' leases lapse and the third claim finds them spent (an exhaustion)."""
    for now in times:
        await store.claim_next_owned(
            now=now,
            lease_until=now + 100,
            max_attempts=MAX,
            limit=10,
            bots=[bot],
            durable_exhaustion=True,
        )


def _trace(n: int) -> str:
    """A W3C traceparent of its own for update n."""
    return f"00-{n:032x}-{n:016x}-01"


@_rule("an exhaustion and its event carry the trace its update was recorded under", "durable")
async def _exhaustions_keep_their_trace(store: OperatorStore, f: _Findings) -> None:
    # By exhaust, by park, and by a claim that finds the attempts spent; update 4 has no trace.
    await store.add_many(
        [NewUpdate(BOT, n, _body(n), 0, trace_context=_trace(n)) for n in (1, 2, 3)]
        + [NewUpdate(BOT, 4, _body(4), 0)]
    )
    for n in (1, 2, 4):
        identity = await store.claim_owned(BOT, n, now=10, lease_until=100, max_attempts=MAX)
        if identity is None:
            f.expect(False, f"claim_owned of update {n} took nothing")
            return
        if n == 2:
            await store.park(identity, at=20, by=OPERATOR, reason="poison")
        else:
            await store.exhaust(identity, 20, "HTTP 400")
    await _spend(store, BOT, (10, 200, 400))
    await store.pause(BOT, at=500, by=OPERATOR)  # an event about no one update
    taken = await _taken(store, f)
    if taken is None:
        return
    traces = {}
    for event, (kind, data) in zip(taken, _events(taken), strict=True):
        traces[data.get("update_id", kind)] = event.trace_context
    f.equal(
        traces,
        {1: _trace(1), 2: _trace(2), 3: _trace(3), 4: None, "bot.paused": None},
        "the trace of each event: its update's, and none for the others",
    )
    open_ = await store.take_exhaustions(now=FAR, lease_until=FAR + 1, limit=10, bots=[BOT])
    f.equal(
        {e.identity.update_id: e.trace_context for e in open_},
        {1: _trace(1), 2: _trace(2), 3: _trace(3), 4: None},
        "the trace of each exhaustion taken for delivery",
    )


@_rule("each action writes its operational event, and only a change writes one", "durable")
async def _actions_write_events(store: OperatorStore, f: _Findings) -> None:
    await store.pause(BOT, at=1, by=OPERATOR, reason="deploy")
    await store.pause(BOT, at=2, by=OPERATOR)  # paused already: no event
    await store.resume(BOT, at=3, by=OPERATOR)
    await store.resume(BOT, at=4, by=OPERATOR)  # not paused: no event
    for state in ("open", "half_open", "open", "closed", "closed"):
        await store.report_breaker(BOT, state, at=5)
    failed = await _exhausted(store, 1, at=20, error="HTTP 400")
    await store.redrive(ExhaustionFilter(bots=(BOT,)), at=30, by=OPERATOR, dry_run=True)
    await store.redrive([failed], at=30, by=OPERATOR)
    await _record(store, 2, bot=OTHER_BOT)
    live = await store.claim_owned(OTHER_BOT, 2, now=40, lease_until=100, max_attempts=MAX)
    if live is None:
        f.expect(False, "claim_owned of a fresh row took nothing")
        return
    await store.park(live, at=50, by=OPERATOR, reason="poison")
    await _record(store, 3, bot=OTHER_BOT)
    await _spend(store, OTHER_BOT, (60, 200, 400))
    spent = await store.get_update(OTHER_BOT, 3)
    taken = await _taken(store, f)
    if taken is None:
        return
    found = _events(taken)
    f.equal(
        [kind for kind, _ in found],
        [
            "bot.paused",
            "bot.resumed",
            "breaker.opened",
            "breaker.closed",
            "exhaustion.created",
            "redrive.finished",
            "exhaustion.created",
            "exhaustion.created",
        ],
        "the events, in the order their transactions committed",
    )
    if len(found) != 8:
        return
    f.equal(found[0][1], {"bot": BOT, "by": OPERATOR, "reason": "deploy", "paused_at": 1}, "pause")
    f.equal(found[2][1], {"bot": BOT, "at": 5}, "breaker.opened")
    keys = ("bot", "update_id", "attempt", "claim_id", "error", "exhausted_at", "reason")
    made = [tuple(data.get(key) for key in keys) for _, data in (found[4], found[6], found[7])]
    f.equal(
        made,
        [
            (BOT, 1, failed.attempt, failed.claim_id, "HTTP 400", 20, "failed"),
            (OTHER_BOT, 2, live.attempt, live.claim_id, "parked: poison", 50, "parked"),
            (OTHER_BOT, 3, MAX, spent and spent.claim_id, "attempts spent", 400, "spent"),
        ],
        "exhaustion.created: by exhaust, by park, and by a claim that found the attempts spent",
    )
    redriven = found[5][1]
    f.equal((redriven["redriven"], redriven["identities"]), (1, 1), "redrive.finished")


@_rule("events are delivered under a lease: once, again after a failure, never after", "durable")
async def _outbox_lease(store: OperatorStore, f: _Findings) -> None:
    if not store.records_events:
        f.expect(False, "the store does not record events: open it with events=True")
        return
    await store.pause(BOT, at=1_000, by=OPERATOR)
    await store.pause(OTHER_BOT, at=1_000, by=OPERATOR)
    early = await store.take_events(now=999, lease_until=10_000, limit=10)
    f.equal(early, [], "events taken before they are due")
    first = await store.take_events(now=1_000, lease_until=10_000, limit=1)
    second = await store.take_events(now=1_000, lease_until=10_000, limit=10)
    f.equal((len(first), len(second)), (1, 1), "two takes share two events")
    f.equal(await store.take_events(now=1_500, lease_until=3_000, limit=10), [], "while leased")
    if len(first) != 1 or len(second) != 1:
        return
    one, other = first[0], second[0]
    f.equal(await store.event_failed(one, 5_000), True, "a failed delivery")
    f.equal(await store.take_events(now=4_999, lease_until=9_000, limit=10), [], "in backoff")
    again = await store.take_events(now=5_000, lease_until=9_000, limit=10)
    f.equal(
        [(e.id, e.deliveries, e.payload) for e in again],
        [(one.id, 1, one.payload)],
        "after the backoff: the same body, one failure counted",
    )
    f.equal(await store.event_delivered(one, 5_100), False, "a delivery under a taken-over lease")
    if again:
        f.equal(await store.event_delivered(again[0], 5_100), True, "a delivery")
    retaken = await store.take_events(now=10_000, lease_until=12_000, limit=10)
    f.equal([e.id for e in retaken], [other.id], "after its lease lapsed: only the undelivered")
    f.equal(await store.event_delivered(other, 10_100), False, "a delivery after its lease")
    f.equal(await store.event_failed(other, 10_100), False, "a failure after its lease")
    if retaken:
        f.equal(await store.event_delivered(retaken[0], 10_100), True, "the retaken delivery")
    await store.resume(BOT, at=20_000, by=OPERATOR)
    await store.prune(FAR)
    kept = await store.take_events(now=FAR, lease_until=FAR + 1, limit=10)
    f.equal([e.type for e in kept], ["bot.resumed"], "prune keeps what is undelivered")


@_rule("backlog.stale is written once an episode, and again after the backlog is fresh", "durable")
async def _backlog_watch(store: OperatorStore, f: _Findings) -> None:
    await _record(store, 1, at=1_000)
    await _record(store, 2, bot=OTHER_BOT, at=5_000)
    watched = [BOT, OTHER_BOT]
    f.equal(await store.watch_backlog(watched, now=1_400, stale_after_ms=500), [], "fresh")
    f.equal(await store.watch_backlog(watched, now=1_600, stale_after_ms=500), [BOT], "stale")
    f.equal(await store.watch_backlog(watched, now=1_700, stale_after_ms=500), [], "still")
    claimed = await store.claim_owned(BOT, 1, now=1_800, lease_until=2_000, max_attempts=MAX)
    f.equal(await store.watch_backlog(watched, now=1_900, stale_after_ms=500), [], "in flight")
    if claimed is not None:
        await store.exhaust(claimed, 1_950, "HTTP 400")
    f.equal(await store.watch_backlog(watched, now=2_000, stale_after_ms=500), [], "delivered")
    await _record(store, 3, at=2_100)
    f.equal(
        await store.watch_backlog(watched, now=2_700, stale_after_ms=500), [BOT], "a new episode"
    )
    taken = await _taken(store, f)
    if taken is None:
        return
    stale = [data for kind, data in _events(taken) if kind == "backlog.stale"]
    f.equal(
        stale,
        [
            {"bot": BOT, "oldest_received_at": 1_000, "age_ms": 600, "stale_after_ms": 500},
            {"bot": BOT, "oldest_received_at": 2_100, "age_ms": 600, "stale_after_ms": 500},
        ],
        "the backlog.stale events",
    )


@_rule("one caller takes a due webhook check; a newer error writes webhook_error", "durable")
async def _webhook_watch(store: OperatorStore, f: _Findings) -> None:
    f.equal(await store.take_webhook_check(BOT, now=0, next_at=100), True, "the first check")
    f.equal(await store.take_webhook_check(BOT, now=50, next_at=150), False, "before it is due")
    f.equal(await store.take_webhook_check(BOT, now=100, next_at=200), True, "when due")
    f.equal(await store.take_webhook_check(BOT, now=100, next_at=200), False, "a second caller")
    fine = WebhookInfo(url="https://example.org/telegram/bot", pending_update_count=3)
    failing = WebhookInfo("https://example.org/telegram/bot", 40, 1_700_000_000, "HTTP 502")
    later = WebhookInfo("https://example.org/telegram/bot", 41, 1_700_000_060, "HTTP 503")
    f.equal(await store.report_webhook_info(BOT, fine, at=100), False, "no error")
    f.equal(await store.report_webhook_info(BOT, failing, at=200), True, "an error")
    f.equal(await store.report_webhook_info(BOT, failing, at=300), False, "the same error")
    f.equal(await store.report_webhook_info(BOT, later, at=400), True, "a newer error")
    controls = await store.bot_controls([BOT])
    f.equal(
        [
            (c.webhook_pending, c.webhook_error_date, c.webhook_error_message, c.webhook_checked_at)
            for c in controls
        ],
        [(41, 1_700_000_060, "HTTP 503", 400)],
        "what the last check saw",
    )
    taken = await _taken(store, f)
    if taken is None:
        return
    errors = [data for kind, data in _events(taken) if kind == "telegram.webhook_error"]
    f.equal(
        [
            (e["last_error_date"], e["last_error_message"], e["pending_update_count"])
            for e in errors
        ],
        [(1_700_000_000, "HTTP 502", 40), (1_700_000_060, "HTTP 503", 41)],
        "the telegram.webhook_error events",
    )
