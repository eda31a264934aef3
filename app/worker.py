"""`telegram-intake worker`: the workers alone, one of many processes on one PostgreSQL.

With INTAKE_WORKER_PORT set it also serves /healthz, /readyz and /metrics (`app.api.health`) on
INTAKE_HOST, so an orchestrator can probe it and Prometheus can scrape its attempt counts,
which only a worker process has.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator

import uvicorn
from fastapi import FastAPI

from app import __version__, api
from app.api import Services, health
from app.config import Settings
from app.dispatch import Dispatcher, running_dispatcher
from app.heap import freeze_after_startup
from app.http.connection_limits import ConnectionLimits
from app.http.guard import install_guard
from app.http.server import server_config
from app.metrics import Metrics
from app.store import OperatorStore, open_store_waiting

log = logging.getLogger(__name__)


async def run_worker(settings: Settings) -> None:
    """Dispatch every configured bot's updates until SIGTERM or SIGINT, then stop gracefully:
    in-flight attempts get `shutdown_grace_seconds`, the rest are handed back."""
    store = await open_store_waiting(
        settings.database_url, wait=settings.database_wait_seconds, **settings.store_options()
    )
    metrics = Metrics.of(settings)
    try:
        settings.check_schema(store)
        await store.check_key_ring(at=time.time_ns() // 1_000_000)
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for number in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(number, stopping.set)
        async with (
            running_dispatcher(store, settings, metrics=metrics) as dispatcher,
            _serving(settings, store, dispatcher, metrics),
        ):
            names = ", ".join(bot.name for bot in settings.bots)
            freeze_after_startup()
            log.info("worker started for bots %s (pid %d)", names, os.getpid())
            await stopping.wait()
            log.info("worker stopping: finishing in-flight attempts")
    finally:
        await store.close()


def health_app(
    settings: Settings, store: OperatorStore, dispatcher: Dispatcher, metrics: Metrics
) -> FastAPI:
    """/healthz, /readyz and /metrics of a worker process."""
    app = FastAPI(
        title="telegram-intake worker",
        version=__version__,
        openapi_url=None,  # health and metrics only: nothing to document, nothing open
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.store = store
    app.state.metrics = metrics
    app.state.dispatcher = dispatcher  # /healthz reports its loops
    install_guard(app, settings, metrics.request_refused)

    async def wake() -> None:
        dispatcher.wake()

    app.state.services = Services(settings, store, dispatcher.clock.now, wake)
    app.include_router(health.router)
    api.install_errors(app)
    return app


class _Server(uvicorn.Server):
    """uvicorn inside the worker's loop: the worker owns SIGTERM and SIGINT, not uvicorn."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.asynccontextmanager
async def _serving(
    settings: Settings, store: OperatorStore, dispatcher: Dispatcher, metrics: Metrics
) -> AsyncIterator[None]:
    if settings.worker_port is None:
        yield
        return
    metrics.database.watch(store, dispatcher.clock.now)
    metrics.storage(store.storage)
    store.storage.use_clock(dispatcher.clock.now)
    app = health_app(settings, store, dispatcher, metrics)
    limits = ConnectionLimits.of(settings, metrics.connection_closed)
    server = _Server(
        server_config(app, host=settings.host, port=settings.worker_port, limits=limits)
    )
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if serving.done():
                serving.result()  # raises why it could not start
                raise RuntimeError(f"worker port {settings.worker_port}: could not listen")
            await asyncio.sleep(0.01)
        yield
    finally:
        server.should_exit = True
        await serving
        await metrics.database.unwatch()
