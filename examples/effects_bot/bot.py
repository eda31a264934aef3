"""A bot's own service behind telegram-intake: exactly one effect per update.

For every forwarded update it
1. verifies the request with the kit (`read_forwarded`: signature or downstream secret);
2. asks the service whether this attempt still owns the update (`IntakeClient.owns`) and
   writes nothing when it does not: a rival attempt has taken over;
3. records its effect in its own table keyed by `(bot, update_id)`, so a redelivery (delivery
   is at least once) finds the effect there and does not repeat it;
4. replies to the user through the Bot API (`sendMessage`; base URL configurable, so a local
   Bot API server or a test's fake works) and notes the reply, so a redelivery after a lost
   reply sends it again, and one after a sent reply does not.

Run it with `uvicorn examples.effects_bot.bot:app --port 8081` and the `EFFECTS_*` settings
below; point the bot's `downstream_url` at it. `EFFECTS_FAILURE_RATE` makes it fail now and
then on purpose (half before its effect, half after its reply), to watch redelivery at work.
If the bot's own tables live in the service's PostgreSQL, check ownership inside the effect's
transaction instead (`app.store.fencing.owns_in_transaction`): no reclaim can then pass
between the check and the commit.
"""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy import BigInteger, Boolean, Column, Integer, MetaData, Table, Text, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from telegram_intake_kit import CallbackError, IntakeClient, Rejected, read_forwarded
from telegram_intake_kit.forwarded import Forwarded

log = logging.getLogger("effects_bot")

metadata = MetaData()
effects = Table(
    "effects",
    metadata,
    Column("bot", Text, primary_key=True),
    Column("update_id", BigInteger, primary_key=True),
    Column("attempt", Integer, nullable=False),  # the attempt that made the effect
    Column("claim_id", Text, nullable=False),
    Column("chat_id", BigInteger),
    Column("text", Text),
    Column("replied", Boolean, nullable=False, default=False),
)


class EffectsSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="EFFECTS_")

    intake_url: str = "http://127.0.0.1:8080"
    api_key: SecretStr  # an INTAKE_API_KEYS key with the callback scope
    signing_secret: SecretStr | None = None  # the bot's signing_secret
    secret_token: SecretStr | None = None  # or its downstream_secret_token
    database_url: str = "sqlite+aiosqlite:///./effects.db"
    bot_api_url: str = "https://api.telegram.org"
    bot_token: SecretStr = SecretStr("")
    failure_rate: float = 0.0


class Failure(Exception):
    """A failure made on purpose (EFFECTS_FAILURE_RATE)."""


class EffectsBot:
    def __init__(self, settings: EffectsSettings, engine: AsyncEngine) -> None:
        self.settings = settings
        self.engine = engine
        self.intake = IntakeClient(settings.intake_url, settings.api_key.get_secret_value())
        self.bot_api = httpx.AsyncClient(
            base_url=settings.bot_api_url, transport=httpx.AsyncHTTPTransport(retries=2)
        )
        self.refused = 0  # attempts that no longer owned their update: nothing written
        self.failures = 0  # failures made on purpose

    async def handle(self, request: Request) -> JSONResponse:
        try:
            forwarded = read_forwarded(
                request.headers,
                await request.body(),
                signing_secret=_secret(self.settings.signing_secret),
                secret_token=_secret(self.settings.secret_token),
            )
        except Rejected as error:
            return JSONResponse({"error": str(error)}, 401)
        try:
            self._maybe_fail("before the effect")
            answer = await self._handle(forwarded)
            self._maybe_fail("after the reply")
        except Failure as error:
            return JSONResponse({"error": str(error)}, 500)  # the service retries
        except (CallbackError, httpx.HTTPError) as error:
            log.warning("update %s: %s; answering 503", forwarded.update_id, error)
            return JSONResponse({"error": "try again"}, 503)
        return answer

    async def _handle(self, forwarded: Forwarded) -> JSONResponse:
        identity = forwarded.identity
        if identity is None:
            return JSONResponse({"error": "this bot needs mode fenced or durable"}, 400)
        if not (await self.intake.owns(identity)).owned:
            self.refused += 1
            log.info("%s attempt %s: not ours any more", identity.key(), identity.attempt)
            return JSONResponse({"error": "not the owner"}, 409)
        message = forwarded.update.get("message") or {}
        chat_id = (message.get("chat") or {}).get("id")
        text = message.get("text")
        async with self.engine.begin() as connection:
            insert = _insert(connection.dialect.name)
            await connection.execute(
                insert(effects)
                .values(
                    bot=identity.bot,
                    update_id=identity.update_id,
                    attempt=identity.attempt,
                    claim_id=identity.claim_id,
                    chat_id=chat_id,
                    text=text,
                    replied=False,
                )
                .on_conflict_do_nothing()
            )
            row = (
                await connection.execute(
                    select(effects.c.replied).where(
                        effects.c.bot == identity.bot, effects.c.update_id == identity.update_id
                    )
                )
            ).one()
        if not row.replied and chat_id is not None:
            await self._reply(chat_id, f"you said: {text}" if text else "got it")
            async with self.engine.begin() as connection:
                await connection.execute(
                    update(effects)
                    .where(effects.c.bot == identity.bot, effects.c.update_id == identity.update_id)
                    .values(replied=True)
                )
        return JSONResponse({})

    async def _reply(self, chat_id: int, text: str) -> None:
        token = self.settings.bot_token.get_secret_value()
        response = await self.bot_api.post(
            f"/bot{token}/sendMessage", json={"chat_id": chat_id, "text": text}
        )
        response.raise_for_status()

    def _maybe_fail(self, where: str) -> None:
        # Half the failures before the effect, half after the reply.
        if random.random() < self.settings.failure_rate / 2:  # noqa: S311 - not a secret
            self.failures += 1
            raise Failure(f"failed on purpose, {where}")

    async def close(self) -> None:
        await self.intake.aclose()
        await self.bot_api.aclose()


def _secret(value: SecretStr | None) -> str | None:
    return None if value is None else value.get_secret_value()


def _insert(dialect: str) -> Any:
    return postgresql.insert if dialect == "postgresql" else sqlite.insert


def create_app(settings: EffectsSettings | None = None) -> Starlette:
    settings = settings or EffectsSettings()  # the rest from the environment
    # SQLite: writers queue for the one write lock rather than fail at once.
    sqlite_file = settings.database_url.startswith("sqlite")
    engine = create_async_engine(
        settings.database_url, connect_args={"timeout": 30} if sqlite_file else {}
    )
    bot = EffectsBot(settings, engine)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with engine.begin() as connection:
            await connection.run_sync(metadata.create_all)
        app.state.bot = bot
        yield
        await bot.close()
        await engine.dispose()

    return Starlette(routes=[Route("/", bot.handle, methods=["POST"])], lifespan=lifespan)


def __getattr__(name: str) -> Any:
    # `uvicorn examples.effects_bot.bot:app` builds the app from the environment on demand.
    if name == "app":
        return create_app()
    raise AttributeError(name)
