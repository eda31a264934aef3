"""Wake-ups across processes: a PostgreSQL LISTEN connection that calls back on each NOTIFY.

Workers in other processes than the intake learn of new updates from the notification that
every commit adding updates sends (`SqlUpdateStore.add_many` on PostgreSQL). The listener holds
one connection of its own, outside the pool; when it drops, the listener reconnects with
backoff and calls back once, so that a worker looks again for what it might have missed.
SQLite has no notifications: a worker in another process than the intake finds new rows by
polling.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from app.store.engine import normalise_url

if TYPE_CHECKING:
    from app.store.sqlstore import SqlUpdateStore

log = logging.getLogger(__name__)


def _conninfo(store: SqlUpdateStore) -> str:
    url = normalise_url(store.engine.url).set(drivername="postgresql")
    return url.render_as_string(hide_password=False)


async def listen(
    store: SqlUpdateStore,
    wake: Callable[[], None],
    *,
    listening: asyncio.Event | None = None,
    max_pause: float = 5.0,
) -> None:
    """Call `wake` on every notification of `store.wake_channel`, until cancelled. Sets
    `listening` once LISTEN is in place. Returns at once on SQLite."""
    if store.dialect != "postgresql":
        return
    pause = 0.1
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(
                _conninfo(store),
                autocommit=True,
                application_name="telegram-intake listener",
                connect_timeout=5,
                # A connection that died silently is noticed within about a minute.
                keepalives=1,
                keepalives_idle=30,
                keepalives_interval=10,
                keepalives_count=3,
            ) as connection:
                await connection.execute(
                    sql.SQL("LISTEN {}").format(sql.Identifier(store.wake_channel))
                )
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
