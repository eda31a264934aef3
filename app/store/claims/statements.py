"""Every statement of claiming: a claim by key or by batch (in chat order, `chat_order`), a
renewal, the due rows, and `owns`. Each state change is one conditional statement whose WHERE
is the whole rule, made of `app.store.predicates`; nothing reads a row to decide a write."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Integer,
    Select,
    Table,
    Text,
    Update,
    and_,
    bindparam,
    case,
    false,
    select,
    true,
    tuple_,
    union_all,
    update,
)

from app.store.claims import chat_order
from app.store.control import statements as control
from app.store.predicates import (
    Number,
    claim_values,
    claimable,
    counted,
    for_destination,
    identity_is,
    in_state,
    key_is,
    lease_column,
    live,
    matches,
    of_update,
    transition_returning,
)
from app.store.schema import (
    beside_deliveries,
    bots_table_name,
    destinations_table_name,
    updates_of,
)
from app.store.types import ClaimIdentity, Ordering


def unpaused(t: Table) -> ColumnElement[bool]:
    """No claim starts an attempt of a paused bot (revision 0004's `_bots`; below it no bot
    is ever paused), nor on the deliveries table (revision 0010) of a paused bot or a paused
    destination (`_destinations`). Part of every claim's WHERE, so a pause binds every
    process the moment it commits."""
    if beside_deliveries(t):
        updates = updates_of(t).name
        controls = t.metadata.tables[destinations_table_name(updates)]
        bot_rows = t.metadata.tables[bots_table_name(updates)]
        return ~control.paused(t, bot_rows) & ~control.paused(t, controls)  # the bot's too
    bots = t.metadata.tables.get(bots_table_name(t.name))
    return true() if bots is None else ~control.paused(t, bots)


def claim(
    t: Table,
    *,
    bot: str,
    update_id: int,
    now: int,
    lease_until: int,
    max_attempts: int,
    durable_exhaustion: bool,
) -> Update:
    # Where the table has claim_id (revision 0002), a base claim mints one too: every successful
    # claim gets a fresh claim_id, so no earlier identity matches the new attempt.
    values = claim_values(
        t,
        now=now,
        lease_until=lease_until,
        max_attempts=max_attempts,
        fenced="claim_id" in t.c,
        durable=durable_exhaustion,
    )
    return (
        update(t)
        .where(key_is(t, bot, update_id), claimable(t, now), unpaused(t))
        .values(values)
        .returning(t.c.state, t.c.attempts)
    )


def renew(
    t: Table, *, bot: str, update_id: int, attempt: int, lease_until: int, now: int | None
) -> Update:
    unexpired = lease_column(t) >= now if now is not None else true()
    return _renew(
        t, and_(key_is(t, bot, update_id), t.c.attempts == attempt, unexpired), lease_until
    )


def _renew(t: Table, rule: ColumnElement[bool], lease_until: int) -> Update:
    # Never shortens: a smaller lease_until matches the row and leaves due_at as it is.
    extended = case((t.c.due_at < lease_until, lease_until), else_=t.c.due_at)
    return (
        update(t)
        .where(rule, in_state(t.c.state, "processing"))
        .values(due_at=extended)
        .returning(t.c.due_at)
    )


def due(
    t: Table, *, now: int, pending_before: int, limit: int, bots: Sequence[str] | None = None
) -> Select[Any]:
    # One indexed range per state, materialised, then put in key order: otherwise SQLite walks
    # the primary key in order through every retained row. A pending row's due_at is its
    # received_at.
    branches = [
        and_(in_state(t.c.state, "pending"), t.c.due_at <= pending_before),
        and_(in_state(t.c.state, "processing"), t.c.due_at < now),
        and_(in_state(t.c.state, "failed"), t.c.due_at <= now),
    ]
    if bots is not None:
        branches = [and_(branch, t.c.bot.in_(list(bots))) for branch in branches]
    branches = [and_(branch, unpaused(t)) for branch in branches]
    columns = (t.c.bot, t.c.update_id, t.c.body, t.c.update_type, t.c.received_at)
    rows = (
        union_all(*(select(*columns).where(branch) for branch in branches))
        .cte("due")
        .prefix_with("MATERIALIZED")
    )
    return select(rows).order_by(rows.c.bot, rows.c.update_id).limit(limit)


def claim_owned(
    t: Table,
    *,
    bot: str,
    update_id: int,
    now: int,
    lease_until: int,
    max_attempts: int,
    durable_exhaustion: bool,
) -> Update:
    values = claim_values(
        t,
        now=now,
        lease_until=lease_until,
        max_attempts=max_attempts,
        fenced=True,
        durable=durable_exhaustion,
    )
    return (
        update(t)
        .where(key_is(t, bot, update_id), claimable(t, now), unpaused(t))
        .values(values)
        .returning(*transition_returning(t), t.c.state)
    )


def claim_next_owned(
    t: Table,
    *,
    now: Number,
    lease_until: Number,
    max_attempts: Number,
    limit: Number,
    window: Number = chat_order.WINDOW,
    ordering: Ordering,
    bots: Sequence[str] | None,
    durable_exhaustion: bool,
    lateral: bool,
    destination: str | None = None,
) -> Update:
    """Take up to `limit` due rows in one statement, oldest due first: on the deliveries
    table (revision 0010) those of `destination`, each queue its (bot, destination,
    queue_key). The numbers may be
    bound parameters, for a statement compiled once and run many times; `window` is the chat
    claim's (`app.store.claims.chat_order`). Each row returned says whether the chat claim's head
    walk found it (`walked_heads`).

    Rows another transaction has locked are skipped (SKIP LOCKED on PostgreSQL; SQLite
    serialises writers). With chat ordering a row is eligible only when no older row of its
    (bot, queue_key) is still pending, processing or failed; `app.store.claims.chat_order` finds
    those rows, by LATERAL probes where the database has them (`lateral`: PostgreSQL).
    """
    walked_heads: ColumnElement[bool] = false()
    mine = for_destination(t, destination)
    if ordering == "chat":
        candidates, walked_heads = chat_order.chat_ordered(
            t,
            now=now,
            limit=limit,
            window=window,
            bots=bots,
            lateral=lateral,
            destination=destination,
        )
    else:
        # Walk non-terminal rows in due order (ix_due) and stop at the limit: the cost follows
        # the batch, not the backlog. Ties in due_at go by key, so that one table state gives
        # one claim (left to the index they go in physical order, which vacuum decides).
        walked = select(t.c.bot, t.c.update_id).where(
            chat_order.due_for_claim(t.c.state, t.c.due_at, now), mine
        )
        if bots is not None:
            walked = walked.where(t.c.bot.in_(list(bots)))
        candidates = (
            walked.order_by(t.c.due_at, t.c.bot, t.c.update_id)
            .limit(limit)
            .with_for_update(skip_locked=True, of=t)
        )
    values = claim_values(
        t,
        now=now,
        lease_until=lease_until,
        max_attempts=max_attempts,
        fenced=True,
        durable=durable_exhaustion,
    )
    return (
        update(t)
        .where(tuple_(t.c.bot, t.c.update_id).in_(candidates), mine, unpaused(t))
        .values(values)
        .returning(
            t.c.state,
            t.c.bot,
            t.c.update_id,
            t.c.attempts,
            t.c.claim_id,
            t.c.queue_key,
            t.c.received_at,
            *of_update(t),
            *([t.c.destination] if beside_deliveries(t) else []),
            counted(t).label("counted"),
            walked_heads.label("walked_heads"),  # last: a reader of raw rows finds it there
        )
    )


def renew_owned(t: Table, *, identity: ClaimIdentity, lease_until: int, now: int | None) -> Update:
    unexpired = lease_column(t) >= now if now is not None else true()
    return _renew(t, and_(identity_is(t, identity), unexpired), lease_until)


def owns(t: Table, *, identity: ClaimIdentity | None, at: Number, lock: bool) -> Select[Any]:
    """The lease of the exact live claim; FOR UPDATE holds the row for the caller's transaction.
    With `identity` None the statement takes it as parameters `bot`, `update_id`, `attempt`,
    `claim_id` and `destination`, to be compiled once (the callback API asks this on every
    update)."""
    exact = (
        matches(
            t,
            bindparam("bot", type_=Text),
            bindparam("update_id", type_=BigInteger),
            bindparam("attempt", type_=Integer),
            bindparam("claim_id", type_=Text),
            bindparam("destination", type_=Text),
        )
        if identity is None
        else identity_is(t, identity)
    )
    statement = select(t.c.due_at).where(exact, live(t, at))
    return statement.with_for_update() if lock else statement
