"""A real uvicorn server on an ephemeral port, serving the app over fresh storage."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import httpx
import pytest
import uvicorn
from pydantic import SecretStr

from app.config import BotSettings, Settings
from app.main import create_app, server_config
from tests.conftest import Storage

SECRET = "s3cret-token_for-tests"
BOTS = (
    BotSettings(name="shop", secret_token=SecretStr(SECRET)),
    BotSettings(name="news", secret_token=SecretStr("another-secret")),
)


@asynccontextmanager
async def serve(settings: Settings) -> AsyncIterator[str]:
    """Run the app under uvicorn on 127.0.0.1:<ephemeral>, in a thread with its own event
    loop (as in production, the test's client does not share the server's loop); yields its
    base URL."""
    config = server_config(create_app(settings), host="127.0.0.1", port=0, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    try:
        async with asyncio.timeout(15):
            while not server.started:
                if not thread.is_alive():
                    raise RuntimeError("uvicorn stopped before it started")
                await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.to_thread(thread.join, 15)


Serve = Callable[..., AbstractAsyncContextManager[tuple[str, str]]]


def intake_on(storage: Storage) -> Serve:
    """`async with intake(**settings) as (base_url, database_url)`: a served intake over
    fresh storage (or the `database_url` given)."""

    @asynccontextmanager
    async def start(**overrides: Any) -> AsyncIterator[tuple[str, str]]:
        url = overrides.pop("database_url", None) or storage.url()
        settings = Settings(database_url=url, bots=BOTS, **overrides)
        async with serve(settings) as base:
            yield base, url

    return start


@pytest.fixture
def intake(storage: Storage) -> Serve:
    """The intake on each backend in turn."""
    return intake_on(storage)


def post(
    client: httpx.AsyncClient,
    base: str,
    body: bytes | str,
    *,
    bot: str = "shop",
    secret: str | None = SECRET,
    **options: Any,
) -> Any:
    headers = {"content-type": "application/json", **options.pop("headers", {})}
    if secret is not None:
        headers["x-telegram-bot-api-secret-token"] = secret
    content = body.encode() if isinstance(body, str) else body
    return client.post(f"{base}/telegram/{bot}", content=content, headers=headers, **options)
