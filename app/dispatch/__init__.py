"""The workers: claim due updates, forward each attempt downstream, settle it fenced.

`Dispatcher` is the engine (`app.dispatch.dispatcher`); `running_dispatcher` runs one, with an
HTTP transport of its own unless given one, for as long as a `with` block lasts.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx

from app.config import Settings
from app.dispatch.dispatcher import Dispatcher
from app.dispatch.forward import open_transport
from app.metrics import Metrics
from app.store import DurableUpdateStore

__all__ = ["Dispatcher", "open_transport", "running_dispatcher"]


@asynccontextmanager
async def running_dispatcher(
    store: DurableUpdateStore,
    settings: Settings,
    transport: httpx.AsyncBaseTransport | None = None,
    metrics: Metrics | None = None,
) -> AsyncIterator[Dispatcher]:
    """Start the workers for every bot with a downstream; stop them (gracefully) on exit. They
    count into `metrics` (by default, metrics of their own that nothing serves)."""
    bots = [bot for bot in settings.bots if bot.downstream_url is not None]
    own = transport is None
    transport = transport or open_transport(settings.worker_concurrency)
    dispatcher = Dispatcher(store, settings, transport, bots=bots, metrics=metrics)
    try:
        await dispatcher.start()
        try:
            yield dispatcher
        finally:
            await dispatcher.stop()
    finally:
        if own:
            await transport.aclose()
