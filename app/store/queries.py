"""Every statement the store runs, one builder per store method, named after the method.

Each state transition is one conditional statement: its WHERE clause is the whole rule, and
nothing reads a row to decide how to write it. Builders take the table and the checked
arguments and return a SQLAlchemy Core statement; the store only executes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Delete,
    Integer,
    Select,
    Table,
    Text,
    Update,
    and_,
    bindparam,
    case,
    cast,
    delete,
    exists,
    func,
    literal,
    literal_column,
    null,
    or_,
    select,
    true,
    tuple_,
    union_all,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import BindParameter
from sqlalchemy.sql.functions import FunctionElement

from app.store.types import (
    STATES,
    Abandoned,
    ClaimIdentity,
    Completed,
    Failed,
    NewUpdate,
    Ordering,
    Settlement,
    State,
)

NON_TERMINAL: tuple[State, ...] = ("pending", "processing", "failed")
SPENT_ERROR = "attempts spent"


class new_claim_id(FunctionElement[str]):
    """A fresh random UUID (version 4) string, evaluated per row by the database."""

    type = Text()
    inherit_cache = True


@compiles(new_claim_id, "postgresql")
def _claim_id_postgresql(element: new_claim_id, compiler: SQLCompiler, **kw: Any) -> str:
    return "gen_random_uuid()::text"


@compiles(new_claim_id, "sqlite")
def _claim_id_sqlite(element: new_claim_id, compiler: SQLCompiler, **kw: Any) -> str:
    # randomblob draws from SQLite's CSPRNG; the shape is a canonical version 4 UUID.
    return (
        "(lower(hex(randomblob(4))) || '-' || lower(hex(randomblob(2))) || '-4' || "
        "substr(lower(hex(randomblob(2))), 2) || '-' || substr('89ab', 1 + (random() & 3), 1) || "
        "substr(lower(hex(randomblob(2))), 2) || '-' || lower(hex(randomblob(6))))"
    )


# -- shared predicates -------------------------------------------------------------------------


def _in_state(column: ColumnElement[str], *states: State) -> ColumnElement[bool]:
    """`state` compared with SQL literals, never bound parameters: a partial index (and a
    prepared statement's generic plan) applies only when the planner sees the constant."""
    unknown = set(states) - set(STATES)
    if unknown:
        raise ValueError(f"not states: {sorted(unknown)}")
    values: list[ColumnElement[Any]] = [literal_column(f"'{state}'") for state in states]
    return column == values[0] if len(values) == 1 else column.in_(values)


def _lease(t: Table) -> ColumnElement[int]:
    """due_at for a lease comparison in a keyed statement. The `+ 0` keeps the planner on the
    primary key: on a range of due_at it may pick the due-order index, and scan every live lease
    and pending retry instead of one row."""
    return t.c.due_at + 0


def _key(t: Table, bot: str | BindParameter[str], update_id: Number) -> ColumnElement[bool]:
    return and_(t.c.bot == bot, t.c.update_id == update_id)


def _lapsed_or_due(t: Table, now: Number) -> ColumnElement[bool]:
    # A lease is live at exactly due_at and lapsed after it; a retry is due at exactly due_at.
    return or_(
        and_(_in_state(t.c.state, "processing"), t.c.due_at < now),
        and_(_in_state(t.c.state, "failed"), t.c.due_at <= now),
    )


def _claimable(t: Table, now: int) -> ColumnElement[bool]:
    return or_(_in_state(t.c.state, "pending"), _lapsed_or_due(t, now))


def _live(t: Table, at: int | ColumnElement[int]) -> ColumnElement[bool]:
    """Leased, and the lease live at `at` (live at exactly due_at)."""
    return and_(_in_state(t.c.state, "processing"), _lease(t) >= at)


def _holds_lease(t: Table, bot: str, update_id: int, attempt: int, at: int) -> ColumnElement[bool]:
    return and_(_key(t, bot, update_id), t.c.attempts == attempt, _live(t, at))


def _identity(t: Table, identity: ClaimIdentity) -> ColumnElement[bool]:
    """All four fields of the identity: neither a later attempt nor a recycled key matches."""
    return _matches(t, identity.bot, identity.update_id, identity.attempt, identity.claim_id)


def _matches(
    t: Table, bot: Any, update_id: Any, attempt: Any, claim_id: Any
) -> ColumnElement[bool]:
    return and_(_key(t, bot, update_id), t.c.attempts == attempt, t.c.claim_id == claim_id)


def _owned(t: Table, identity: ClaimIdentity, at: int) -> ColumnElement[bool]:
    """The exact live claim: the identity and an unexpired lease."""
    return and_(_identity(t, identity), _live(t, at))


Number = int | BindParameter[int]


def _claim_values(
    t: Table, *, now: Number, lease_until: Number, max_attempts: Number, fenced: bool, durable: bool
) -> dict[str, Any]:
    """SET clause of every claim: take the row, or end it when its attempts are spent.

    A durable exhaustion keeps settled_at NULL, so prune cannot touch it before its
    acknowledgement; it keeps the identity of its last attempt.
    """
    fresh = t.c.attempts < max_attempts
    values: dict[str, Any] = {
        "state": case((fresh, literal("processing")), else_=literal("abandoned")),
        "attempts": case((fresh, t.c.attempts + 1), else_=t.c.attempts),
        "due_at": case((fresh, lease_until), else_=now),
        "settled_at": None if durable else case((fresh, null()), else_=now),
        "error": case((fresh, t.c.error), else_=literal(SPENT_ERROR)),
    }
    if fenced or durable:
        taken = new_claim_id() if fenced else t.c.claim_id
        spent = func.coalesce(t.c.claim_id, new_claim_id()) if durable else t.c.claim_id
        values["claim_id"] = case((fresh, taken), else_=spent)
    if durable:
        values["exhausted_at"] = case((fresh, t.c.exhausted_at), else_=now)
    return values


def _settle_values(settlement: Settlement) -> dict[str, Any]:
    # Terminal rows keep due_at == settled_at, so prune can range-scan the (state, due_at) index.
    match settlement:
        case Completed(at=at):
            return {"state": "completed", "settled_at": at, "due_at": at, "error": None}
        case Failed(at=_, retry_at=retry_at, error=error):
            return {"state": "failed", "settled_at": None, "due_at": retry_at, "error": error}
        case Abandoned(at=at, error=error):
            return {"state": "abandoned", "settled_at": at, "due_at": at, "error": error}
    raise TypeError(f"not a settlement: {settlement!r}")


# -- base (revision 0001 columns only) ---------------------------------------------------------


def _unnest(columns: dict[str, Any]) -> Any:
    """PostgreSQL: parallel arrays as a derived table `batch(columns...)`. The statement text
    is the same for every batch size, so psycopg prepares it once."""
    arrays = (cast(bindparam(f"batch_{name}"), ARRAY(kind)) for name, kind in columns.items())
    return func.unnest(*arrays).table_valued(*columns).render_derived(name="batch")


def _arrays(columns: dict[str, Any], rows: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
    return {f"batch_{name}": [row[name] for row in rows] for name in columns}


_ADD_COLUMNS = {
    "bot": Text,
    "update_id": BigInteger,
    "body": Text,
    "update_type": Text,
    "queue_key": Text,
    "received_at": BigInteger,
}


def add(t: Table, dialect: str, channel: str | None = None) -> Any:
    """INSERT new keys as pending, skip existing ones (duplicates within the batch too);
    RETURNING names the keys that were new. One statement for a batch on either backend:
    unnest() of parallel arrays on PostgreSQL, executemany in one transaction on SQLite.

    With `channel` (PostgreSQL), the statement also NOTIFYs it when it added a row: workers in
    other processes wake at the commit, with no round trip of its own."""
    if dialect == "postgresql":
        batch = _unnest(_ADD_COLUMNS)
        # A pending row's due_at is its received_at: `due` and the due-order index rely on it.
        source = select(
            *(batch.c[name] for name in _ADD_COLUMNS),
            literal_column("'pending'"),
            literal_column("0"),
            batch.c.received_at,
        )
        names = [*_ADD_COLUMNS, "state", "attempts", "due_at"]
        insert = postgresql.insert(t).from_select(names, source)
        insert = insert.on_conflict_do_nothing(index_elements=[t.c.bot, t.c.update_id])
        added = insert.returning(t.c.bot, t.c.update_id)
        if channel is None:
            return added
        # pg_notify runs per new row; PostgreSQL sends one notification per transaction.
        rows = added.cte("added")
        return select(rows.c.bot, rows.c.update_id, func.pg_notify(channel, ""))
    many = sqlite.insert(t).on_conflict_do_nothing(index_elements=[t.c.bot, t.c.update_id])
    return many.returning(t.c.bot, t.c.update_id)


def add_arrays(rows: Sequence[NewUpdate]) -> dict[str, list[Any]]:
    """PostgreSQL: the parameters of `add` for these rows, as parallel arrays."""
    return {f"batch_{name}": [getattr(row, name) for row in rows] for name in _ADD_COLUMNS}


def add_rows(rows: Sequence[NewUpdate]) -> list[dict[str, Any]]:
    """SQLite: the parameters of `add` for these rows, one dictionary a row."""
    return [
        {
            **{name: getattr(row, name) for name in _ADD_COLUMNS},
            "state": "pending",
            "attempts": 0,
            "due_at": row.received_at,
        }
        for row in rows
    ]


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
    values = _claim_values(
        t,
        now=now,
        lease_until=lease_until,
        max_attempts=max_attempts,
        fenced="claim_id" in t.c,
        durable=durable_exhaustion,
    )
    return (
        update(t)
        .where(_key(t, bot, update_id), _claimable(t, now))
        .values(values)
        .returning(t.c.state, t.c.attempts)
    )


def renew(
    t: Table, *, bot: str, update_id: int, attempt: int, lease_until: int, now: int | None
) -> Update:
    live = _lease(t) >= now if now is not None else true()
    return _renew(t, and_(_key(t, bot, update_id), t.c.attempts == attempt, live), lease_until)


def _renew(t: Table, rule: ColumnElement[bool], lease_until: int) -> Update:
    # Never shortens: a smaller lease_until matches the row and leaves due_at as it is.
    extended = case((t.c.due_at < lease_until, lease_until), else_=t.c.due_at)
    return (
        update(t)
        .where(rule, _in_state(t.c.state, "processing"))
        .values(due_at=extended)
        .returning(t.c.due_at)
    )


def settle(t: Table, *, bot: str, update_id: int, attempt: int, settlement: Settlement) -> Update:
    return (
        update(t)
        .where(_holds_lease(t, bot, update_id, attempt, settlement.at))
        .values(_settle_values(settlement))
        .returning(t.c.state)
    )


def due(
    t: Table, *, now: int, pending_before: int, limit: int, bots: Sequence[str] | None = None
) -> Select[Any]:
    # One indexed range per state, materialised, then put in key order: otherwise SQLite walks
    # the primary key in order through every retained row. A pending row's due_at is its
    # received_at.
    branches = [
        and_(_in_state(t.c.state, "pending"), t.c.due_at <= pending_before),
        and_(_in_state(t.c.state, "processing"), t.c.due_at < now),
        and_(_in_state(t.c.state, "failed"), t.c.due_at <= now),
    ]
    if bots is not None:
        branches = [and_(branch, t.c.bot.in_(list(bots))) for branch in branches]
    columns = (t.c.bot, t.c.update_id, t.c.body, t.c.update_type, t.c.received_at)
    rows = (
        union_all(*(select(*columns).where(branch) for branch in branches))
        .cte("due")
        .prefix_with("MATERIALIZED")
    )
    return select(rows).order_by(rows.c.bot, rows.c.update_id).limit(limit)


def prune(t: Table, *, before: int) -> Delete:
    # The rule is settled_at < before; due_at == settled_at on terminal rows lets the
    # (state, due_at) index bound the scan. Exhaustions keep settled_at NULL until acknowledged.
    return delete(t).where(
        _in_state(t.c.state, "completed", "abandoned"),
        t.c.due_at < before,
        t.c.settled_at < before,
    )


def get_update(t: Table, *, bot: str, update_id: int) -> Select[Any]:
    return select(t).where(_key(t, bot, update_id))


def stats(t: Table) -> Select[Any]:
    """Per bot and state: rows, the oldest receipt, and (revision 0002) open exhaustions."""
    columns: list[Any] = [
        t.c.bot,
        t.c.state,
        func.count().label("rows"),
        func.min(t.c.received_at).label("oldest"),
    ]
    if "exhausted_at" in t.c:
        open_exhaustion = case((_unacknowledged(t), 1), else_=0)
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
    values = _claim_values(
        t,
        now=now,
        lease_until=lease_until,
        max_attempts=max_attempts,
        fenced=True,
        durable=durable_exhaustion,
    )
    return (
        update(t)
        .where(_key(t, bot, update_id), _claimable(t, now))
        .values(values)
        .returning(t.c.state, t.c.attempts, t.c.claim_id)
    )


def claim_next_owned(
    t: Table,
    *,
    now: Number,
    lease_until: Number,
    max_attempts: Number,
    limit: Number,
    ordering: Ordering,
    bots: Sequence[str] | None,
    durable_exhaustion: bool,
) -> Update:
    """Take up to `limit` due rows in one statement, oldest due first. The numbers may be
    bound parameters, for a statement compiled once and run many times.

    Rows another transaction has locked are skipped (SKIP LOCKED on PostgreSQL; SQLite
    serialises writers). With chat ordering a row is eligible only when no older row of its
    (bot, queue_key) is still pending, processing or failed.
    """
    # Walk non-terminal rows in due order (ix_due) and stop at the limit: the cost follows the
    # batch and the queues in flight, not the backlog. A pending row is due from receipt.
    candidates = select(t.c.bot, t.c.update_id).where(
        _in_state(t.c.state, *NON_TERMINAL),
        t.c.due_at <= now,
        or_(~_in_state(t.c.state, "processing"), t.c.due_at < now),
    )
    if bots is not None:
        candidates = candidates.where(t.c.bot.in_(list(bots)))
    if ordering == "chat":
        older = t.alias("older")
        candidates = candidates.where(
            or_(
                t.c.queue_key.is_(None),
                ~exists().where(
                    older.c.bot == t.c.bot,
                    older.c.queue_key == t.c.queue_key,
                    older.c.update_id < t.c.update_id,
                    _in_state(older.c.state, *NON_TERMINAL),
                ),
            )
        )
    candidates = (
        candidates.order_by(t.c.due_at).limit(limit).with_for_update(skip_locked=True, of=t)
    )
    values = _claim_values(
        t,
        now=now,
        lease_until=lease_until,
        max_attempts=max_attempts,
        fenced=True,
        durable=durable_exhaustion,
    )
    return (
        update(t)
        .where(tuple_(t.c.bot, t.c.update_id).in_(candidates))
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
        )
    )


def renew_owned(t: Table, *, identity: ClaimIdentity, lease_until: int, now: int | None) -> Update:
    live = _lease(t) >= now if now is not None else true()
    return _renew(t, and_(_identity(t, identity), live), lease_until)


def owns(t: Table, *, identity: ClaimIdentity | None, at: Number, lock: bool) -> Select[Any]:
    """The lease of the exact live claim; FOR UPDATE holds the row for the caller's transaction.
    With `identity` None the statement takes it as parameters `bot`, `update_id`, `attempt`
    and `claim_id`, to be compiled once (the callback API asks this on every update)."""
    matches = (
        _matches(
            t,
            bindparam("bot", type_=Text),
            bindparam("update_id", type_=BigInteger),
            bindparam("attempt", type_=Integer),
            bindparam("claim_id", type_=Text),
        )
        if identity is None
        else _identity(t, identity)
    )
    statement = select(t.c.due_at).where(matches, _live(t, at))
    return statement.with_for_update() if lock else statement


def hold_owned(t: Table, *, identity: ClaimIdentity) -> Update:
    """SQLite's `owns` inside a caller's transaction: a no-op write of the identity's leased
    row, which takes the one write lock until that transaction ends (a SELECT would take none).
    It returns the lease; the caller compares it with the clock read after the statement, so
    time spent waiting for the lock counts against the lease (as in the PostgreSQL function)."""
    leased = and_(_identity(t, identity), _in_state(t.c.state, "processing"))
    return update(t).where(leased).values(due_at=t.c.due_at).returning(t.c.due_at)


def owns_function(name: str, identity: ClaimIdentity) -> Select[Any]:
    """PostgreSQL's `owns` inside a caller's transaction: the SQL function of revision 0002
    (FOR UPDATE, database clock)."""
    arguments = (identity.bot, identity.update_id, identity.attempt, identity.claim_id)
    return select(getattr(func, name)(*arguments))


def settle_owned(t: Table, *, identity: ClaimIdentity, settlement: Settlement) -> Update:
    return (
        update(t)
        .where(_owned(t, identity, settlement.at))
        .values(_settle_values(settlement))
        .returning(t.c.state)
    )


_SETTLE_COLUMNS = {
    "bot": Text,
    "update_id": BigInteger,
    "attempt": Integer,
    "claim_id": Text,
    "at": BigInteger,
    "state": Text,
    "due_at": BigInteger,
    "settled_at": BigInteger,
    "error": Text,
}


def settle_many_owned(t: Table) -> Update:
    """PostgreSQL: a whole batch of settlements in one statement, each row matched on its full
    identity and live lease, over unnest() of parallel arrays (one statement text for any batch
    size, so it is prepared once). RETURNING names the keys that were settled and, as
    `waiting`, whether a later update of the same chat is still to deliver: a worker then looks
    for it at once, and otherwise need not look at all."""
    batch = _unnest(_SETTLE_COLUMNS)
    newer = t.alias("newer")
    waiting = exists().where(
        newer.c.bot == t.c.bot,
        newer.c.queue_key == t.c.queue_key,
        newer.c.update_id > t.c.update_id,
        _in_state(newer.c.state, *NON_TERMINAL),
    )
    return (
        update(t)
        .where(
            t.c.bot == batch.c.bot,
            t.c.update_id == batch.c.update_id,
            t.c.attempts == batch.c.attempt,
            t.c.claim_id == batch.c.claim_id,
            _live(t, batch.c.at),
        )
        .values(
            state=batch.c.state,
            due_at=batch.c.due_at,
            settled_at=batch.c.settled_at,
            error=batch.c.error,
        )
        .returning(t.c.bot, t.c.update_id, waiting.label("waiting"))
    )


def settle_many_parameters(
    items: Sequence[tuple[ClaimIdentity, Settlement]],
) -> dict[str, list[Any]]:
    """The arrays of `settle_many_owned` for these settlements."""
    rows = []
    for identity, settlement in items:
        values = _settle_values(settlement)
        rows.append(
            {
                "bot": identity.bot,
                "update_id": identity.update_id,
                "attempt": identity.attempt,
                "claim_id": identity.claim_id,
                "at": settlement.at,
                **{name: values[name] for name in ("state", "due_at", "settled_at", "error")},
            }
        )
    return _arrays(_SETTLE_COLUMNS, rows)


# -- durable (revision 0002) -------------------------------------------------------------------


def _unacknowledged(t: Table) -> ColumnElement[bool]:
    # The predicate of the partial exhaustion index. exhausted_at is only ever set together
    # with state 'abandoned', which no statement leaves, so the state needs no test here (one
    # would steer PostgreSQL onto the (state, due_at) index, through every abandoned row).
    return and_(t.c.exhausted_at.is_not(None), t.c.acknowledged_at.is_(None))


def exhaust(t: Table, *, identity: ClaimIdentity, at: int, error: str) -> Update:
    return (
        update(t)
        .where(_owned(t, identity, at))
        .values(state="abandoned", exhausted_at=at, due_at=at, settled_at=None, error=error)
        .returning(t.c.state)
    )


def due_exhaustions(
    t: Table, *, limit: int, after: tuple[str, int] | None, bots: Sequence[str] | None
) -> Select[Any]:
    statement = select(
        t.c.bot, t.c.update_id, t.c.attempts, t.c.claim_id, t.c.body, t.c.error, t.c.exhausted_at
    ).where(_unacknowledged(t))
    if after is not None:
        statement = statement.where(tuple_(t.c.bot, t.c.update_id) > tuple_(*after))
    if bots is not None:
        statement = statement.where(t.c.bot.in_(list(bots)))
    return statement.order_by(t.c.bot, t.c.update_id).limit(limit)


def acknowledge_exhaustion(t: Table, *, identity: ClaimIdentity, at: int) -> Update:
    # The acknowledgement time becomes settled_at: from now on prune may take the row.
    return (
        update(t)
        .where(_identity(t, identity), _unacknowledged(t))
        .values(acknowledged_at=at, settled_at=at, due_at=at)
        .returning(t.c.state)
    )


# -- the clock and wake-ups (PostgreSQL) -------------------------------------------------------


def ping() -> Select[Any]:
    """The smallest round trip: the readiness probe's."""
    return select(literal(1))


def database_time() -> Select[Any]:
    """The database's clock in epoch ms: the one clock that the leases of every host share."""
    epoch = func.extract("epoch", func.clock_timestamp())
    return select(cast(func.floor(epoch * 1000), BigInteger))


def announce(channel: str) -> Select[Any]:
    """Wake the listeners of `channel` (at this statement's commit)."""
    return select(func.pg_notify(channel, ""))
