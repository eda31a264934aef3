"""The application: an app factory whose lifespan opens the store and starts the intake
(and, for `telegram-intake run`, the workers)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager

import httpx
from starlette.types import ASGIApp

from app import __version__, api, console, tracing
from app.api import Services, health
from app.api.leases import LeaseChecks, LeaseRenewals
from app.config import Settings
from app.dispatch import Dispatcher, running_dispatcher
from app.dispatch.clock import DatabaseClock
from app.heap import freeze_after_startup
from app.http.front import Service
from app.http.guard import install_guard
from app.intake.committer import GroupCommitter
from app.intake.route import Intake
from app.intake.route import router as intake_router
from app.metrics import Metrics
from app.samples import flush_forever
from app.store import open_store_waiting


def create_app(
    settings: Settings | None = None,
    *,
    workers: bool = False,
    transport: httpx.AsyncBaseTransport | None = None,
    mounts: Mapping[str, ASGIApp] | None = None,
    metrics: Metrics | None = None,
    stopping: Callable[[], bool] = lambda: False,
) -> Service:
    """Assemble the service: the intake, and with `workers` the dispatcher in this process
    (`telegram-intake run`). The store opens when the app starts and closes when it stops;
    at start it waits for an unavailable database until `stopping()` (the server was asked
    to stop) or `database_wait_seconds`."""
    settings = settings or Settings()
    metrics = metrics or Metrics.of(settings)

    @asynccontextmanager
    async def lifespan(app: Service) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            if tracing.tracer() is not None:  # last out: the spans of everything stopping
                stack.push_async_callback(asyncio.to_thread, tracing.flush_tracing)
            store = await open_store_waiting(
                settings.database_url,
                wait=settings.database_wait_seconds,
                stopping=stopping,
                **settings.store_options(),
            )
            stack.push_async_callback(store.close)
            settings.check_schema(store)
            await store.check_key_ring(at=time.time_ns() // 1_000_000)
            dispatcher: Dispatcher | None = None
            if workers:
                dispatcher = await stack.enter_async_context(
                    running_dispatcher(store, settings, transport, metrics)
                )
                clock = dispatcher.clock
            else:
                clock = DatabaseClock(store)
                await clock.sync()
                resync = asyncio.create_task(clock.run())
                stack.callback(resync.cancel)
                metrics.clock_offset(clock.host_offset_seconds)  # the dispatcher's does it too
                # The intake's counts for the console's charts (the dispatcher's flush does it
                # where workers run): flushed once more as it stops, before the store closes.
                samples = asyncio.create_task(
                    flush_forever(store, metrics.tally, clock.now, backlog=False)
                )
                stack.push_async_callback(_stopped, samples)

            committer = GroupCommitter(
                store,
                max_batch=settings.commit_batch_max,
                max_wait=settings.commit_wait_ms / 1000,
                timeout=settings.commit_timeout_ms / 1000,
                max_pending_bytes=settings.commit_pending_max_bytes,
                # Workers in other processes hear of new rows from the commit itself.
                on_added=None if dispatcher is None else dispatcher.wake,
            )
            await committer.start()
            stack.push_async_callback(committer.stop)
            app.state.store = store
            app.state.dispatcher = dispatcher
            app.state.intake = Intake(settings, committer, clock.now, metrics)
            # The webhook's requests go straight to the intake while it runs (app.http.front).
            app.webhook = app.state.intake
            stack.callback(setattr, app, "webhook", None)
            metrics.database.watch(store, clock.now)
            metrics.storage(store.storage)
            store.storage.use_clock(clock.now)
            stack.push_async_callback(metrics.database.unwatch)

            async def wake() -> None:
                if dispatcher is not None:
                    dispatcher.wake()
                await store.announce()  # workers in other processes

            leases, renewals = LeaseChecks(store, clock.now), LeaseRenewals(store, clock.now)
            for batcher in (leases, renewals):
                await batcher.start()
                stack.push_async_callback(batcher.stop)
            app.state.services = Services(settings, store, clock.now, wake, leases, renewals)
            freeze_after_startup()
            yield

    app = Service(
        title="telegram-intake",
        version=__version__,
        lifespan=lifespan,
        description="Durable webhook intake for Telegram bots: `POST /telegram/{bot}` records "
        "each update before its 200; workers forward it downstream under a fenced claim; the "
        "`/v1` API lets the downstream check and settle its claim, and operators follow it.",
        # Only /telegram/{bot}, /healthz and /readyz answer without a key: the OpenAPI
        # document is served behind one (`api.install`), and there is no docs page.
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        # No redirect from /path/ to /path: it would answer before any check, with a Location
        # built from the client's own Host header.
        redirect_slashes=False,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.include_router(intake_router)
    app.include_router(health.router)
    api.install(app)
    opened = (*(mounts or ()), console.PREFIX)
    install_guard(app, settings, metrics.request_refused, mounted=opened, lean=api.lean())
    # After the guard: the console's security headers wrap it, its refusals under /console too.
    console.install(app, settings)
    for path, mounted in (mounts or {}).items():
        app.mount(path, mounted)

    return app


async def _stopped(task: asyncio.Task[None]) -> None:
    """Cancel `task` and wait for it to end (what it does as it ends included)."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
