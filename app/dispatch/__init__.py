"""The workers: claim due updates, forward each attempt downstream, settle it fenced.

`Dispatcher` wires them up (`app.dispatch.dispatcher`): the claim loop (`claims`) starts
each attempt with the attempt runner (`runner`), beside the lease keeper (`leases`), the
database's clock (`clock`) and the upkeep (`maintenance`). `running_dispatcher` runs one,
with an HTTP transport of its own unless given one, for as long as a `with` block lasts.
"""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import httpx

from app.config import Settings
from app.dispatch.dispatcher import Dispatcher
from app.dispatch.forward import open_transport
from app.metrics import Metrics
from app.store import OperatorStore

__all__ = ["Dispatcher", "open_transport", "running_dispatcher"]


@asynccontextmanager
async def running_dispatcher(
    store: OperatorStore,
    settings: Settings,
    transport: httpx.AsyncBaseTransport | None = None,
    metrics: Metrics | None = None,
    *,
    monotonic_ns: Callable[[], int] = time.monotonic_ns,
    jitter: Callable[[], float] = random.random,
) -> AsyncIterator[Dispatcher]:
    """Start the workers for every bot with a downstream; stop them (gracefully) on exit. They
    count into `metrics` (by default, metrics of their own that nothing serves), and read
    time and chance from `monotonic_ns` and `jitter` (see `Dispatcher`)."""
    bots = [bot for bot in settings.bots if bot.downstream_url is not None]
    own = transport is None
    transport = transport or open_transport(settings.worker_concurrency)
    dispatcher = Dispatcher(
        store,
        settings,
        transport,
        bots=bots,
        metrics=metrics,
        monotonic_ns=monotonic_ns,
        jitter=jitter,
    )
    try:
        await dispatcher.start()
        try:
            yield dispatcher
        finally:
            await dispatcher.stop()
    finally:
        if own:
            await transport.aclose()
