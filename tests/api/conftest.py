"""The `/v1` API on a real uvicorn server over fresh storage, with a store of the test's own
to set rows up and read them back.

Claims are made directly with the store at the host clock's now; the API answers by the
database clock, which on this one machine is the same clock.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi import APIRouter, FastAPI
from pydantic import SecretStr

from app.api_keys import ApiKey
from app.bot_settings import BotSettings
from app.config import Settings
from app.main import create_app
from app.store import ClaimIdentity, SqlUpdateStore, StoredUpdate, open_store
from tests.conftest import Storage, serve_asgi

# Keys: full access, each scope alone, and one limited to the bot `shop`. The viewer and
# operator keys have names, which the audit log records; the others by their place (key-1...).
KEY = "full-access.key-0123456789"
CALLBACK_KEY = "callback-only.key-0123456789"
OPERATIONS_KEY = "operations-only.key-0123456789"
SHOP_KEY = "shop-only.key-0123456789"
VIEWER_KEY = "viewer-only.key-0123456789"
VIEWER_NAME = "vera viewer"
OPERATOR_KEY = "operator-only.key-0123456789"
OPERATOR_NAME = "olga@ops"
API_KEYS = (
    ApiKey(key=SecretStr(KEY)),
    ApiKey(key=SecretStr(CALLBACK_KEY), scopes=("callback",)),
    ApiKey(key=SecretStr(OPERATIONS_KEY), scopes=("operations",)),
    ApiKey(key=SecretStr(SHOP_KEY), bots=("shop",)),
    ApiKey(key=SecretStr(VIEWER_KEY), name=VIEWER_NAME, scopes=("viewer",)),
    ApiKey(key=SecretStr(OPERATOR_KEY), name=OPERATOR_NAME, scopes=("operator",)),
)

LEASE_SECONDS = 120  # shop's default renewal
RETRY_BASE_SECONDS = 5  # shop's backoff ceiling for attempt 1
RETRY_AFTER_CAP_SECONDS = 60  # shop's cap on a downstream's retry_after_ms


def _bot(name: str, **options: Any) -> BotSettings:
    return BotSettings(name=name, secret_token=SecretStr(f"{name}-secret"), **options)


BOTS = (
    _bot(
        "shop",
        lease_seconds=LEASE_SECONDS,
        retry_base_seconds=RETRY_BASE_SECONDS,
        retry_after_cap_seconds=RETRY_AFTER_CAP_SECONDS,
    ),
    _bot("news"),  # durable, like shop
    _bot("ledger", mode="fenced"),  # exhaustions are abandoned, not kept
    _bot("legacy", mode="plain"),  # attempts carry no identity
)


# The API's clock is the database's, read through the monotonic clock from an offset taken
# at start-up; on this one machine it agrees with the host clock to within a round trip.
CLOCK_SLACK_MS = 50


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def between(value: int, earliest: int, latest: int) -> bool:
    """Whether `value`, a time by the API's clock, fell in [earliest, latest] by the host's."""
    return earliest - CLOCK_SLACK_MS <= value <= latest + CLOCK_SLACK_MS


def wire(identity: ClaimIdentity, **fields: Any) -> dict[str, Any]:
    """The JSON of an identity, with `fields` added or replaced."""
    return {
        "bot": identity.bot,
        "update_id": identity.update_id,
        "attempt": identity.attempt,
        "claim_id": identity.claim_id,
        **fields,
    }


def update_body(update_id: int) -> str:
    return f'{{"update_id": {update_id}, "message": {{"text": "hello {update_id}"}}}}'


@dataclass
class Api:
    """A served app (`base`) over a database (`url`), the test's own `store` on it, and an HTTP
    client that sends `KEY` unless told another key (or `key=None`: no Authorization)."""

    base: str
    url: str
    store: SqlUpdateStore
    http: httpx.AsyncClient
    app: FastAPI

    async def post(self, path: str, body: Any, *, key: str | None = KEY) -> httpx.Response:
        return await self.http.post(path, json=body, headers=bearer(key))

    async def get(self, path: str, *, key: str | None = KEY, **params: str | int) -> httpx.Response:
        return await self.http.get(path, params=params, headers=bearer(key))

    async def add(self, bot: str, update_id: int, *, received_at: int | None = None) -> None:
        received_at = now_ms() if received_at is None else received_at
        assert await self.store.add(bot, update_id, update_body(update_id), received_at)

    async def claim(
        self,
        bot: str = "shop",
        update_id: int = 1,
        *,
        lease_ms: int = 60_000,
        now: int | None = None,
        received_at: int | None = None,
    ) -> ClaimIdentity:
        """Record the update if it is not yet recorded, and claim it at `now` for `lease_ms`
        (a lease already lapsed when `now` is far enough in the past)."""
        if await self.store.get_update(bot, update_id) is None:
            await self.add(bot, update_id, received_at=received_at)
        now = now_ms() if now is None else now
        identity = await self.store.claim_owned(
            bot,
            update_id,
            now=now,
            lease_until=now + lease_ms,
            max_attempts=8,
            durable_exhaustion=bot != "ledger",
        )
        assert identity is not None, f"{bot}:{update_id} was not claimable at {now}"
        return identity

    async def lapsed_claim(self, bot: str = "shop", update_id: int = 1) -> ClaimIdentity:
        """A claim whose lease ended five seconds ago."""
        return await self.claim(bot, update_id, now=now_ms() - 10_000, lease_ms=5_000)

    async def exhaustion(
        self, bot: str = "shop", update_id: int = 1, error: str = "HTTP 400: bad update"
    ) -> ClaimIdentity:
        identity = await self.claim(bot, update_id)
        assert await self.store.exhaust(identity, now_ms(), error)
        return identity

    async def row(self, bot: str = "shop", update_id: int = 1) -> StoredUpdate:
        row = await self.store.get_update(bot, update_id)
        assert row is not None
        return row


def bearer(key: str | None) -> dict[str, str]:
    """The Authorization header for `key` (none for None)."""
    return {} if key is None else {"authorization": f"Bearer {key}"}


@asynccontextmanager
async def serving(
    url: str, routers: Sequence[APIRouter] = (), **overrides: Any
) -> AsyncIterator[Api]:
    """The app over `url` (bots `BOTS`, keys `API_KEYS` unless overridden), with `routers`
    added, served by uvicorn."""
    options: dict[str, Any] = {"bots": BOTS, "api_keys": API_KEYS, **overrides}
    settings = Settings(database_url=url, **options)
    store = await open_store(url)
    app = create_app(settings)
    for router in routers:
        app.include_router(router)
    try:
        async with (
            serve_asgi(app) as base,
            httpx.AsyncClient(base_url=base, timeout=30) as http,
        ):
            yield Api(base, url, store, http, app)
    finally:
        await store.close()


@pytest.fixture
async def api(storage: Storage) -> AsyncIterator[Api]:
    """The API on each backend in turn."""
    async with serving(storage.url()) as served:
        yield served


@pytest.fixture
async def sqlite_api(sqlite_storage: Storage) -> AsyncIterator[Api]:
    """The API on SQLite alone, for what does not depend on the database (keys, the OpenAPI
    document, request validation before the store)."""
    async with serving(sqlite_storage.url()) as served:
        yield served
