"""Database URLs and engines for both backends, and the boundary where driver errors become
store errors. How each backend's engine is set up is in its module
(`app.store.backends.sqlite_engine`, `app.store.backends.postgres_engine`).
"""

from __future__ import annotations

import re

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.store.backends import postgres_engine, sqlite_engine


def normalise_url(url: str | URL, *, asynchronous: bool = True) -> URL:
    """Map `sqlite://` and `postgresql://` (and `postgres://`) onto the drivers we ship. A
    PostgreSQL URL may name several hosts, libpq's way (`postgresql://u@h1:5432,h2:5432/db`)
    or SQLAlchemy's (`?host=h1:5432&host=h2:5432`, or `?host=h1,h2&port=5432,5432`)."""
    if isinstance(url, str):
        if url.startswith("postgres://"):
            url = "postgresql://" + url.removeprefix("postgres://")
        url = _hosts_in_query(url)
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


def _hosts_in_query(url: str) -> str:
    """libpq's multi-host URL (`scheme://[user@]h1[:p1],h2[:p2]/db?...`), which SQLAlchemy's
    parser cannot read (it takes `h1:p1,h2` for a host and `p2` for its port), in SQLAlchemy's
    own form: `scheme://[user@]/db?host=h1,h2&port=p1,p2&...`. A host may be an IPv6 address
    in brackets; a host without a port takes libpq's default. Any other URL is left as it is."""
    scheme, separator, rest = url.partition("://")
    if not separator or not scheme.startswith("postgresql"):
        return url
    end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    user, at, hosts = authority.rpartition("@")
    if "," not in hosts:
        return url
    names, ports = [], []
    for entry in hosts.split(","):
        match = _HOST_PORT.fullmatch(entry)
        if match is None or not (match["name"] or match["v6"]):
            raise ValueError(f"database URL: {entry!r} is not a host[:port]")
        names.append(match["v6"] or match["name"])
        ports.append(match["port"] or "")
    path, _, query = tail.partition("?")
    given = [pair.partition("=")[0] for pair in query.split("&") if pair]
    if "host" in given or "port" in given:
        raise ValueError("database URL: hosts both before the path and in its query")
    hosts_query = f"host={','.join(names)}&port={','.join(ports)}"
    query = f"{hosts_query}&{query}" if query else hosts_query
    return f"{scheme}://{user}{at}{path or '/'}?{query}"


# A host name or address, or an IPv6 address in brackets; then an optional port.
_HOST_PORT = re.compile(
    r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[^:\[\]/?#@]*))(?::(?P<port>\d+))?"
)


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
