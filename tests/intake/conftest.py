"""A real uvicorn server on an ephemeral port, serving the app over fresh storage."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from app.bot_settings import BotSettings
from app.config import Settings
from app.main import create_app
from tests.conftest import Storage, serve_asgi

SECRET = "s3cret-token_for-tests"
BOTS = (
    BotSettings(name="shop", secret_token=SecretStr(SECRET)),
    BotSettings(name="news", secret_token=SecretStr("another-secret")),
)


@asynccontextmanager
async def serve(settings: Settings, **options: Any) -> AsyncIterator[str]:
    """The service over `settings` under uvicorn on an ephemeral port; yields its base URL."""
    async with serve_asgi(create_app(settings, **options)) as base:
        yield base


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


def commit_waits_within(exposition: str, bot: str) -> dict[float, int]:
    """From a /metrics page: how many of `bot`'s updates had their commit's answer (committed or
    not) within each bucket bound, by the server's own clock from each body's arrival. The
    client's clock would count the time it took to send each body too, and on a loaded machine
    that is seconds."""
    family = "telegram_intake_webhook_commit_wait_seconds"
    return {
        float(sample.labels["le"]): int(sample.value)
        for metrics in text_string_to_metric_families(exposition)
        if metrics.name == family
        for sample in metrics.samples
        if sample.name.endswith("_bucket") and sample.labels["bot"] == bot
    }
