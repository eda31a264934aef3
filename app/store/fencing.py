"""Same-database fencing for a downstream that uses SQLAlchemy (docs/design.md decision 3).

`owns` is the write authority: check it inside the transaction of the domain write, on the
caller's own connection, so no reclaim can pass between the check and the commit.

- PostgreSQL: `telegram_intake_owns(bot, update_id, attempt, claim_id)` (revision 0002) locks
  the row `FOR UPDATE` and compares against the database clock; for a destination other than
  `default`, its five-argument form (revision 0010) locks and compares that delivery's row.
  A rival's `claim_owned` waits for the caller's commit; `claim_next_owned` skips the row
  until then.
- SQLite: one writer at a time. The check is a no-op write of the identity's leased row, so
  the caller's transaction holds the write lock from the check to its commit; a reclaim
  waits. The lease is compared with the clock read once the statement has the lock: time
  spent waiting for it counts against the lease, as in the PostgreSQL function.

    async with engine.begin() as connection:
        if not await owns_in_transaction(connection, identity):
            return  # another attempt owns the update now: write nothing
        await connection.execute(insert(effects).values(...))
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Select, Update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.store import validate
from app.store.backends import postgres_statements, sqlite_statements
from app.store.schema import (
    DEFAULT_TABLE,
    deliveries_table_name,
    make_table,
    owns_function_name,
)
from app.store.types import DEFAULT_DESTINATION, ClaimIdentity


def _statement(dialect: str, identity: ClaimIdentity, table: str) -> Select[Any] | Update:
    validate.table_name(table)
    identity = ClaimIdentity(
        validate.bot_name(identity.bot),
        validate.update_id(identity.update_id),
        validate.attempts("attempt", identity.attempt),
        validate.text("claim_id", identity.claim_id),
        validate.destination_name(identity.destination),
    )
    if dialect == "postgresql":
        return postgres_statements.owns_function(owns_function_name(table), identity)
    if dialect == "sqlite":
        rows = make_table(table)
        if identity.destination != DEFAULT_DESTINATION:  # its delivery's row (revision 0010)
            rows = rows.metadata.tables[deliveries_table_name(table)]
        return sqlite_statements.hold_owned(rows, identity=identity)
    raise ValueError(f"fencing needs PostgreSQL or SQLite, not {dialect}")


def _owned(row: Any, dialect: str) -> bool:
    # SQLite: the clock is read after the statement took the write lock, not before it may
    # have waited for it.
    return (
        postgres_statements.function_says(row)
        if dialect == "postgresql"
        else sqlite_statements.held(row)
    )


async def owns_in_transaction(
    connection: AsyncConnection, identity: ClaimIdentity, *, table: str = DEFAULT_TABLE
) -> bool:
    """Whether `identity` owns its update now; the answer holds until `connection`'s
    transaction ends. Call it first in the transaction of the domain write."""
    dialect = connection.dialect.name
    result = await connection.execute(_statement(dialect, identity, table))
    return _owned(result.first(), dialect)


def owns_in_transaction_sync(
    connection: Connection, identity: ClaimIdentity, *, table: str = DEFAULT_TABLE
) -> bool:
    """`owns_in_transaction` for a synchronous SQLAlchemy connection."""
    dialect = connection.dialect.name
    return _owned(connection.execute(_statement(dialect, identity, table)).first(), dialect)
