"""The servers `python -m bench intake` measures, each in its own process.

    python -m bench.intake_servers intake|ceiling|granian DATABASE_URL
    python -m bench.intake_servers aiogram
    python -m bench.intake_servers bare

- intake: the product's app under uvicorn, one worker, as `telegram-intake serve` runs it,
  tracing included: on when the OTEL_* environment asks (bench intake's traced rows).
- ceiling: the same app and route, with the group committer swapped after start-up for one
  that answers at once and stores nothing: what the server costs without durability.
- granian: the product's app, as `intake` but served by granian (Rust's hyper under the same
  ASGI app, its event loop uvloop): issue 33's "another ASGI server", measured; granian has
  no body deadline, no limit on connections and no keep-alive deadline of its own, so
  `app.http.server`'s limits could not hold under it as they stand.
- bare: one ASGI callable on plain uvicorn (httptools, uvloop, no access log): the bot, the
  secret compared in constant time, the body, `json.loads`, an integer `update_id`; stores
  nothing. What the server itself could answer for the intake's checks: the limit.
- aiogram: aiogram 3's own webhook handler (`SimpleRequestHandler`, background mode) with a
  Dispatcher of one trivial message handler, under aiohttp's `web.AppRunner`, on uvloop (the
  loop uvicorn picks). The bot token is fake and nothing here calls Telegram.

Each serves POST /telegram/bench on 127.0.0.1 (ephemeral port), prints `ready <port>` once it
accepts requests, and stops on SIGTERM.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
import uvloop
from pydantic import SecretStr

from app import tracing
from app.bot_settings import BotSettings
from app.config import Settings
from app.destinations.settings import DestinationSettings
from app.http.front import Service
from app.http.server import server_config
from app.intake.route import Intake
from app.main import create_app
from app.store import NewUpdate

BOT = "bench"
SECRET = "bench-secret_token"  # noqa: S105 - a fixed test secret
HOST = "127.0.0.1"


class AnnouncingServer(uvicorn.Server):
    """uvicorn's server, telling the benchmark its port once the app has started."""

    async def startup(self, sockets: list | None = None) -> None:  # type: ignore[type-arg]
        await super().startup(sockets)
        if self.servers:
            print(f"ready {self.servers[0].sockets[0].getsockname()[1]}", flush=True)


class NullCommitter:
    """Answers every row at once, as if committed; stores nothing."""

    async def submit(self, row: NewUpdate, *, arrival: float | None = None) -> bool:
        return True


# The bot's destinations by server kind (bench/destinations.py): `intake` has none (no
# downstream_url either: what it records is all it does); `four-all`, `default` and three more
# each taking every update; `four-all-unordered`, the same with the three unordered (sinks that
# need no order: their deliveries keep no queue key); `four-disjoint`, four each taking update
# types of their own (the load's messages go to `default` alone, after every filter is run).
FANOUT: dict[str, list[dict[str, object]]] = {
    "four-all": [{"name": name, "url": f"http://{HOST}:9/{name}"} for name in
                 ("payments", "moderation", "analytics")],
    "four-all-unordered": [{"name": name, "url": f"http://{HOST}:9/{name}", "ordered": False}
                           for name in ("payments", "moderation", "analytics")],
    "four-disjoint": [
        {"name": "default", "url": f"http://{HOST}:9/default", "filter": ["message", "edit"]},
        {"name": "payments", "url": f"http://{HOST}:9/p",
         "filter": ["pre_checkout_query", "shipping_query"]},
        {"name": "moderation", "url": f"http://{HOST}:9/m",
         "filter": ["chat_member", "message_reaction"]},
        {"name": "analytics", "url": f"http://{HOST}:9/a",
         "filter": ["callback_query", "inline_query"]},
    ],
}  # fmt: skip


def settings(database_url: str, kind: str = "intake") -> Settings:
    if kind not in FANOUT:
        bot = BotSettings(name=BOT, secret_token=SecretStr(SECRET))
        return Settings(database_url=database_url, bots=(bot,))
    tables = tuple(DestinationSettings.model_validate(table) for table in FANOUT[kind])
    bot = BotSettings(
        name=BOT,
        secret_token=SecretStr(SECRET),
        # `default` is downstream_url, unless a table of its own names it (four-disjoint).
        downstream_url=None if kind == "four-disjoint" else f"http://{HOST}:9/default",  # type: ignore[arg-type]
        destinations=tables,
    )
    return Settings(database_url=database_url, bots=(bot,))


