"""The worked example behind the service: `examples/effects_bot` makes exactly one effect per
update, and sends exactly one reply, while it fails now and then on purpose.

As a user runs them: the service (`telegram-intake run`) and the example bot (uvicorn) are
processes of their own; a fake Bot API in the test records `sendMessage`. Updates go in
through the webhook route, as Telegram sends them.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, select
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from examples.effects_bot.bot import effects
from tests.conftest import Storage, serve_asgi, table_rows
from tests.downstream import SIGNING_SECRET, eventually, message
from tests.processes import ROOT, environment, free_port, processes

# Real processes that measure no time: beside the serial group (tests/conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("untimed")]

API_KEY = "effects-bot-callback-key"
BOT_TOKEN = "123456:test-token"
STARTUP = 30.0


class FakeBotApi:
    """Records every sendMessage; its server runs in another thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sent: list[dict[str, Any]] = []

    @property
    def sent(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._sent)

    def app(self) -> Starlette:
        async def send_message(request: Request) -> JSONResponse:
            if request.path_params["token"] != BOT_TOKEN:
                return JSONResponse({"ok": False, "description": "Unauthorized"}, 401)
            payload = await request.json()
            with self._lock:
                self._sent.append(payload)
            return JSONResponse({"ok": True, "result": {"message_id": len(self._sent)}})

        return Starlette(routes=[Route("/bot{token}/sendMessage", send_message, methods=["POST"])])


async def up(url: str, within: float = STARTUP) -> None:
    async def answers() -> bool:
        try:
            async with httpx.AsyncClient() as client:
                await client.get(url)
        except httpx.TransportError:
            return False
        return True

    await eventually(answers, within=within)


async def test_one_effect_and_one_reply_per_update_over_2000_updates(
    storage: Storage, tmp_path: Path
) -> None:
    # 2,000 on PostgreSQL, where production runs; a shorter run on SQLite, where the bot's own
    # SQLite file makes every effect wait its turn for the one write lock.
    count, chats = (2_000, 100) if storage.backend == "postgresql" else (300, 30)
    url = storage.url()
    # The bot's own database: a file of its own on SQLite, the same schema on PostgreSQL.
    sqlite_file = f"sqlite+aiosqlite:///{tmp_path}/effects.db"
    effects_url = url if storage.backend == "postgresql" else sqlite_file
    service_port, bot_port = free_port(), free_port()
    service_url = f"http://127.0.0.1:{service_port}"
    bot_api = FakeBotApi()
    async with serve_asgi(bot_api.app()) as bot_api_url:
        service_env = environment(
            url,
            f"http://127.0.0.1:{bot_port}/",
            port=service_port,
            signing_secret=SIGNING_SECRET,
            api_keys=API_KEY,
            lease_seconds=10,
            max_attempts=30,  # a 10% failure rate never spends them
            breaker_cooldown_seconds=0.5,  # five failures in a row do happen
        )
        bot_env = {name: value for name, value in os.environ.items()} | {
            "PYTHONPATH": str(ROOT),
            "EFFECTS_INTAKE_URL": service_url,
            "EFFECTS_API_KEY": API_KEY,
            "EFFECTS_SIGNING_SECRET": SIGNING_SECRET,
            "EFFECTS_DATABASE_URL": effects_url,
            "EFFECTS_BOT_API_URL": bot_api_url,
            "EFFECTS_BOT_TOKEN": BOT_TOKEN,
            "EFFECTS_FAILURE_RATE": "0.1",
        }
        with processes(tmp_path) as start:
            start("service", service_env, "run")
            start(
                "effects-bot",
                bot_env,
                "examples.effects_bot.bot:app",
                "--port",
                str(bot_port),
                "--log-level",
                "warning",
                module="uvicorn",
            )
            await up(f"{service_url}/healthz")
            await up(f"http://127.0.0.1:{bot_port}/")
            # A few requests at a time: httpx's pool slows down with thousands waiting on it.
            gate = asyncio.Semaphore(16)
            async with httpx.AsyncClient(timeout=30) as client:
                headers = {
                    "x-telegram-bot-api-secret-token": service_env["INTAKE_SECRET_TOKEN"],
                    "content-type": "application/json",
                }

                async def post(update_id: int) -> None:
                    body = message(update_id, chat=1000 + update_id % chats)
                    # As Telegram does: a request that got no answer is sent again (a kept-alive
                    # connection that the server closed just then, on a busy machine).
                    for _ in range(3):
                        try:
                            async with gate:
                                response = await client.post(
                                    f"{service_url}/telegram/default", content=body, headers=headers
                                )
                            break
                        except httpx.TransportError:
                            await asyncio.sleep(0.2)
                    else:
                        raise AssertionError(f"update {update_id}: no answer in three tries")
                    assert response.status_code == 200, response.text

                await asyncio.gather(*(post(n) for n in range(1, count + 1)))

            def completed() -> bool:
                states = table_rows(url, "state")
                return states.count(("completed",)) == count

            started = time.monotonic()
            await eventually(completed, within=240)
            print(f"{count} updates drained in {time.monotonic() - started:.1f} s")

    attempts = [attempt for (attempt,) in table_rows(url, "attempts")]
    assert sum(attempts) > count * 1.05  # the bot failed now and then: updates came again
    engine = create_engine(effects_url.replace("+aiosqlite", ""))  # psycopg or pysqlite
    try:
        with engine.connect() as connection:
            rows = connection.execute(select(effects.c.update_id, effects.c.replied)).all()
    finally:
        engine.dispose()
    assert sorted(row.update_id for row in rows) == list(range(1, count + 1))
    assert all(row.replied for row in rows)
    expected = Counter(
        (1000 + n % chats, "you said: " + json.loads(message(n))["message"]["text"])
        for n in range(1, count + 1)
    )
    assert Counter((sent["chat_id"], sent["text"]) for sent in bot_api.sent) == expected
