"""`telegram-intake worker`: the workers alone, one of many processes on one PostgreSQL."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

from app.config import Settings
from app.dispatch import running_dispatcher
from app.heap import freeze_after_startup
from app.store import open_store

log = logging.getLogger(__name__)


async def run_worker(settings: Settings) -> None:
    """Dispatch every configured bot's updates until SIGTERM or SIGINT, then stop gracefully:
    in-flight attempts get `shutdown_grace_seconds`, the rest are handed back."""
    store = await open_store(settings.database_url, table=settings.table)
    try:
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for number in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(number, stopping.set)
        async with running_dispatcher(store, settings):
            names = ", ".join(bot.name for bot in settings.bots)
            freeze_after_startup()
            log.info("worker started for bots %s (pid %d)", names, os.getpid())
            await stopping.wait()
            log.info("worker stopping: finishing in-flight attempts")
    finally:
        await store.close()