def ceiling_app(configured: Settings) -> Service:
    """The product's app whose intake, once started, hands rows to a NullCommitter."""
    app = create_app(configured)
    product_lifespan = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app: Service) -> AsyncIterator[None]:
        async with product_lifespan(app):
            intake = Intake(configured, NullCommitter())  # type: ignore[arg-type]
            app.state.intake = app.webhook = intake  # the route's way in and the front's
            yield

    app.router.lifespan_context = lifespan
    return app


def serve_uvicorn(kind: str, database_url: str) -> None:
    tracing.start_tracing("serve")  # as `telegram-intake serve`: on when OTEL_* asks
    configured = settings(database_url, kind)
    app = ceiling_app(configured) if kind == "ceiling" else create_app(configured)
    AnnouncingServer(server_config(app, host=HOST, port=0, log_level="warning")).run()


def granian_app() -> Service:
    """granian's factory: the product's app on the database of BENCH_DATABASE_URL."""
    return create_app(settings(os.environ["BENCH_DATABASE_URL"]))


def serve_granian(database_url: str) -> None:
    """granian, one worker, serving `granian_app` on a free port; `ready <port>` once it
    accepts connections; stopped with it on SIGTERM."""
    with socket.socket() as probe:  # granian takes no port 0: a free one, asked for now
        probe.bind((HOST, 0))
        port = probe.getsockname()[1]
    command = (
        sys.executable, "-m", "granian", "--interface", "asgi", "--factory", "--host", HOST,
        "--port", str(port), "--workers", "1", "--loop", "uvloop", "--no-ws",
        "--log-level", "warning", "bench.intake_servers:granian_app",
    )  # fmt: skip
    env = {**os.environ, "BENCH_DATABASE_URL": database_url}
    with subprocess.Popen(command, env=env) as child:  # noqa: S603 - our own command
        signal.signal(signal.SIGTERM, lambda *_: child.terminate())
        deadline = time.monotonic() + 30
        while child.poll() is None and time.monotonic() < deadline:
            try:
                socket.create_connection((HOST, port), timeout=1).close()
            except OSError:
                time.sleep(0.05)
                continue
            print(f"ready {port}", flush=True)
            break
        child.wait()


async def bare_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The intake's checks and nothing else, in one ASGI callable."""
    if scope["type"] != "http":
        if scope["type"] == "lifespan":
            message = await receive()
            await send({"type": message["type"] + ".complete"})
        return
    given = b""
    for name, value in scope["headers"]:
        if name == b"x-telegram-bot-api-secret-token":
            given = value
    expected = BARE_SECRETS.get(scope["path"].removeprefix("/telegram/"))
    status, body = 403, b'{"error":"forbidden"}'
    if hmac.compare_digest(given, expected or b"\0" * 32) and expected is not None:
        chunks = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        try:
            update = json.loads(b"".join(chunks))
        except ValueError:
            update = None
        if isinstance(update, dict) and type(update.get("update_id")) is int:
            status, body = 200, b'{"ok":true}'
        else:
            status, body = 400, b'{"error":"not an update"}'
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


BARE_SECRETS = {BOT: SECRET.encode()}


def serve_bare() -> None:
    config = uvicorn.Config(
        bare_app, host=HOST, port=0, http="httptools", loop="uvloop", log_level="warning",
        access_log=False, proxy_headers=False, lifespan="on",
    )  # fmt: skip
    AnnouncingServer(config).run()


async def serve_aiogram() -> None:
    from aiogram import Bot, Dispatcher
    from aiogram.types import Message
    from aiogram.webhook.aiohttp_server import SimpleRequestHandler, setup_application
    from aiohttp import web

    bot = Bot("42:TEST")
    dispatcher = Dispatcher()

    @dispatcher.message()
    async def on_message(message: Message) -> None:
        return None

    app = web.Application()
    handler = SimpleRequestHandler(dispatcher, bot, handle_in_background=True, secret_token=SECRET)
    handler.register(app, path=f"/telegram/{BOT}")
    setup_application(app, dispatcher, bot=bot)
    await serve_aiohttp(app)


async def serve_aiohttp(app: Any) -> None:
    """Serve an aiohttp application on HOST (ephemeral port): `ready <port>`, then until
    SIGTERM."""
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, HOST, 0)
    await site.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print(f"ready {runner.addresses[0][1]}", flush=True)
    await stop.wait()
    await runner.cleanup()


if __name__ == "__main__":
    if sys.argv[1] == "aiogram":
        uvloop.run(serve_aiogram())
    elif sys.argv[1] == "bare":
        serve_bare()
    elif sys.argv[1] == "granian":
        serve_granian(sys.argv[2])
    else:
        serve_uvicorn(sys.argv[1], sys.argv[2])
