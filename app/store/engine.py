"""Engines for both backends, and the boundary where driver errors become store errors.

SQLite: WAL with `synchronous=FULL` (an acknowledged commit survives a power cut), a busy
timeout, and write transactions that take the write lock up front (`BEGIN IMMEDIATE`), so two
writers never deadlock upgrading read locks. PostgreSQL: psycopg 3, pooled.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, exc
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool

from app.store.errors import UPGRADE_HINT, SchemaError, StoreBusy, StoreError, StoreUnavailable

BUSY_TIMEOUT_MS = 10_000
# Execution option read by the SQLite `begin` hook: reads need no write lock.
SQLITE_BEGIN = "intake_sqlite_begin"


def normalise_url(url: str | URL, *, asynchronous: bool = True) -> URL:
    """Map `sqlite://` and `postgresql://` (and `postgres://`) onto the drivers we ship."""
    if isinstance(url, str) and url.startswith("postgres://"):
        url = "postgresql://" + url.removeprefix("postgres://")
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        driver = "sqlite+aiosqlite" if asynchronous else "sqlite+pysqlite"
    elif backend == "postgresql":
        driver = "postgresql+psycopg"
    else:
        raise ValueError(f"database URL {parsed.render_as_string()!r}: use sqlite or postgresql")
    _, _, named_driver = parsed.drivername.partition("+")
    if named_driver not in ("", "aiosqlite", "pysqlite", "psycopg"):
        raise ValueError(f"database URL driver {named_driver!r}: use psycopg or aiosqlite")
    return parsed.set(drivername=driver)


def _in_memory(url: URL) -> bool:
    database = url.database or ""
    return database in ("", ":memory:") or "mode=memory" in database


def _configure_sqlite(sync_engine: Engine) -> None:
    @event.listens_for(sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Hand transaction control to us: pysqlite's implicit BEGIN is deferred.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        _use_wal(cursor)
        cursor.execute("PRAGMA synchronous = FULL")
        cursor.close()

    @event.listens_for(sync_engine, "begin")
    def _on_begin(connection: Any) -> None:
        mode = connection.get_execution_options().get(SQLITE_BEGIN, "IMMEDIATE")
        if mode not in ("IMMEDIATE", "DEFERRED"):
            raise ValueError(f"SQLite begin mode {mode!r} is not IMMEDIATE or DEFERRED")
        connection.exec_driver_sql(f"BEGIN {mode}")


def _use_wal(cursor: Any) -> None:
    """Switch the file to WAL (it stays so). The switch needs the file to itself and answers
    "database is locked" at once, busy timeout or not, while another process opens the same new
    file: retry it within the busy timeout."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    pause = 0.005
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


def _sqlite_options(url: URL) -> dict[str, Any]:
    if _in_memory(url):
        # One shared connection, or every pooled connection would see its own empty database.
        return {"poolclass": StaticPool, "connect_args": {"check_same_thread": False}}
    database = url.database or ""
    if not database.startswith("file:"):
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    return {"connect_args": {"timeout": BUSY_TIMEOUT_MS / 1000}}


def create_store_engine(url: str | URL, *, pool_size: int = 10) -> AsyncEngine:
    """An async engine for the store on either backend."""
    parsed = normalise_url(url)
    if parsed.get_backend_name() == "sqlite":
        engine = create_async_engine(parsed, **_sqlite_options(parsed))
        _configure_sqlite(engine.sync_engine)
        return engine
    # No pre-ping: it costs a round trip per checkout (a third of a claim). A dropped
    # connection fails one statement, as StoreUnavailable, and invalidates the whole pool.
    # No overflow: under sustained load an overflow connection is opened, used once and
    # closed again on return, a new PostgreSQL backend per statement; waiting for one of
    # the pool's connections is far cheaper.
    # AUTOCOMMIT: almost every store method is one statement, its own transaction, with no
    # BEGIN and COMMIT round trips; setting it per checkout instead (an execution option)
    # cost a fifth of a millisecond a statement. The store opens real transactions through a
    # READ COMMITTED view of this engine (`SqlUpdateStore.engine`).
    return create_async_engine(
        parsed,
        pool_size=pool_size,
        max_overflow=0,
        isolation_level="AUTOCOMMIT",
        connect_args=_postgres_connect_args(parsed),
    )


def _postgres_connect_args(url: URL) -> dict[str, Any]:
    arguments: dict[str, Any] = {"connect_timeout": 5}
    if "application_name" not in url.query:
        arguments["application_name"] = "telegram-intake"
    return arguments


def create_sync_engine(url: str | URL) -> Engine:
    """A synchronous engine with the same SQLite behaviour, for Alembic."""
    parsed = normalise_url(url, asynchronous=False)
    if parsed.get_backend_name() == "sqlite":
        engine = create_engine(parsed, **_sqlite_options(parsed))
        _configure_sqlite(engine)
        return engine
    return create_engine(parsed, connect_args=_postgres_connect_args(parsed))


_SCHEMA_SQLSTATES = {"42P01", "42703", "42883"}  # undefined table, column, function
_SCHEMA_MESSAGES = ("no such table", "no such column", "has no column named")


@contextmanager
def translated_errors(table: str) -> Iterator[None]:
    """Turn driver exceptions into the store's error tree (see `app.store.errors`)."""
    try:
        yield
    except exc.DBAPIError as error:
        raise _translate(error, table) from error
    except exc.TimeoutError as error:  # no pooled connection came free in time
        raise StoreUnavailable(f"database unavailable: {error}") from error
    except (ConnectionError, TimeoutError) as error:
        raise StoreUnavailable(f"database unavailable: {error}") from error


def _translate(error: exc.DBAPIError, table: str) -> StoreError:
    original = error.orig
    message = str(original).strip().splitlines()[0] if original is not None else str(error)
    sqlstate = getattr(original, "sqlstate", None)
    if sqlstate in _SCHEMA_SQLSTATES or any(m in message for m in _SCHEMA_MESSAGES):
        return SchemaError(f"table {table!r} is not as expected ({message}); {UPGRADE_HINT}")
    if "database is locked" in message:
        return StoreBusy(f"SQLite write lock still taken after {BUSY_TIMEOUT_MS} ms: {message}")
    if error.connection_invalidated or isinstance(error, exc.OperationalError | exc.InterfaceError):
        return StoreUnavailable(f"database unavailable: {message}")
    return StoreError(f"database error: {message}")
