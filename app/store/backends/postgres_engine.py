"""PostgreSQL's engine: psycopg's connection arguments, the pool, the role's timeouts, the
options that tell a transaction pooler or a direct URL for LISTEN, and a server that answers
"read-only" taken for a lost one."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import (
    event,
)
from sqlalchemy.engine import URL, ExceptionContext
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

log = logging.getLogger(__name__)

PGBOUNCER = "intake_pgbouncer"  # execution option: the engine's URL is a transaction pooler


LISTEN_URL = "intake_listen_url"  # execution option: a direct URL for LISTEN, or None
READ_ONLY_TRANSACTION = "25006"  # SQLSTATE read_only_sql_transaction

# A connection whose server went silent (a partition, a machine gone without a word) fails
# rather than waits for the kernel's own give-up, a quarter of an hour: data it sent and
# nobody acknowledged fails it after 10 s (tcp_user_timeout), and an idle one, or one waiting
# for an answer, is probed after 10 s of silence and fails at the next probe, 5 s later,
# with the first unanswered (tcp_user_timeout again). The pool then reconnects, to the
# primary of the moment; a lease never waits on it (the lease keeper stops an attempt by its
# own clock). libpq's options, kept on the client: PgBouncer never sees them.
TCP_LIVENESS: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 2,
    "tcp_user_timeout": 10_000,
}


def connect_args(
    url: URL,
    *,
    statement_timeout_ms: int = 0,
    lock_timeout_ms: int = 0,
    pgbouncer: bool = False,
    no_jit: bool = False,
) -> dict[str, Any]:
    """psycopg's connection arguments. Nonzero timeouts become the session's
    `statement_timeout` and `lock_timeout`, added to any `options` the URL carries: no
    statement waits forever, for a lock or for anything else. `no_jit` (the service's own
    sessions) turns JIT off. With `pgbouncer`, none is sent and no statement is prepared (see
    the module docstring); a connection that sends none (a migration's) passes a pooler
    whether it is told of it or not."""
    arguments: dict[str, Any] = {"connect_timeout": 5, **TCP_LIVENESS}
    if "application_name" not in url.query:
        arguments["application_name"] = "telegram-intake"
    given = url.query.get("options", "")
    options = [given] if isinstance(given, str) else list(given)
    if pgbouncer:
        arguments["prepare_threshold"] = None
    else:
        if no_jit:
            # JIT compiles a plan's expressions at each execution: a claim whose estimate
            # crossed jit_above_cost (a backlog's) spent 66 ms compiling to run in 20.
            options.append("-c jit=off")
        if statement_timeout_ms:
            options.append(f"-c statement_timeout={int(statement_timeout_ms)}")
        if lock_timeout_ms:
            options.append(f"-c lock_timeout={int(lock_timeout_ms)}")
    if any(options):
        arguments["options"] = " ".join(option for option in options if option)
    return arguments


def async_engine(
    url: URL,
    *,
    pool_size: int,
    statement_timeout_ms: int = 0,
    lock_timeout_ms: int = 0,
    pgbouncer: bool = False,
    listen_url: URL | None = None,
) -> AsyncEngine:
    # No pre-ping: it costs a round trip per checkout (a third of a claim). A dropped
    # connection fails one statement, as StoreUnavailable, and invalidates the whole pool.
    # No overflow: under sustained load an overflow connection is opened, used once and
    # closed again on return, a new PostgreSQL backend per statement; waiting for one of
    # the pool's connections is far cheaper.
    # AUTOCOMMIT: setting it per checkout instead (an execution option) cost a fifth of a
    # millisecond a statement.
    engine = create_async_engine(
        url,
        pool_size=pool_size,
        max_overflow=0,
        isolation_level="AUTOCOMMIT",
        hide_parameters=True,  # an error's text names no body (docs/privacy.md)
        connect_args=connect_args(
            url,
            statement_timeout_ms=statement_timeout_ms,
            lock_timeout_ms=lock_timeout_ms,
            pgbouncer=pgbouncer,
            no_jit=True,
        ),
        execution_options={PGBOUNCER: pgbouncer, LISTEN_URL: listen_url},
    )
    if pgbouncer:
        _check_role_timeouts(
            engine, statement_timeout=statement_timeout_ms, lock_timeout=lock_timeout_ms
        )
    event.listen(engine.sync_engine, "handle_error", _read_only_is_lost)
    return engine


def _read_only_is_lost(context: ExceptionContext) -> None:
    """A server that answers "read-only" is a standby now (a failover demoted the primary this
    connection reached): as SQLAlchemy treats a dropped connection, it is discarded and every
    connection the pool made before now is replaced at its next checkout, which finds the new
    primary (`target_session_attrs=read-write`). The store calls it unavailable, so callers
    retry rather than taking it for a fault of their data. `postgres_execution.direct` does
    the same for the statements psycopg runs itself."""
    if answered_read_only(context.original_exception):
        context.is_disconnect = True


def answered_read_only(error: BaseException) -> bool:
    """The server refused a write as read-only: a standby now, or a demoted primary."""
    return getattr(error, "sqlstate", None) == READ_ONLY_TRANSACTION


# The server's own timeouts of a session, in ms (pg_settings gives these two in ms).
SESSION_TIMEOUTS = (
    "SELECT name, setting FROM pg_settings WHERE name IN ('statement_timeout', 'lock_timeout')"
)


def _check_role_timeouts(engine: AsyncEngine, **wanted: int) -> None:
    """Behind PgBouncer the timeouts cannot travel with the connection: they are the role's
    (or the database's) on the server. At the first connection, say once when the server's
    differ from the configured ones, and how to set them."""

    def check(dbapi_connection: Any, _record: Any) -> None:
        try:
            cursor = dbapi_connection.cursor()
            cursor.execute(SESSION_TIMEOUTS)
            server = {name: int(setting) for name, setting in cursor.fetchall()}
            cursor.close()
        except Exception as error:  # a check only: the connection itself is good
            log.warning("could not read the server's timeouts behind PgBouncer: %s", error)
            return
        differ = {name: ms for name, ms in wanted.items() if server.get(name) != ms}
        if differ:
            log.warning(
                "behind PgBouncer (INTAKE_DATABASE_PGBOUNCER) the service cannot set its "
                "timeouts per connection, and the server's differ (%s); set them for the "
                "service's role on the server (ALTER ROLE ... SET name = value): %s",
                ", ".join(f"{name} {server.get(name)} ms" for name in differ),
                ", ".join(f"{name} = {ms}" for name, ms in differ.items()),
            )

    event.listen(engine.sync_engine, "connect", check, once=True)
