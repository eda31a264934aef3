"""A real downstream (the bot's own handler) on an ephemeral port, and dispatchers to feed it.

`FakeDownstream` records every request it gets, in order, with the identity headers; what it
answers is up to the test (`answer`, which may sleep to hang). It serves `/hook` for updates
and `/exhausted` for exhaustion records. A `ManualClock` given to `dispatching` is the
monotonic clock its dispatcher's clock and breakers read: a test moves it, and `looked_again`
waits until the dispatcher has had its chance to act on what it shows, so an absence is
proven, not slept on. (The database clock still syncs with the database at start and every
30 real seconds: a test on a ManualClock should not run longer than that.)
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from pydantic import SecretStr
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app.bot_settings import BotSettings
from app.config import Settings
from app.dispatch import Dispatcher, running_dispatcher
from app.store import SqlUpdateStore, open_store
from tests.conftest import serve_asgi

SECRET = "intake-secret"
DOWNSTREAM_SECRET = "downstream-secret"
SIGNING_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


@dataclass
class Received:
    """One request as the downstream saw it."""

    path: str
    headers: dict[str, str]
    body: bytes
    at: float = field(default_factory=time.monotonic)
    disconnected: bool = False  # the client hung up before the answer

    @property
    def update_id(self) -> int:
        return int(json.loads(self.body)["update_id"])

    @property
    def attempt(self) -> int:
        return int(self.headers["x-intake-attempt"])


Answer = Callable[[Received, Request], Awaitable[Response]]


async def ok(_received: Received, _request: Request) -> Response:
    return Response("{}", media_type="application/json")


def status(code: int, headers: dict[str, str] | None = None) -> Answer:
    async def answer(_received: Received, _request: Request) -> Response:
        return Response(f'{{"status": {code}}}', code, headers, media_type="application/json")

    return answer


def by_attempt(*answers: Answer) -> Answer:
    """Attempt n gets the n-th answer; attempts past the last get the last."""

    async def answer(received: Received, request: Request) -> Response:
        attempt = int(received.headers.get("x-intake-attempt", "1"))
        return await answers[min(attempt, len(answers)) - 1](received, request)

    return answer


async def hang(received: Received, request: Request) -> Response:
    """Never answer (for a minute); notes when the client gives up."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if await request.is_disconnected():
            received.disconnected = True
            break
        await asyncio.sleep(0.02)
    return Response("{}", media_type="application/json")


class FakeDownstream:
    """The bot's handler. Its server runs in another thread: the lists are guarded."""

    def __init__(self) -> None:
        self.answer: Answer = ok
        self.exhaustion_answer: Answer = ok
        self.operations_answer: Answer = ok  # as operations_url
        self._lock = threading.Lock()
        self._received: list[Received] = []
        self.url = ""

    @property
    def received(self) -> list[Received]:
        with self._lock:
            return [r for r in self._received if r.path == "/hook"]

    @property
    def exhaustions(self) -> list[Received]:
        with self._lock:
            return [r for r in self._received if r.path == "/exhausted"]

    @property
    def operations(self) -> list[Received]:
        """The operational events received, every delivery of each."""
        with self._lock:
            return [r for r in self._received if r.path == "/operations"]

    def app(self) -> Starlette:
        async def hook(request: Request) -> Response:
            received = Received(request.url.path, dict(request.headers), await request.body())
            with self._lock:
                self._received.append(received)
            answer = {
                "/hook": self.answer,
                "/exhausted": self.exhaustion_answer,
                "/operations": self.operations_answer,
            }[request.url.path]
            return await answer(received, request)

        routes = [
            Route("/hook", hook, methods=["POST"]),
            Route("/exhausted", hook, methods=["POST"]),
            Route("/operations", hook, methods=["POST"]),
        ]
        return Starlette(routes=routes)


@asynccontextmanager
async def served_downstream() -> AsyncIterator[FakeDownstream]:
    """A `FakeDownstream` under uvicorn; the `downstream` fixture of tests/conftest.py."""
    fake = FakeDownstream()
    async with serve_asgi(fake.app()) as base:
        fake.url = base
        yield fake


def bot(downstream: FakeDownstream, name: str = "shop", **options: Any) -> BotSettings:
    """A bot forwarding to the fake, with short leases and retries for tests."""
    defaults: dict[str, Any] = {
        "downstream_url": f"{downstream.url}/hook",
        "downstream_secret_token": SecretStr(DOWNSTREAM_SECRET),
        "signing_secret": SecretStr(SIGNING_SECRET),
        "lease_seconds": 5,
        "retry_base_seconds": 0.05,
        "retry_cap_seconds": 0.2,
    }
    return BotSettings(name=name, secret_token=SecretStr(SECRET), **{**defaults, **options})


def settings_for(url: str, *bots: BotSettings, **options: Any) -> Settings:
    defaults: dict[str, Any] = {"poll_interval_seconds": 0.2, "shutdown_grace_seconds": 1}
    return Settings(database_url=url, bots=bots, **{**defaults, **options})


class ManualClock:
    """A monotonic clock that stands still until `advance`d (for `Dispatcher(monotonic_ns=)`).
    It starts at zero, so whole steps add up exactly in floating-point seconds."""

    def __init__(self) -> None:
        self._ns = 0

    def monotonic_ns(self) -> int:
        return self._ns

    def advance(self, seconds: float) -> None:
        self._ns += round(seconds * 1_000_000_000)


@asynccontextmanager
async def dispatching(
    settings: Settings, *, clock: ManualClock | None = None
) -> AsyncIterator[tuple[Dispatcher, SqlUpdateStore]]:
    """A dispatcher with a store of its own, as a worker process would have; on `clock` when
    given, the real monotonic clock otherwise."""
    monotonic_ns = time.monotonic_ns if clock is None else clock.monotonic_ns
    store = await open_store(
        settings.database_url,
        table=settings.table,
        pgbouncer=settings.database_pgbouncer,
        listen_url=settings.listen_database_url,
        events=settings.operations_url is not None,
        codec=settings.store_options()["codec"],
    )
    try:
        async with running_dispatcher(store, settings, monotonic_ns=monotonic_ns) as dispatcher:
            yield dispatcher, store
    finally:
        await store.close()


async def looked_again(dispatcher: Dispatcher) -> None:
    """Until `dispatcher` has begun and ended a whole claim pass since the call: whatever it
    could claim now, it has claimed (a pass may already be under way: wait for the next)."""
    passes = dispatcher.claim_passes
    await eventually(lambda: dispatcher.claim_passes >= passes + 2)


async def eventually(check: Callable[[], Any], *, within: float = 15.0) -> Any:
    """Poll `check` (sync or async) until it returns something truthy; fail after `within`."""
    deadline = time.monotonic() + within
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {within} s: {check}")
        await asyncio.sleep(0.02)


def message(update_id: int, chat: int = 42, text: str = "hello") -> str:
    return json.dumps(
        {
            "update_id": update_id,
            "message": {
                "message_id": update_id,
                "date": 0,
                "chat": {"id": chat, "type": "private"},
                "text": text,
            },
        }
    )


def now_ms() -> int:
    return time.time_ns() // 1_000_000
