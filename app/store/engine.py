"""Database URLs and engines for both backends, and the boundary where driver errors become
store errors. How each backend's engine is set up is in its module
(`app.store.backends.sqlite_engine`, `app.store.backends.postgres_engine`).
"""

from __future__ import annotations

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.store.backends import postgres_engine, sqlite_engine


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


def create_store_engine(
    url: str | URL,
    *,
    pool_size: int = 10,
    statement_timeout_ms: int = 0,
    lock_timeout_ms: int = 0,
    pgbouncer: bool = False,
    listen_url: str | URL | None = None,
) -> AsyncEngine:
    """An async engine for the store on either backend. The timeouts (0: none) apply to
    PostgreSQL; SQLite, a local file, waits only for its write lock, up to its busy timeout.
    `pgbouncer`: the PostgreSQL URL is PgBouncer in transaction pooling mode; `listen_url`:
    a direct URL to the same database, for LISTEN only (see `app.store.backends.postgres`)."""
    parsed = normalise_url(url)
    if parsed.get_backend_name() == "sqlite":
        engine = create_async_engine(parsed, **sqlite_engine.engine_options(parsed))
        sqlite_engine.configure(engine.sync_engine)
        return engine
    return postgres_engine.async_engine(
        parsed,
        pool_size=pool_size,
        statement_timeout_ms=statement_timeout_ms,
        lock_timeout_ms=lock_timeout_ms,
        pgbouncer=pgbouncer,
        listen_url=None if listen_url is None else normalise_url(listen_url),
    )


def create_sync_engine(url: str | URL) -> Engine:
    """A synchronous engine with the same SQLite behaviour, for Alembic."""
    parsed = normalise_url(url, asynchronous=False)
    if parsed.get_backend_name() == "sqlite":
        engine = create_engine(parsed, **sqlite_engine.engine_options(parsed))
        sqlite_engine.configure(engine)
        return engine
    # Migrations and one-off reads gain nothing from prepared statements, and behind PgBouncer
    # a prepared statement would outlive its transaction: none are prepared.
    arguments = postgres_engine.connect_args(parsed) | {"prepare_threshold": None}
    return create_engine(parsed, connect_args=arguments)
