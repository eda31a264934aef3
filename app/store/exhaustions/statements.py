"""Every statement of exhaustions: end an attempt as a durable exhaustion, take and deliver
the open ones, acknowledge one by its exact identity, and the bulk actions over a filter or a
list of identities (redrive, acknowledge), batch by batch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Select,
    Table,
    Update,
    and_,
    cast,
    false,
    func,
    literal,
    or_,
    select,
    tuple_,
    update,
)

from app.store.operator_types import ExhaustionFilter
from app.store.predicates import (
    for_destination,
    identity_is,
    key_is,
    of_update,
    owned_by,
    transition_returning,
    unacknowledged,
    update_column,
)
from app.store.schema_beside import beside_deliveries
from app.store.types import ClaimIdentity


def exhaust(t: Table, *, identity: ClaimIdentity, at: int, error: str) -> Update:
    # Due for delivery to exhaustion_url at once.
    return (
        update(t)
        .where(owned_by(t, identity, at))
        .values(
            state="abandoned",
            exhausted_at=at,
            due_at=at,
            settled_at=None,
            error=error,
            delivery_due_at=at,
        )
        .returning(*transition_returning(t))
    )


def take_exhaustions(
    t: Table,
    *,
    now: int,
    lease_until: int,
    limit: int,
    bots: Sequence[str],
    destination: str | None = None,
) -> Update:
    """Lease up to `limit` open exhaustions due for delivery (oldest due first) until
    `lease_until`: no other process takes them meanwhile (SKIP LOCKED on PostgreSQL; SQLite
    serialises writers). Only these rows' bodies are read. On the deliveries table
    (revision 0010), `destination`'s."""
    mine = for_destination(t, destination)
    due = (
        select(t.c.bot, t.c.update_id)
        .where(unacknowledged(t), t.c.delivery_due_at <= now, t.c.bot.in_(list(bots)), mine)
        .order_by(t.c.delivery_due_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return (
        update(t)
        .where(tuple_(t.c.bot, t.c.update_id).in_(due), mine, unacknowledged(t))
        .values(delivery_due_at=lease_until)
        .returning(*_exhaustion_columns(t))
    )


def delivery_failed(t: Table, *, identity: ClaimIdentity, retry_at: int, deliveries: int) -> Update:
    """A delivery of this exact open exhaustion failed: due again at `retry_at`. `deliveries`
    is the count the failed delivery was taken with; a row whose count moved meanwhile (a
    lapsed lease, another process's delivery) is left as the later delivery made it."""
    return (
        update(t)
        .where(identity_is(t, identity), unacknowledged(t), t.c.deliveries == deliveries)
        .values(delivery_due_at=retry_at, deliveries=t.c.deliveries + 1)
        .returning(t.c.deliveries)
    )


def _exhaustion_columns(t: Table) -> tuple[ColumnElement[Any], ...]:
    """An exhaustion as read: its identity (with its destination on the deliveries table),
    the update's body and trace, its error, time and failed deliveries so far."""
    body, _, *trace = of_update(t)
    beside = [t.c.destination] if "destination" in t.c else []
    return (
        t.c.bot,
        t.c.update_id,
        t.c.attempts,
        t.c.claim_id,
        *beside,
        body,
        t.c.error,
        t.c.exhausted_at,
        t.c.deliveries,
        *trace,
    )


def due_exhaustions(
    t: Table,
    *,
    limit: int,
    after: tuple[str, int] | None,
    bots: Sequence[str] | None,
    destination: str | None = None,
) -> Select[Any]:
    """A page of open exhaustions in key order (on the deliveries table, `destination`'s)."""
    mine = for_destination(t, destination)
    statement = select(*_exhaustion_columns(t)).where(unacknowledged(t), mine)
    if after is not None:
        statement = statement.where(tuple_(t.c.bot, t.c.update_id) > tuple_(*after))
    if bots is not None:
        statement = statement.where(t.c.bot.in_(list(bots)))
    return statement.order_by(t.c.bot, t.c.update_id).limit(limit)


def acknowledge_exhaustion(t: Table, *, identity: ClaimIdentity, at: int) -> Update:
    # The acknowledgement time becomes settled_at: from now on prune may take the row.
    return (
        update(t)
        .where(identity_is(t, identity), unacknowledged(t))
        .values(acknowledged_at=at, settled_at=at, due_at=at)
        .returning(t.c.state)
    )


def exhaustions_matching(t: Table, chosen: ExhaustionFilter) -> ColumnElement[bool]:
    """The open exhaustions a filter selects (every criterion given must hold)."""
    beside = beside_deliveries(t)
    rules = [unacknowledged(t), for_destination(t, chosen.destination if beside else None)]
    if chosen.bots is not None:
        rules.append(t.c.bot.in_(list(chosen.bots)) if chosen.bots else false())
    if chosen.update_type is not None:
        rules.append(update_column(t, "update_type") == chosen.update_type)
    if chosen.chat is not None:
        rules.append(t.c.queue_key == chosen.chat)
    if chosen.error_contains is not None:
        rules.append(t.c.error.contains(chosen.error_contains, autoescape=True))
    if chosen.exhausted_after is not None:
        rules.append(t.c.exhausted_at >= chosen.exhausted_after)
    if chosen.exhausted_before is not None:
        rules.append(t.c.exhausted_at < chosen.exhausted_before)
    return and_(*rules)


def errors_of_exhaustions(
    t: Table, rule: ColumnElement[bool], *, after: tuple[str, int] | None, limit: int
) -> Select[Any]:
    """The keys and errors of the next `limit` exhaustions the rule selects after the cursor,
    in key order: where errors are sealed, the store searches them page by page itself."""
    statement = select(t.c.bot, t.c.update_id, t.c.error).where(rule)
    if after is not None:
        statement = statement.where(tuple_(t.c.bot, t.c.update_id) > tuple_(*after))
    return statement.order_by(t.c.bot, t.c.update_id).limit(limit)


def keys_in(t: Table, keys: Sequence[tuple[str, int]]) -> ColumnElement[bool]:
    """The rows of these keys (bot, update_id)."""
    if not keys:
        return false()
    return tuple_(t.c.bot, t.c.update_id).in_(list(keys))


def exhaustions_exactly(t: Table, identities: Sequence[ClaimIdentity]) -> ColumnElement[bool]:
    """The open exhaustions that hold exactly one of these identities."""
    if not identities:
        return false()
    return and_(unacknowledged(t), or_(*(identity_is(t, identity) for identity in identities)))


def count_exhaustions(t: Table, rule: ColumnElement[bool]) -> Select[Any]:
    return select(func.count()).select_from(t).where(rule)


def sample_exhaustions(t: Table, rule: ColumnElement[bool], *, limit: int) -> Select[Any]:
    beside = [t.c.destination] if beside_deliveries(t) else []
    body = update_column(t, "body").label("body")
    return (
        select(t.c.bot, t.c.update_id, t.c.attempts, t.c.claim_id, *beside, body, t.c.error)
        .add_columns(t.c.exhausted_at, t.c.deliveries)
        .where(rule)
        .order_by(t.c.bot, t.c.update_id)
        .limit(limit)
    )


def _batch(t: Table, rule: ColumnElement[bool], after: tuple[str, int] | None, limit: int) -> Any:
    """The next `limit` keys the rule selects after the cursor, in key order, numbered (one
    destination's, on the deliveries table: the rule names it)."""
    statement = select(
        t.c.bot,
        t.c.update_id,
        *([t.c.destination] if beside_deliveries(t) else []),
        func.row_number().over(order_by=(t.c.bot, t.c.update_id)).label("position"),
    ).where(rule)
    if after is not None:
        statement = statement.where(tuple_(t.c.bot, t.c.update_id) > tuple_(*after))
    return statement.order_by(t.c.bot, t.c.update_id).limit(limit).subquery("batch")


def _batched(t: Table, batch: Any) -> ColumnElement[bool]:
    """`t`'s rows of a batch's keys (with their destination on the deliveries table)."""
    if beside_deliveries(t):
        return key_is(t, batch.c.bot, batch.c.update_id, batch.c.destination)
    return and_(t.c.bot == batch.c.bot, t.c.update_id == batch.c.update_id)


def redrive(
    t: Table,
    rule: ColumnElement[bool],
    *,
    after: tuple[str, int] | None,
    limit: int,
    start: int,
    interval_ms: float,
) -> Update:
    """Redrive the next batch: each open exhaustion becomes a retry due at `start` plus its
    place in the redrive times `interval_ms` (the pacing), with a fresh budget (`uncounted`
    takes every attempt so far) and its attempt numbers continuing, so no earlier identity
    matches again. It stops being an exhaustion (its record is its history and the audit
    log); its error stays until the next attempt's. RETURNING the keys, for the cursor."""
    batch = _batch(t, rule, after, limit)
    offset = cast(func.floor((batch.c.position - 1) * literal(interval_ms)), BigInteger)
    return (
        update(t)
        .where(_batched(t, batch), unacknowledged(t))
        .values(
            state="failed",
            due_at=start + offset,
            settled_at=None,
            exhausted_at=None,
            acknowledged_at=None,
            delivery_due_at=None,
            deliveries=0,
            uncounted=t.c.attempts,
        )
        .returning(t.c.bot, t.c.update_id)
    )


def acknowledge_exhaustions(
    t: Table, rule: ColumnElement[bool], *, after: tuple[str, int] | None, limit: int, at: int
) -> Update:
    """Acknowledge the next batch (as `acknowledge_exhaustion` does one): prunable from
    now on, settled at `at`."""
    batch = _batch(t, rule, after, limit)
    return (
        update(t)
        .where(_batched(t, batch), unacknowledged(t))
        .values(acknowledged_at=at, settled_at=at, due_at=at)
        .returning(t.c.bot, t.c.update_id)
    )
