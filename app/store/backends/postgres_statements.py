"""The statements that exist on PostgreSQL only: batches over parameter arrays (`unnest`),
the same-database `owns` function, its clock and NOTIFY; built from the shared predicates."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    CTE,
    BigInteger,
    Integer,
    Select,
    Table,
    Text,
    Update,
    bindparam,
    case,
    cast,
    column,
    func,
    select,
    tuple_,
    update,
)
from sqlalchemy import table as catalog_view
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import ARRAY, OID
from sqlalchemy.sql.elements import ClauseElement

from app.store import history
from app.store.claims import statements as claims
from app.store.predicates import key_is, live
from app.store.records import statements as records
from app.store.schema import beside_deliveries
from app.store.settles import statements as settles
from app.store.types import DEFAULT_DESTINATION, ClaimIdentity, DeliveryRow, RecordedRow, Settlement

# The database's own counters of each table (a view of the statistics system).
STAT_USER_TABLES = catalog_view(
    "pg_stat_user_tables",
    column("relid", OID),
    column("n_mod_since_analyze", BigInteger),
    column("last_analyze"),
    column("last_autoanalyze"),
    column("n_dead_tup", BigInteger),
    column("n_live_tup", BigInteger),
    column("last_vacuum"),
    column("last_autovacuum"),
)

# The planner's size of each relation, as the last ANALYZE or VACUUM left it.
PG_CLASS = catalog_view("pg_class", column("oid", OID), column("reltuples"))


def _unnest(columns: dict[str, Any], name: str = "batch") -> Any:
    """Parallel arrays (the parameters `{name}_{column}`) as a derived table
    `name(columns...)`. The statement text is the same for every batch size, so psycopg
    prepares it once."""
    arrays = (cast(bindparam(f"{name}_{c}"), ARRAY(kind)) for c, kind in columns.items())
    return func.unnest(*arrays).table_valued(*columns).render_derived(name=name)


def arrays(
    columns: dict[str, Any], rows: Sequence[Any], name: str = "batch"
) -> dict[str, list[Any]]:
    """The parameters of `_unnest(columns, name)` for `rows` (mappings, or named tuples)."""
    if rows and not isinstance(rows[0], dict):
        return {f"{name}_{c}": [getattr(row, c) for row in rows] for c in columns}
    return {f"{name}_{c}": [row[c] for row in rows] for c in columns}


def add(t: Table, channel: str | None = None, deliveries: Table | None = None) -> Any:
    """`add_many`'s INSERT over unnest(): new keys as their rows say, existing ones skipped
    (duplicates within the batch too); RETURNING names the keys that were new.

    With `deliveries` (revision 0010's table), the same statement inserts the deliveries of
    the new rows (the parameters `routes_*`, `add_arrays`) from the first INSERT's RETURNING.
    With `channel`, it also NOTIFYs it when it added a row: workers in other processes wake
    at the commit, with no round trip of its own."""
    added = records.add_many(t, _unnest(records.ADD_COLUMNS), postgresql.insert)
    added = added.returning(t.c.bot, t.c.update_id)
    if channel is None and deliveries is None:
        return added
    rows = added.cte("added")
    # pg_notify runs per new row; PostgreSQL sends one notification per transaction.
    notified = [func.pg_notify(channel, "")] if channel is not None else []
    statement = select(rows.c.bot, rows.c.update_id, *notified)
    if deliveries is not None:  # a data-modifying CTE runs whether or not it is read
        routes = _unnest(records.DELIVERY_COLUMNS, "routes")
        statement = statement.add_cte(
            records.add_deliveries(deliveries, routes, new=rows).cte("routed")
        )
    return statement


def add_arrays(
    rows: Sequence[RecordedRow], deliveries: Sequence[DeliveryRow] = ()
) -> dict[str, list[Any]]:
    """The parameters of `add` for these rows (and of its `deliveries` form for these
    deliveries), as parallel arrays."""
    found = arrays(records.ADD_COLUMNS, rows)
    if deliveries:
        found.update(arrays(records.DELIVERY_COLUMNS, deliveries, "routes"))
    return found


def settle_many_owned(t: Table, attempts: Table | None = None) -> Update | Select[Any]:
    """`settles.settle_many_owned` over unnest() of parallel arrays (one statement text for any
    batch size, so it is prepared once). A row another transaction holds locked (a
    downstream's `owns` inside its transaction, an operator's statement) is skipped, not
    waited for: one locked row must not hold up the settles of every other attempt of the
    process. `busy_owned` tells a skipped row from a refused one. With `attempts`, the same
    statement ends each settled attempt's history (a data-modifying CTE)."""
    batch = select(_unnest(settles.SETTLE_COLUMNS)).cte("batch")
    free = _free(t, batch)
    unlocked = tuple_(t.c.bot, t.c.update_id).in_(select(free.c.bot, free.c.update_id))
    settle = settles.settle_many_owned(t, batch, unlocked)
    if attempts is None:
        return settle
    settled = settle.cte("settled")
    keys = tuple_(batch.c.bot, batch.c.update_id).in_(select(settled.c.bot, settled.c.update_id))
    return select(settled).add_cte(history.ended_many(attempts, batch, keys).cte("ended"))


def busy_owned(t: Table) -> Select[Any]:
    """Of a batch's unsettled items (the same arrays), the keys still held by their identity
    with a live lease: `settle_many_owned` skipped them because their row was locked. Read
    without a lock, so it never waits."""
    batch = _unnest(settles.SETTLE_COLUMNS)
    exact = settles.batch_matches(t, batch)
    return select(t.c.bot, t.c.update_id).where(exact, live(t, batch.c.at))


def _free(t: Table, batch: CTE) -> CTE:
    """The rows of a batch's keys that no other transaction holds, locked (SKIP LOCKED)."""
    return (
        select(t.c.bot, t.c.update_id)
        .join(batch, key_is(t, batch.c.bot, batch.c.update_id, batch.c.destination))
        .with_for_update(skip_locked=True, of=t)
        .cte("free")
    )


IDENTITY_COLUMNS = {
    "bot": Text,
    "update_id": BigInteger,
    "attempt": Integer,
    "claim_id": Text,
    "destination": Text,
}


def leased(t: Table) -> tuple[Any, ...]:
    """What the batch reads of leases return: the identity (`types.identity_of`) and lease."""
    beside = [t.c.destination] if beside_deliveries(t) else []
    return (t.c.bot, t.c.update_id, t.c.attempts, t.c.claim_id, *beside, t.c.due_at)


def owned_leases(t: Table) -> Select[Any]:
    """Of a batch of identities (parallel arrays), the exact live claims at `:at` and their
    leases: `owns`'s rule (`predicates.owned_by`) for all of them in one statement, read
    without a lock."""
    batch = _unnest(IDENTITY_COLUMNS)
    at = bindparam("at", type_=BigInteger)
    return select(*leased(t)).where(settles.batch_matches(t, batch), live(t, at))


RENEW_COLUMNS = {**IDENTITY_COLUMNS, "lease_until": BigInteger}


def renewed_leases(t: Table) -> Update:
    """A batch of renewals (parallel arrays of distinct identities), each matched on its full
    identity and a lease live at `:now` (the rule of `claims.renew_owned`), extended to its
    `lease_until` and never shortened. A row another transaction holds locked is skipped, not
    waited for (as `settle_many_owned`): its caller renews it alone."""
    batch = select(_unnest(RENEW_COLUMNS)).cte("batch")
    free = _free(t, batch)
    exact = settles.batch_matches(t, batch)
    now = bindparam("now", type_=BigInteger)
    extended = case((t.c.due_at < batch.c.lease_until, batch.c.lease_until), else_=t.c.due_at)
    return (
        update(t)
        .where(
            exact,
            live(t, now),
            tuple_(t.c.bot, t.c.update_id).in_(select(free.c.bot, free.c.update_id)),
        )
        .values(due_at=extended)
        .returning(*leased(t))
    )


def settle_many_parameters(
    items: Sequence[tuple[ClaimIdentity, Settlement]],
) -> dict[str, list[Any]]:
    """The arrays of `settle_many_owned` for these settlements."""
    return arrays(settles.SETTLE_COLUMNS, settles.settle_rows(items))


def owns_function(name: str, identity: ClaimIdentity) -> Select[Any]:
    """`fencing.owns_in_transaction`'s statement: the SQL function of revision 0002, or for a
    destination other than `default` its five-argument form of revision 0010."""
    arguments: tuple[Any, ...] = (identity.update_id, identity.attempt, identity.claim_id)
    if identity.destination == DEFAULT_DESTINATION:
        return select(getattr(func, name)(identity.bot, *arguments))
    return select(getattr(func, name)(identity.bot, identity.destination, *arguments))


def function_says(row: Any) -> bool:
    """Whether `owns_function`'s row proves the claim."""
    return row is not None and row[0] is True


def database_time() -> Select[Any]:
    """The database's clock in epoch ms."""
    epoch = func.extract("epoch", func.clock_timestamp())
    return select(cast(func.floor(epoch * 1000), BigInteger))


# A write of no consequence that needs room in the data directory: a sort bigger than its
# memory (SET LOCAL: this transaction's), spilled to a temporary file there (base/pgsql_tmp),
# which fails with "could not write to file" (disk_full) while there is none. A full WAL
# volume stops the server itself.
PROBE = (
    "SET LOCAL work_mem = '64kB'",
    "SELECT count(DISTINCT n) FROM generate_series(1, 20000) AS n",
)


def announce(channel: str) -> Select[Any]:
    """Wake the listeners of `channel` (at this statement's commit)."""
    return select(func.pg_notify(channel, ""))


def fenced(table: Table, attempts: Table | None) -> dict[str, ClauseElement]:
    """The fenced methods' statements compiled once for `table` (the update's or the
    deliveries'): the batch settle (ending each attempt in `attempts`, its history), its busy
    check, the batch reads and renewals of leases, and `owns`."""
    return {
        "settle_many_owned": settle_many_owned(table, attempts),
        "busy_owned": busy_owned(table),
        "owned_leases": owned_leases(table),
        "renewed_leases": renewed_leases(table),
        "owns": claims.owns(table, identity=None, at=bindparam("at", type_=BigInteger), lock=False),
    }
