"""Every statement of recording: add many updates in one statement, tell the new ones, prune
what is delivered and old. Each builder is named after the store method that runs it."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Insert,
    Select,
    Table,
    Text,
    and_,
    delete,
    insert,
    literal_column,
    select,
    true,
    tuple_,
)
from sqlalchemy.sql.dml import ReturningDelete
from sqlalchemy.sql.expression import FromClause

from app.store.predicates import (
    Upsert,
    delivering,
    in_state,
)
from app.store.schema import QUEUE_RULE

KEY_COLUMNS = {"bot": Text, "update_id": BigInteger}


ADD_COLUMNS = {
    **KEY_COLUMNS,  # first: a batch's derived table of the keys alone reads the same rows
    "body": Text,
    "update_type": Text,
    "queue_key": Text,
    "received_at": BigInteger,
    "trace_context": Text,  # revision 0007: inserted where the table has it
    "subjects": Text,  # revision 0009: likewise
    "state": Text,  # pending, or (revision 0010) unrouted
    "settled_at": BigInteger,  # NULL, or an unrouted row's receipt
}

# A new delivery beside its update's row (revision 0010): `types.DeliveryRow`.
DELIVERY_COLUMNS = {
    "bot": Text,
    "destination": Text,
    "update_id": BigInteger,
    "queue_key": Text,
    "received_at": BigInteger,
}


def add_many(t: Table, batch: FromClause, upsert: Upsert) -> Insert:
    """`add_many`'s INSERT of a batch of rows (`batch`, a derived table of ADD_COLUMNS: each
    backend's own) as pending (or unrouted, settled at their receipt): existing keys are
    skipped (duplicates within the batch too, the first one kept). Which keys were new, each
    backend tells its own way: PostgreSQL by RETURNING, SQLite by the count it inserted (and
    `sqlite_statements.inserted` when some were not new)."""
    columns = [name for name in ADD_COLUMNS if name in t.c]
    # A pending row's due_at is its received_at: `due` and the due-order index rely on it.
    values = [*(batch.c[name] for name in columns), literal_column("0"), batch.c.received_at]
    names = [*columns, "attempts", "due_at"]
    if "queue_rule" in t.c:  # revision 0006: the keys are Telegram's queues (app.queues)
        values.append(literal_column(str(QUEUE_RULE)))
        names.append("queue_rule")
    # SQLite reads ON CONFLICT after a SELECT with no WHERE as a join's ON.
    source = select(*values).where(true())
    inserted = upsert(t).from_select(names, source)
    statement: Insert = inserted.on_conflict_do_nothing(index_elements=[t.c.bot, t.c.update_id])
    return statement


def add_deliveries(d: Table, batch: FromClause, new: FromClause | None = None) -> Insert:
    """`add_many`'s INSERT of the deliveries of new rows (`batch`, a derived table of
    DELIVERY_COLUMNS) beside them, each pending and due at its update's receipt. With `new`
    (the keys the rows' INSERT returned), only the deliveries of those: a duplicate of an
    update already recorded gains no delivery, whatever the routes are now."""
    values = [
        *(batch.c[name] for name in DELIVERY_COLUMNS),
        literal_column("'pending'"),
        literal_column("0"),
        batch.c.received_at,
    ]
    source = select(*values)
    if new is not None:
        keys = select(new.c.bot, new.c.update_id)
        source = source.where(tuple_(batch.c.bot, batch.c.update_id).in_(keys))
    return insert(d).from_select([*DELIVERY_COLUMNS, "state", "attempts", "due_at"], source)


def any_row(t: Table) -> Select[Any]:
    """One row of `t`, if it has any (a prune asks whether deliveries exist at all)."""
    return select(literal_column("1")).select_from(t).limit(1)


def recorded(t: Table, batch: FromClause) -> Select[Any]:
    """The keys of a batch (`batch`, a derived table of KEY_COLUMNS) already recorded: one
    primary-key lookup per row of the batch."""
    on = and_(t.c.bot == batch.c.bot, t.c.update_id == batch.c.update_id)
    return select(t.c.bot, t.c.update_id).select_from(batch.join(t, on))


def prune(
    t: Table, d: Table | None, *, before: int, limit: int, unrouted: bool = False
) -> ReturningDelete[Any]:
    """Delete up to `limit` prunable rows: a bounded batch, so that no prune holds a lock (on
    SQLite: the one write lock) for longer than one batch takes. A row is prunable when its
    own delivery (with `unrouted`, revision 0010, also its `unrouted` state) and, with `d`
    (the deliveries table, when it holds any), every delivery beside it were settled before
    `before`."""
    # The rule is settled_at < before; due_at == settled_at on terminal rows lets the
    # (state, due_at) index bound the scan. Exhaustions keep settled_at NULL until acknowledged.
    done = ("completed", "abandoned", "unrouted") if unrouted else ("completed", "abandoned")
    prunable = select(t.c.bot, t.c.update_id).where(
        in_state(t.c.state, *done),
        t.c.due_at < before,
        t.c.settled_at < before,
    )
    if d is not None:
        prunable = prunable.where(~delivering(t, d, before))
    return (
        delete(t)
        .where(tuple_(t.c.bot, t.c.update_id).in_(prunable.limit(limit)))
        .returning(t.c.bot, t.c.update_id)
    )
