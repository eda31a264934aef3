"""Every statement of the operational events (docs/contract.md section 9, revision 0004): the outbox
`_events` and the watches' state in `_bots`.

An event is written by the transaction that makes what it tells of (a pause, a new
exhaustion, a breaker's change), so it is sent if and only if that commits. Delivery takes due
events under a lease (their `due_at` moved to the lease's end), and a delivery's outcome
writes only while that lease is still the event's: a lapsed lease's late answer changes
nothing, and the event goes again (at least once).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    Delete,
    Insert,
    Select,
    Table,
    Update,
    and_,
    case,
    delete,
    func,
    literal,
    or_,
    select,
    update,
)

from app.store.operator_types import WebhookInfo
from app.store.predicates import NON_TERMINAL, Upsert, in_state, traced


def take(events: Table, *, now: int, lease_until: int, limit: int) -> Update:
    """Lease up to `limit` undelivered events due now, oldest due first, until `lease_until`
    (SKIP LOCKED on PostgreSQL; SQLite serialises writers)."""
    e = events.c
    due = (
        select(e.id)
        .where(e.delivered_at.is_(None), e.due_at <= now)
        .order_by(e.due_at, e.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return (
        update(events)
        .where(e.id.in_(due))
        .values(due_at=lease_until)
        .returning(
            e.id,
            e.type,
            e.data,
            e.created_at,
            e.deliveries,
            e.due_at,
            *traced(events),
        )
    )


def _leased(events: Table, event_id: int, lease_until: int) -> Any:
    e = events.c
    return and_(e.id == event_id, e.delivered_at.is_(None), e.due_at == lease_until)


def delivered(events: Table, *, event_id: int, lease_until: int, at: int) -> Update:
    """Delivered: never sent again. An erasure's event forgets the id it carried once the
    bot's own systems have it: the erased user is named nowhere after (docs/privacy.md)."""
    e = events.c
    forgotten = case((e.type == "erasure.completed", literal("{}")), else_=e.data)
    return (
        update(events)
        .where(_leased(events, event_id, lease_until))
        .values(delivered_at=at, due_at=None, data=forgotten)
        .returning(e.id)
    )


def failed(events: Table, *, event_id: int, lease_until: int, retry_at: int) -> Update:
    e = events.c
    return (
        update(events)
        .where(_leased(events, event_id, lease_until))
        .values(due_at=retry_at, deliveries=e.deliveries + 1)
        .returning(e.id)
    )


def prune(events: Table, *, before: int) -> Delete:
    """Delivered events older than the retention: undelivered ones stay until delivered."""
    e = events.c
    return delete(events).where(e.delivered_at.is_not(None), e.delivered_at < before)


# -- the backlog watch --------------------------------------------------------------------------


def oldest_undelivered(t: Table, bots: Sequence[str]) -> Select[Any]:
    """Per bot, the oldest receipt among its pending, processing and failed rows: a walk of
    the non-terminal rows only (the partial indexes hold nothing else), whatever is retained."""
    return (
        select(t.c.bot, func.min(t.c.received_at).label("oldest"))
        .where(in_state(t.c.state, *NON_TERMINAL), t.c.bot.in_(list(bots)))
        .group_by(t.c.bot)
    )


def became_stale(bots: Table, upsert: Upsert, *, bot: str, at: int) -> Insert:
    """Mark `bot`'s backlog stale since `at` unless it is already: RETURNING the bot only
    when this statement began the episode (one event an episode, across processes)."""
    b = bots.c
    statement: Insert = (
        upsert(bots)
        .values(bot=bot, stale_since=at)
        .on_conflict_do_update(
            index_elements=[b.bot], set_={"stale_since": at}, where=b.stale_since.is_(None)
        )
    )
    return statement.returning(b.bot)


def fresh_again(bots: Table, *, stale: Sequence[str], watched: Sequence[str]) -> Update:
    """End the stale episode of every watched bot that is not stale now."""
    b = bots.c
    ended = and_(b.bot.in_(list(watched)), b.stale_since.is_not(None))
    if stale:
        ended = and_(ended, b.bot.not_in(list(stale)))
    return update(bots).where(ended).values(stale_since=None)


# -- the getWebhookInfo watch -------------------------------------------------------------------


def take_webhook_check(bots: Table, upsert: Upsert, *, bot: str, now: int, next_at: int) -> Insert:
    """Take `bot`'s next getWebhookInfo check if it is due (or was never made), moving it to
    `next_at`: RETURNING the bot only to the one process that took it."""
    b = bots.c
    due = or_(b.webhook_check_due_at.is_(None), b.webhook_check_due_at <= now)
    statement: Insert = (
        upsert(bots)
        .values(bot=bot, webhook_check_due_at=next_at)
        .on_conflict_do_update(
            index_elements=[b.bot], set_={"webhook_check_due_at": next_at}, where=due
        )
    )
    return statement.returning(b.bot)


def webhook_seen(bots: Table, *, bot: str) -> Select[Any]:
    """The last error date a check saw, locked for the transaction that records the next
    (FOR UPDATE on PostgreSQL; SQLite's transaction holds the one write lock already)."""
    b = bots.c
    return select(b.webhook_error_date).where(b.bot == bot).with_for_update()


def webhook_checked(bots: Table, *, bot: str, info: WebhookInfo, at: int) -> Update:
    b = bots.c
    return (
        update(bots)
        .where(b.bot == bot)
        .values(
            webhook_pending=info.pending_update_count,
            webhook_error_date=info.last_error_date,
            webhook_error_message=info.last_error_message,
            webhook_checked_at=at,
        )
    )
