"""The store over SQLAlchemy Core, written once for SQLite and PostgreSQL.

Statements come from `app.store.queries`; the store checks arguments, runs each statement in
the right kind of transaction and maps rows to the types of `app.store.types`. What the two
databases do differently (connections and their queues, the batch statements, the clock,
wake-ups) is each one's `Backend`: `app.store.sqlite`, `app.store.postgres`.

One module per capability level, each class adding its level's methods to the one below:
`core` (schema, checks, transactions) <- `base` <- `fenced` <- `durable` <- `control`
(operator control, revision 0004) <- `events` <- `polling` <- `sessions` (the console's, 0005).
"""

from __future__ import annotations

from app.store import validate
from app.store.engine import create_store_engine
from app.store.schema import DEFAULT_TABLE
from app.store.sqlstore.core import read_capability, read_revision
from app.store.sqlstore.sessions import SessionMethods

__all__ = ["SqlUpdateStore", "open_store", "read_capability"]


class SqlUpdateStore(SessionMethods):
    """A durable store on SQLite or PostgreSQL; `capability` follows the live schema."""


async def open_store(
    url: str,
    *,
    table: str = DEFAULT_TABLE,
    pool_size: int = 10,
    statement_timeout_ms: int = 0,
    lock_timeout_ms: int = 0,
    pgbouncer: bool = False,
    listen_url: str | None = None,
    history: bool = True,
    worker: str | None = None,
    events: bool = False,
) -> SqlUpdateStore:
    """Open a store on a migrated database; `capability` is read from the live schema. On
    PostgreSQL, nonzero timeouts bound every statement of its connections (a statement past
    either raises StoreUnavailable). `pgbouncer`: `url` is PgBouncer in transaction pooling
    mode; `listen_url`: a direct URL for the wake-ups' LISTEN (see `app.store.postgres`)."""
    validate.table_name(table)
    engine = create_store_engine(
        url,
        pool_size=pool_size,
        statement_timeout_ms=statement_timeout_ms,
        lock_timeout_ms=lock_timeout_ms,
        pgbouncer=pgbouncer,
        listen_url=listen_url,
    )
    try:
        revision = await read_revision(engine, table)
    except BaseException:
        await engine.dispose()
        raise
    return SqlUpdateStore(engine, table, revision, history=history, worker=worker, events=events)
