"""PostgreSQL's wake-ups: LISTEN on the channel that every commit adding updates notifies, on
a connection of its own, reconnecting with backoff when it drops."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import psycopg
from psycopg import sql as psql
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.backends.postgres_engine import LISTEN_URL, PGBOUNCER, TCP_LIVENESS

log = logging.getLogger(__name__)


async def listen_forever(
    engine: AsyncEngine,
    channel: str,
    wake: Callable[[], None],
    *,
    listening: asyncio.Event | None = None,
    max_pause: float = 5.0,
) -> None:
    """LISTEN on one connection of its own (to the engine's `LISTEN_URL` when it has one);
    when it drops, reconnect with backoff and call `wake` once, so that a worker looks
    again for what it might have missed. Behind PgBouncer without a direct URL there is
    no session to LISTEN on: say so once and return, leaving the workers to poll."""
    options = engine.get_execution_options()
    direct: URL | None = options.get(LISTEN_URL)
    if direct is None and options.get(PGBOUNCER):
        log.warning(
            "wake-ups from other processes are off: LISTEN needs a session, which "
            "PgBouncer in transaction pooling mode does not keep (INTAKE_DATABASE_PGBOUNCER) "
            "and no direct INTAKE_LISTEN_DATABASE_URL is set; idle workers look for new "
            "updates every INTAKE_POLL_INTERVAL_SECONDS instead"
        )
        return
    # The pool's own way from URL to libpq's arguments: several hosts, with
    # target_session_attrs, reach the primary whichever it is now.
    _, arguments = engine.dialect.create_connect_args(direct or engine.url)
    pause = 0.1
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(
                **arguments,
                autocommit=True,
                application_name="telegram-intake listener",
                connect_timeout=5,
                **TCP_LIVENESS,  # a connection that went silent is noticed in 10 to 15 s
            ) as connection:
                await connection.execute(psql.SQL("LISTEN {}").format(psql.Identifier(channel)))
                pause = 0.1
                if listening is not None:
                    listening.set()
                wake()  # whatever arrived while we were not listening
                async for _ in connection.notifies():
                    wake()
        except (psycopg.Error, OSError) as error:
            log.warning(
                "wake-up listener lost its connection (%s); retrying in %.1f s", error, pause
            )
        await asyncio.sleep(pause)
        pause = min(pause * 2, max_pause)
