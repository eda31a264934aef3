"""`telegram_intake_kit.aiogram.IntakeRequestHandler` with real aiogram 3: an aiohttp app on an
ephemeral port (in the test's loop), httpx as the service, and the fake Bot API (served by
uvicorn) for the handlers' calls. In process, so each check takes a fraction of a second; the
end-to-end run behind a real service is tests/kit/test_frameworks.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from aiogram import Bot, Dispatcher, Router
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiogram.filters import ExceptionTypeFilter
from aiogram.methods import SendMessage
from aiogram.types import ErrorEvent, Message
from aiohttp import web

from telegram_intake_kit import IntakeAttempt, Terminal, current_attempt
from telegram_intake_kit.aiogram import IntakeRequestHandler, _see_terminal
from tests.kit.conftest import CHAT, BotApi, message_update
from tests.kit.test_adapter import (
    API_KEY,
    RECEIVED_AT,
    SECRET_TOKEN,
    SIGNING_SECRET,
    CallbackApi,
    identity_of,
    request_for,
    serving_aiohttp,
    until,
)

PATH = "/webhook"


def make_bot(bot_api: BotApi) -> Bot:
    session = AiohttpSession(api=TelegramAPIServer.from_base(bot_api.url))
    return Bot(bot_api.fake.token, session=session)


@dataclass
class Served:
    client: httpx.AsyncClient
    bot: Bot
    handler: IntakeRequestHandler

    async def post(
        self, update: dict[str, Any], *, plain: bool = False, attempt: int = 1
    ) -> httpx.Response:
        headers, body = request_for(update, plain=plain, attempt=attempt)
        return await self.client.post(PATH, content=body, headers=headers)


@asynccontextmanager
async def served(dispatcher: Dispatcher, bot_api: BotApi, **options: Any) -> AsyncIterator[Served]:
    """The dispatcher behind an IntakeRequestHandler at PATH; the aiohttp app shuts down
    (closing the bot's session) when the block ends."""
    bot = make_bot(bot_api)
    handler = IntakeRequestHandler(
        dispatcher, bot, secret_token=SECRET_TOKEN, signing_secret=SIGNING_SECRET, **options
    )
    app = web.Application()
    handler.register(app, path=PATH)
    async with serving_aiohttp(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        yield Served(client, bot, handler)


def sent_texts(bot_api: BotApi) -> list[tuple[int, str]]:
    return [(call["chat_id"], call["text"]) for call in bot_api.fake.sent()]


async def test_the_handler_receives_the_attempt_as_intake(bot_api: BotApi) -> None:
    dispatcher = Dispatcher()
    seen: dict[str, IntakeAttempt | None] = {}

    @dispatcher.message()
    async def on_message(message: Message, intake: IntakeAttempt | None) -> None:
        seen["intake"], seen["current"] = intake, current_attempt()
        assert intake is not None
        await message.answer(f"attempt {intake.identity.attempt}")

    async with served(dispatcher, bot_api) as bot:
        answer = await bot.post(message_update(31), attempt=2)
    assert answer.status_code == 200, answer.text
    intake = seen["intake"]
    assert intake is not None
    assert intake.identity == identity_of(31, attempt=2)
    assert intake.fence_token is not None
    assert intake.fence_token.received_at == RECEIVED_AT
    assert seen["current"] is intake
    assert sent_texts(bot_api) == [(CHAT, "attempt 2")]


async def test_a_plain_request_gives_intake_none_even_without_a_default(
    bot_api: BotApi,
) -> None:
    dispatcher = Dispatcher()
    seen: list[IntakeAttempt | None] = []

    @dispatcher.message()
    async def on_message(message: Message, intake: IntakeAttempt | None) -> None:
        seen.append(intake)

    async with served(dispatcher, bot_api) as bot:
        answer = await bot.post(message_update(32), plain=True)
    assert answer.status_code == 200, answer.text
    assert seen == [None]


async def test_a_raising_handler_is_500(bot_api: BotApi) -> None:
    dispatcher = Dispatcher()

    @dispatcher.message()
    async def on_message(message: Message) -> None:
        raise RuntimeError("boom")

    async with served(dispatcher, bot_api) as bot:
        answer = await bot.post(message_update(33))
    assert (answer.status_code, answer.json()) == (500, {"error": "RuntimeError: boom"})


@pytest.mark.parametrize(
    ("error", "status"), [(RuntimeError("handled"), 200), (ValueError("not mine"), 500)]
)
async def test_an_error_an_errors_handler_handles_is_200(
    bot_api: BotApi, error: Exception, status: int
) -> None:
    dispatcher = Dispatcher()
    handled: list[BaseException] = []

    @dispatcher.message()
    async def on_message(message: Message) -> None:
        raise error

    @dispatcher.errors(ExceptionTypeFilter(RuntimeError))
    async def on_error(event: ErrorEvent) -> None:
        handled.append(event.exception)

    async with served(dispatcher, bot_api) as bot:
        answer = await bot.post(message_update(34))
    assert answer.status_code == status, answer.text
    assert handled == ([error] if status == 200 else [])


async def test_terminal_is_422_even_with_a_catch_all_errors_handler(bot_api: BotApi) -> None:
    dispatcher, router = Dispatcher(), Router()
    dispatcher.include_router(router)
    told: list[BaseException] = []

    @router.message()
    async def on_message(message: Message) -> None:
        raise Terminal("never")

    @dispatcher.errors()
    async def on_any_error(event: ErrorEvent) -> bool:
        told.append(event.exception)
        return True

    async with served(dispatcher, bot_api) as bot:
        answer = await bot.post(message_update(35))
    assert (answer.status_code, answer.json()) == (422, {"error": "Terminal: never"})
    assert [type(error) for error in told] == [Terminal]  # the bot's errors handler still ran


async def test_a_returned_method_is_executed(bot_api: BotApi) -> None:
    dispatcher = Dispatcher()

    @dispatcher.message()
    async def on_message(message: Message) -> SendMessage:
        return message.answer("x")

    async with served(dispatcher, bot_api) as bot:
        answer = await bot.post(message_update(36))
    assert answer.status_code == 200, answer.text
    assert answer.json() == {}  # no webhook reply in the body: nobody would execute it
    assert sent_texts(bot_api) == [(CHAT, "x")]


async def test_a_returned_method_the_bot_api_refuses_is_500(bot_api: BotApi) -> None:
    dispatcher = Dispatcher()

    @dispatcher.message()
    async def on_message(message: Message) -> Any:
        return message.answer_dice()  # the fake Bot API has no sendDice: 404

    async with served(dispatcher, bot_api) as bot:
        answer = await bot.post(message_update(37))
    assert answer.status_code == 500, answer.text
    assert answer.json()["error"].startswith("TelegramNotFound")
    assert bot_api.fake.called("sendDice") == 1


async def test_an_update_aiograms_types_refuse_is_422(bot_api: BotApi) -> None:
    dispatcher = Dispatcher()
    ran: list[Message] = []

    @dispatcher.message()
    async def on_message(message: Message) -> None:
        ran.append(message)

    refused = {"update_id": 38, "message": {"message_id": 1, "text": "no date, no chat"}}
    async with served(dispatcher, bot_api) as bot:
        answer = await bot.post(refused)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"].startswith("Terminal: aiogram cannot read this update")
    assert ran == []


async def test_two_handlers_on_one_dispatcher_register_the_middleware_once(
    bot_api: BotApi,
) -> None:
    dispatcher = Dispatcher()
    before = list(dispatcher.update.outer_middleware)

    @dispatcher.message()
    async def on_message(message: Message) -> None:
        raise Terminal("never")

    @dispatcher.errors()
    async def on_any_error(event: ErrorEvent) -> None:
        return None

    bot = make_bot(bot_api)
    app = web.Application()
    for path in ("/one", "/two"):
        IntakeRequestHandler(dispatcher, bot, secret_token=SECRET_TOKEN).register(app, path=path)
    middlewares = list(dispatcher.update.outer_middleware)
    assert middlewares == [*before, _see_terminal]

    async with serving_aiohttp(app) as url, httpx.AsyncClient(base_url=url) as client:
        for path in ("/one", "/two"):
            headers, body = request_for(message_update(39))
            answer = await client.post(path, content=body, headers=headers)
            assert answer.status_code == 422, answer.text


async def test_the_answer_comes_only_after_a_slow_handler(bot_api: BotApi) -> None:
    dispatcher = Dispatcher()
    effects: list[float] = []

    @dispatcher.message()
    async def on_message(message: Message) -> None:
        await asyncio.sleep(0.3)
        await message.answer("done")
        effects.append(time.monotonic())

    async with served(dispatcher, bot_api) as bot:
        started = time.monotonic()
        answer = await bot.post(message_update(40))
        answered = time.monotonic()
    assert answer.status_code == 200, answer.text
    assert answered - started >= 0.3
    assert effects, "the handler had ended before the answer"
    assert effects[0] <= answered
    assert sent_texts(bot_api) == [(CHAT, "done")]


async def test_shutdown_closes_the_bot_session_and_the_callback_client(bot_api: BotApi) -> None:
    dispatcher = Dispatcher()

    @dispatcher.message()
    async def on_message(message: Message) -> None:
        await message.answer("opened the session")

    options = {"intake_url": "http://127.0.0.1:9", "api_key": API_KEY}
    async with served(dispatcher, bot_api, **options) as bot:
        answer = await bot.post(message_update(41))
        assert answer.status_code == 200, answer.text
        session = bot.bot.session
        assert isinstance(session, AiohttpSession)
        assert session._session is not None
        assert not session._session.closed
        client = bot.handler.intake.client
        assert client is not None
    assert session._session.closed
    assert client._http.is_closed


@pytest.mark.parametrize(
    ("error", "outcome"), [(None, "completed"), (Terminal("never"), "exhausted")]
)
async def test_a_slow_handler_is_deferred_and_settled(
    bot_api: BotApi, error: Exception | None, outcome: str
) -> None:
    dispatcher = Dispatcher()

    @dispatcher.message()
    async def on_message(message: Message) -> None:
        await asyncio.sleep(0.3)
        await message.answer("late")
        if error is not None:
            raise error

    @dispatcher.errors()
    async def on_any_error(event: ErrorEvent) -> None:
        return None

    callback_api = CallbackApi()
    async with serving_aiohttp(callback_api.app()) as intake_url:
        options = {"intake_url": intake_url, "api_key": API_KEY, "defer_after": 0.1}
        async with served(dispatcher, bot_api, **options) as bot:
            answer = await bot.post(message_update(42))
            assert (answer.status_code, answer.json()) == (202, {"deferred": True})
            await until(lambda: bool(callback_api.settles), "the settle")
    (settle,) = callback_api.settles
    assert settle.body["outcome"] == outcome
    assert callback_api.renews[0].body == {
        **identity_of(42).model_dump(exclude={"destination"}),
        "lease_ms": 30_000,
    }
    assert sent_texts(bot_api) == [(CHAT, "late")]
