"""The rules every statement shares: states, leases, identities, and what a claim and a settle
write. Each family's `statements` (`app.store.<family>.statements`) builds its methods'
statements from these, and the backends' own statements (`app.store.backends`) match rows by
the same rules, so a rule is written once whichever statement applies it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Table,
    Text,
    and_,
    case,
    exists,
    false,
    func,
    literal,
    literal_column,
    null,
    or_,
    select,
    true,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import BindParameter
from sqlalchemy.sql.expression import FromClause
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.sql.visitors import InternalTraversal

from app.store import validate
from app.store.schema_beside import beside_deliveries, updates_of
from app.store.types import (
    DEFAULT_DESTINATION,
    STATES,
    Abandoned,
    ClaimIdentity,
    Completed,
    Failed,
    HandedBack,
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


class unindexed(FunctionElement[str]):
    """A column no index may serve (SQLite's unary `+`). On a file never analysed, SQLite
    otherwise picks an index by its guesses: the due-order claim walked every retained row of
    a bot through the primary key's `bot = ?` (270 ms against 1.5 ms a claim at 1,000,000
    settled rows), and a batch settle walked every leased row through the (state, due_at)
    index for each row of the batch. PostgreSQL reads it as the column."""

    type = Text()
    inherit_cache = True


@compiles(unindexed)
def _unindexed_default(element: unindexed, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(element.clauses, **kw)


@compiles(unindexed, "sqlite")
def _unindexed_sqlite(element: unindexed, compiler: SQLCompiler, **kw: Any) -> str:
    return "+" + compiler.process(element.clauses, **kw)


class qualified(ColumnElement[Any]):
    """`element` compiled with its columns' table names where the dialect would leave them out:
    SQLite's RETURNING drops them from everything in it, a correlated subquery included, whose
    `newer.bot = t.bot` would then read `bot = bot`."""

    inherit_cache = True
    _traverse_internals = [("element", InternalTraversal.dp_clauseelement)]  # noqa: RUF012

    def __init__(self, element: ColumnElement[Any]) -> None:
        self.element = element
        self.type = element.type


@compiles(qualified)
def _qualified(element: qualified, compiler: SQLCompiler, **kw: Any) -> str:
    kw.pop("include_table", None)
    return compiler.process(element.element, **kw)


# The dialect's INSERT, which alone knows ON CONFLICT: each backend's `upsert`, so that no
# shared statement names a dialect.
Upsert = Callable[[Table], Any]


# -- shared predicates -------------------------------------------------------------------------


def in_state(column: ColumnElement[str], *states: State) -> ColumnElement[bool]:
    """`state` compared with SQL literals, never bound parameters: a partial index (and a
    prepared statement's generic plan) applies only when the planner sees the constant."""
    unknown = set(states) - set(STATES)
    if unknown:
        raise ValueError(f"not states: {sorted(unknown)}")
    values: list[ColumnElement[Any]] = [literal_column(f"'{state}'") for state in states]
    return column == values[0] if len(values) == 1 else column.in_(values)


def lease_column(t: Table) -> ColumnElement[int]:
    """due_at for a lease comparison in a keyed statement. The `+ 0` keeps the planner on the
    primary key: on a range of due_at it may pick the due-order index, and scan every live lease
    and pending retry instead of one row."""
    return t.c.due_at + 0


def key_is(
    t: Table,
    bot: str | ColumnElement[str],
    update_id: Number | ColumnElement[int],
    destination: str | ColumnElement[str] = DEFAULT_DESTINATION,
) -> ColumnElement[bool]:
    """One delivery's key: (bot, update_id) in the update's table, whose delivery is
    `default`'s; (bot, destination, update_id) in the deliveries table (revision 0010)."""
    if "destination" in t.c:
        return and_(t.c.bot == bot, t.c.destination == destination, t.c.update_id == update_id)
    # Another destination's delivery is never the update's row.
    if isinstance(destination, str):
        if destination != DEFAULT_DESTINATION:
            return false()
        return and_(t.c.bot == bot, t.c.update_id == update_id)
    default: ColumnElement[str] = literal_column(f"'{DEFAULT_DESTINATION}'")
    return and_(t.c.bot == bot, destination == default, t.c.update_id == update_id)


def lapsed_or_due(t: Table, now: Number) -> ColumnElement[bool]:
    # A lease is live at exactly due_at and lapsed after it; a retry is due at exactly due_at.
    return or_(
        and_(in_state(t.c.state, "processing"), t.c.due_at < now),
        and_(in_state(t.c.state, "failed"), t.c.due_at <= now),
    )


def claimable(t: Table, now: int) -> ColumnElement[bool]:
    return or_(in_state(t.c.state, "pending"), lapsed_or_due(t, now))


def live(t: Table, at: int | ColumnElement[int]) -> ColumnElement[bool]:
    """Leased, and the lease live at `at` (live at exactly due_at). Keyed statements only: no
    index serves the state or the lease, so the key's (the primary key) does."""
    return and_(in_state(unindexed(t.c.state), "processing"), lease_column(t) >= at)


def holds_lease(t: Table, bot: str, update_id: int, attempt: int, at: int) -> ColumnElement[bool]:
    return and_(key_is(t, bot, update_id), t.c.attempts == attempt, live(t, at))


def identity_is(t: Table, identity: ClaimIdentity) -> ColumnElement[bool]:
    """All five fields of the identity: neither a later attempt, a recycled key nor another
    destination's delivery matches."""
    return matches(
        t,
        identity.bot,
        identity.update_id,
        identity.attempt,
        identity.claim_id,
        identity.destination,
    )


def matches(
    t: Table,
    bot: Any,
    update_id: Any,
    attempt: Any,
    claim_id: Any,
    destination: Any = DEFAULT_DESTINATION,
) -> ColumnElement[bool]:
    return and_(
        key_is(t, bot, update_id, destination),
        t.c.attempts == attempt,
        t.c.claim_id == claim_id,
    )


def owned_by(t: Table, identity: ClaimIdentity, at: int) -> ColumnElement[bool]:
    """The exact live claim: the identity and an unexpired lease."""
    return and_(identity_is(t, identity), live(t, at))


Number = int | BindParameter[int]


def claim_values(
    t: Table, *, now: Number, lease_until: Number, max_attempts: Number, fenced: bool, durable: bool
) -> dict[str, Any]:
    """SET clause of every claim: take the row, or end it when its attempts are spent.

    The budget counts the attempts that spent it: from revision 0003, `attempts - uncounted`
    (a hand-back spends none). A durable exhaustion keeps settled_at NULL, so prune cannot
    touch it before its acknowledgement; it keeps the identity of its last attempt, and is due
    for delivery to exhaustion_url at once.
    """
    fresh = counted(t) < max_attempts
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
        if "delivery_due_at" in t.c:
            values["delivery_due_at"] = case((fresh, t.c.delivery_due_at), else_=now)
    return values


def counted(t: Table) -> ColumnElement[int]:
    """The attempts that spent the budget: all of them below revision 0003."""
    return t.c.attempts - t.c.uncounted if "uncounted" in t.c else t.c.attempts


def settled_columns(settlement: Settlement) -> dict[str, Any]:
    """The plain values a settle writes to state, settled_at, due_at and error. A hand-back's
    error here is None: `settle_values` keeps the row's own instead."""
    # Terminal rows keep due_at == settled_at, so prune can range-scan the (state, due_at) index.
    match settlement:
        case Completed(at=at):
            return {"state": "completed", "settled_at": at, "due_at": at, "error": None}
        case Failed(at=_, retry_at=retry_at, error=error):
            return {"state": "failed", "settled_at": None, "due_at": retry_at, "error": error}
        case Abandoned(at=at, error=error):
            return {"state": "abandoned", "settled_at": at, "due_at": at, "error": error}
        case HandedBack(at=at):
            return {"state": "failed", "settled_at": None, "due_at": at, "error": None}
    raise TypeError(f"not a settlement: {settlement!r}")


def settle_values(t: Table, settlement: Settlement) -> dict[str, Any]:
    """SET clause of a settle. A hand-back is due again at once, keeps the error of the last
    real attempt and (revision 0003) adds itself to `uncounted`: it spends no attempt."""
    values = settled_columns(settlement)
    if isinstance(settlement, HandedBack):
        values["error"] = t.c.error
        if "uncounted" in t.c:
            values["uncounted"] = t.c.uncounted + 1
    return values


def delivering(t: Table, d: Table, before: Number) -> ColumnElement[bool]:
    """The update of `t`'s row has a delivery beside it (`d`, revision 0010) not done before
    `before`: open, an exhaustion not yet acknowledged, or settled since (one probe of
    ix_{t}_dl_update). Prune and retention wait for every delivery of an update."""
    return exists(
        select(d.c.update_id).where(
            d.c.bot == t.c.bot,
            d.c.update_id == t.c.update_id,
            or_(
                ~in_state(d.c.state, "completed", "abandoned"),
                d.c.settled_at.is_(None),
                d.c.settled_at >= before,
            ),
        )
    )


def unacknowledged(t: Table) -> ColumnElement[bool]:
    # The predicate of the partial exhaustion index. exhausted_at is only ever set together
    # with state 'abandoned', which no statement leaves, so the state needs no test here (one
    # would steer PostgreSQL onto the (state, due_at) index, through every abandoned row).
    return and_(t.c.exhausted_at.is_not(None), t.c.acknowledged_at.is_(None))


def traced(t: Table) -> list[ColumnElement[Any]]:
    """The table's `trace_context` (the updates table from revision 0007, the events table
    from 0008), to return or write where the table has it; nothing below."""
    return [t.c.trace_context] if "trace_context" in t.c else []


def transition_returning(t: Table) -> tuple[ColumnElement[Any], ...]:
    """What a transition that may make an exhaustion returns: its identity and what
    exhaustion.created tells of it (`app.store.outbox.exhaustion`), its trace included; on
    the deliveries table its destination too."""
    c = t.c
    update_type, *trace = of_update(t)[1:]
    beside = [c.destination] if beside_deliveries(t) else []
    return (c.bot, c.update_id, c.attempts, c.claim_id, update_type, c.queue_key, *trace, *beside)


def of_update(t: Table) -> list[ColumnElement[Any]]:
    """What a claim returns of the update itself (its body, type and trace context): the
    row's own columns, or on the deliveries table one primary-key probe of the update's row
    each (SQLite's RETURNING admits a subquery, never a joined table)."""
    if not beside_deliveries(t):
        return [t.c.body, t.c.update_type, *traced(t)]
    return [update_column(t, name).label(name) for name in ("body", "update_type", "trace_context")]


def update_column(t: Table, name: str) -> ColumnElement[Any]:
    """The update's column `name` for `t`'s row: its own, or on the deliveries table a
    primary-key probe of the update's row."""
    if not beside_deliveries(t):
        return t.c[name]
    u = updates_of(t)
    key = and_(u.c.bot == t.c.bot, u.c.update_id == t.c.update_id)
    return qualified(select(u.c[name]).where(key).scalar_subquery())


def for_destination(t: FromClause, destination: str | None) -> ColumnElement[bool]:
    """The rows of one destination on the deliveries table (a constant, so that one compiled
    claim serves one destination); nothing on the update's table, whose rows are `default`'s."""
    if not beside_deliveries(t):
        return true()
    return t.c.destination == literal_column(f"'{validate.destination_name(destination)}'")
