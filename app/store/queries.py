"""Every statement the store runs, one builder per store method, named after the method.

Each state transition is one conditional statement: its WHERE clause is the whole rule (made
of `app.store.predicates`), and nothing reads a row to decide how to write it. Builders take
the table and the checked arguments and return a SQLAlchemy Core statement; the store only
executes them. The few statements that exist on one database only (PostgreSQL's batches over
parameter arrays, its clock and NOTIFY; SQLite's insert and its same-transaction `owns`) are
in that backend's module, `app.store.postgres` or `app.store.sqlite`, built from the same
predicates.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    ColumnElement,
    Insert,
    Integer,
    Select,
    Table,
    Text,
    Update,
    and_,
    bindparam,
    case,
    delete,
    exists,
    false,
    func,
    literal,
    literal_column,
    select,
    true,
    tuple_,
    union_all,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.dml import ReturningDelete
from sqlalchemy.sql.expression import FromClause

from app.store import chat_order, control, history
from app.store.predicates import (
    NON_TERMINAL,
    Number,
    claim_values,
    claimable,
    counted,
    holds_lease,
    identity_is,
    in_state,
    key_is,
    lease_column,
    live,
    matches,
    owned_by,
    qualified,
    settle_values,
    settled_columns,
    transition_returning,
    unacknowledged,
)
from app.store.schema import QUEUE_RULE, bots_table_name
from app.store.types import ClaimIdentity, HandedBack, Ordering, Settlement

# -- base (revision 0001 columns only) ---------------------------------------------------------


def unpaused(t: Table) -> ColumnElement[bool]:
    """No claim starts an attempt of a paused bot (revision 0004's `_bots`; below it no bot
    is ever paused). Part of every claim's WHERE, so a pause binds every process the moment
    it commits."""
    bots = t.metadata.tables.get(bots_table_name(t.name))
    return true() if bots is None else ~control.paused(t, bots)


KEY_COLUMNS = {"bot": Text, "update_id": BigInteger}
ADD_COLUMNS = {
    **KEY_COLUMNS,  # first: a batch's derived table of the keys alone reads the same rows
    "body": Text,
    "update_type": Text,
    "queue_key": Text,
    "received_at": BigInteger,
}


def add_many(t: Table, batch: FromClause, dialect: str) -> Insert:
    """`add_many`'s INSERT of a batch of rows (`batch`, a derived table of ADD_COLUMNS: each
    backend's own) as pending: existing keys are skipped (duplicates within the batch too, the
    first one kept). Which keys were new, each backend tells its own way: PostgreSQL by
    RETURNING, SQLite by the count it inserted (and `sqlite.inserted` when some were not new)."""
    columns = ADD_COLUMNS
    # A pending row's due_at is its received_at: `due` and the due-order index rely on it.
    values = [
        *(batch.c[name] for name in columns),
        literal_column("'pending'"),
        literal_column("0"),
        batch.c.received_at,
    ]
    names = [*columns, "state", "attempts", "due_at"]
    if "queue_rule" in t.c:  # revision 0006: the keys are Telegram's queues (app.queues)
        values.append(literal_column(str(QUEUE_RULE)))
        names.append("queue_rule")
    # SQLite reads ON CONFLICT after a SELECT with no WHERE as a join's ON.
    source = select(*values).where(true())
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = insert(t).from_select(names, source)
    return statement.on_conflict_do_nothing(index_elements=[t.c.bot, t.c.update_id])


def recorded(t: Table, batch: FromClause) -> Select[Any]:
    """The keys of a batch (`batch`, a derived table of KEY_COLUMNS) already recorded: one
    primary-key lookup per row of the batch."""
    on = and_(t.c.bot == batch.c.bot, t.c.update_id == batch.c.update_id)
    return select(t.c.bot, t.c.update_id).select_from(batch.join(t, on))


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


def settle(t: Table, *, bot: str, update_id: int, attempt: int, settlement: Settlement) -> Update:
    return (
        update(t)
        .where(holds_lease(t, bot, update_id, attempt, settlement.at))
        .values(settle_values(t, settlement))
        .returning(t.c.state)
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


def prune(t: Table, *, before: int, limit: int) -> ReturningDelete[Any]:
    """Delete up to `limit` prunable rows: a bounded batch, so that no prune holds a lock (on
    SQLite: the one write lock) for longer than one batch takes."""
    # The rule is settled_at < before; due_at == settled_at on terminal rows lets the
    # (state, due_at) index bound the scan. Exhaustions keep settled_at NULL until acknowledged.
    prunable = (
        select(t.c.bot, t.c.update_id)
        .where(
            in_state(t.c.state, "completed", "abandoned"),
            t.c.due_at < before,
            t.c.settled_at < before,
        )
        .limit(limit)
    )
    return (
        delete(t)
        .where(tuple_(t.c.bot, t.c.update_id).in_(prunable))
        .returning(t.c.bot, t.c.update_id)
    )


def get_update(t: Table, *, bot: str, update_id: int) -> Select[Any]:
    return select(t).where(key_is(t, bot, update_id))


def stats(t: Table) -> Select[Any]:
    """Per bot and state: rows, the oldest receipt, and (revision 0002) open exhaustions."""
    columns: list[Any] = [
        t.c.bot,
        t.c.state,
        func.count().label("rows"),
        func.min(t.c.received_at).label("oldest"),
    ]
    if "exhausted_at" in t.c:
        open_exhaustion = case((unacknowledged(t), 1), else_=0)
        columns.append(func.sum(open_exhaustion).label("unacknowledged"))
    return select(*columns).group_by(t.c.bot, t.c.state).order_by(t.c.bot, t.c.state)


# -- fenced (revision 0002) --------------------------------------------------------------------


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
) -> Update:
    """Take up to `limit` due rows in one statement, oldest due first. The numbers may be
    bound parameters, for a statement compiled once and run many times; `window` is the chat
    claim's (`app.store.chat_order`). Each row returned says whether the chat claim's head
    walk found it (`walked_heads`).

    Rows another transaction has locked are skipped (SKIP LOCKED on PostgreSQL; SQLite
    serialises writers). With chat ordering a row is eligible only when no older row of its
    (bot, queue_key) is still pending, processing or failed; `app.store.chat_order` finds
    those rows, by LATERAL probes where the database has them (`lateral`: PostgreSQL).
    """
    walked_heads: ColumnElement[bool] = false()
    if ordering == "chat":
        candidates, walked_heads = chat_order.chat_ordered(
            t, now=now, limit=limit, window=window, bots=bots, lateral=lateral
        )
    else:
        # Walk non-terminal rows in due order (ix_due) and stop at the limit: the cost follows
        # the batch, not the backlog. Ties in due_at go by key, so that one table state gives
        # one claim (left to the index they go in physical order, which vacuum decides).
        walked = select(t.c.bot, t.c.update_id).where(
            chat_order.due_for_claim(t.c.state, t.c.due_at, now)
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
        .where(tuple_(t.c.bot, t.c.update_id).in_(candidates), unpaused(t))
        .values(values)
        .returning(
            t.c.state,
            t.c.bot,
            t.c.update_id,
            t.c.attempts,
            t.c.claim_id,
            t.c.body,
            t.c.update_type,
            t.c.queue_key,
            t.c.received_at,
            counted(t).label("counted"),
            walked_heads.label("walked_heads"),
        )
    )


def renew_owned(t: Table, *, identity: ClaimIdentity, lease_until: int, now: int | None) -> Update:
    unexpired = lease_column(t) >= now if now is not None else true()
    return _renew(t, and_(identity_is(t, identity), unexpired), lease_until)


def owns(t: Table, *, identity: ClaimIdentity | None, at: Number, lock: bool) -> Select[Any]:
    """The lease of the exact live claim; FOR UPDATE holds the row for the caller's transaction.
    With `identity` None the statement takes it as parameters `bot`, `update_id`, `attempt`
    and `claim_id`, to be compiled once (the callback API asks this on every update)."""
    exact = (
        matches(
            t,
            bindparam("bot", type_=Text),
            bindparam("update_id", type_=BigInteger),
            bindparam("attempt", type_=Integer),
            bindparam("claim_id", type_=Text),
        )
        if identity is None
        else identity_is(t, identity)
    )
    statement = select(t.c.due_at).where(exact, live(t, at))
    return statement.with_for_update() if lock else statement


def settle_owned(t: Table, *, identity: ClaimIdentity, settlement: Settlement) -> Update:
    return (
        update(t)
        .where(owned_by(t, identity, settlement.at))
        .values(settle_values(t, settlement))
        .returning(t.c.state)
    )


# The columns of a batch of settlements (`settle_many_owned`), as each backend passes them: one
# derived table `batch` of these (PostgreSQL: unnest() of parallel arrays; SQLite: json_each()
# of one JSON array). `outcome` and `status` are for the attempt's history.
SETTLE_COLUMNS = {
    "bot": Text,
    "update_id": BigInteger,
    "attempt": Integer,
    "claim_id": Text,
    "at": BigInteger,
    "state": Text,
    "due_at": BigInteger,
    "settled_at": BigInteger,
    "error": Text,
    "handed_back": Boolean,
    "outcome": Text,
    "status": Integer,
}


def settle_rows(items: Sequence[tuple[ClaimIdentity, Settlement]]) -> list[dict[str, Any]]:
    """The rows of a batch of settlements, one dictionary of SETTLE_COLUMNS each."""
    return [
        {
            "bot": identity.bot,
            "update_id": identity.update_id,
            "attempt": identity.attempt,
            "claim_id": identity.claim_id,
            "at": settlement.at,
            **settled_columns(settlement),
            "handed_back": isinstance(settlement, HandedBack),
            "outcome": history.outcome_of(settlement),
            "status": getattr(settlement, "status", None),
        }
        for identity, settlement in items
    ]


def settle_many_owned(t: Table, batch: FromClause, *only: ColumnElement[bool]) -> Update:
    """A whole batch of settlements in one statement, each row matched on its full identity and
    live lease (the rule of `settle_owned`), for the rows `only` admits too. RETURNING names
    the keys that were settled and, as `waiting`, whether a later update of the same chat is
    still to deliver: a worker then looks for it at once, and otherwise need not look at all."""
    newer = t.alias("newer")
    waiting = exists().where(
        newer.c.bot == t.c.bot,
        newer.c.queue_key == t.c.queue_key,
        newer.c.update_id > t.c.update_id,
        in_state(newer.c.state, *NON_TERMINAL),
    )
    exact = matches(t, batch.c.bot, batch.c.update_id, batch.c.attempt, batch.c.claim_id)
    return (
        update(t)
        .where(exact, live(t, batch.c.at), *only)
        .values(
            state=batch.c.state,
            due_at=batch.c.due_at,
            settled_at=batch.c.settled_at,
            # A hand-back keeps the last real error and spends no attempt (settle_values).
            error=case((batch.c.handed_back, t.c.error), else_=batch.c.error),
            uncounted=t.c.uncounted + case((batch.c.handed_back, 1), else_=0),
        )
        .returning(t.c.bot, t.c.update_id, qualified(waiting).label("waiting"))
    )


# -- durable (revision 0002) -------------------------------------------------------------------


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
    t: Table, *, now: int, lease_until: int, limit: int, bots: Sequence[str]
) -> Update:
    """Lease up to `limit` open exhaustions due for delivery (oldest due first) until
    `lease_until`: no other process takes them meanwhile (SKIP LOCKED on PostgreSQL; SQLite
    serialises writers). Only these rows' bodies are read."""
    due = (
        select(t.c.bot, t.c.update_id)
        .where(unacknowledged(t), t.c.delivery_due_at <= now, t.c.bot.in_(list(bots)))
        .order_by(t.c.delivery_due_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return (
        update(t)
        .where(tuple_(t.c.bot, t.c.update_id).in_(due), unacknowledged(t))
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
    return (
        t.c.bot,
        t.c.update_id,
        t.c.attempts,
        t.c.claim_id,
        t.c.body,
        t.c.error,
        t.c.exhausted_at,
        t.c.deliveries,
    )


def due_exhaustions(
    t: Table, *, limit: int, after: tuple[str, int] | None, bots: Sequence[str] | None
) -> Select[Any]:
    statement = select(*_exhaustion_columns(t)).where(unacknowledged(t))
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


# -- health --------------------------------------------------------------------------------


def ping() -> Select[Any]:
    """The smallest round trip: the readiness probe's."""
    return select(literal(1))
