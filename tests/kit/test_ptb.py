"""`telegram_intake_kit.ptb.webhook_app` with real python-telegram-bot: the ASGI app called
through `httpx.ASGITransport` (which runs no lifespan: the lazy start on the first request),
or served by uvicorn (a real lifespan), against the fake Bot API (served by uvicorn) for
`getMe` and the handlers' calls.

The adapter learns of a handler's error and of its `block=False` tasks only by wrapping the
application's `process_error` and `create_task`; the control tests at the end hold that need
to the installed release (python-telegram-bot swallows both).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount
from telegram import Update
from telegram.ext import (
    Application,
    ApplicationHandlerStop,
    ContextTypes,
    MessageHandler,
    filters,
)

from telegram_intake_kit import IntakeAttempt, Terminal, current_attempt
from telegram_intake_kit.ptb import MAX_BODY_BYTES, WebhookApp, webhook_app
from tests.conftest import serve_asgi
from tests.kit.conftest import CHAT, BotApi, message_update
from tests.kit.test_adapter import (
    API_KEY,
    SECRET_TOKEN,
    SIGNING_SECRET,
    CallbackApi,
    identity_of,
    request_for,
    serving_aiohttp,
    until,
)

AnyApplication = Application[Any, Any, Any, Any, Any, Any]
Callback = Callable[[Update, ContextTypes.DEFAULT_TYPE], Coroutine[Any, Any, None]]


def make_application(bot_api: BotApi, calls: list[str] | None = None) -> AnyApplication:
    """An application without an updater against the fake Bot API. With `calls`, its
    lifecycle is recorded there: initialize, start, stop, shutdown and the three hooks."""
    builder = Application.builder().token(bot_api.fake.token).base_url(f"{bot_api.url}/bot")
    builder = builder.updater(None)
    if calls is not None:

        def hook(name: str) -> Callable[[AnyApplication], Coroutine[Any, Any, None]]:
            async def record(_application: AnyApplication) -> None:
                calls.append(name)

            return record

        builder = builder.post_init(hook("post_init")).post_stop(hook("post_stop"))
        builder = builder.post_shutdown(hook("post_shutdown"))
    application = builder.build()
    if calls is not None:
        for name in ("initialize", "start", "stop", "shutdown"):
            setattr(application, name, recorded(name, getattr(application, name), calls))
    return application


def recorded(
    name: str, original: Callable[[], Coroutine[Any, Any, None]], calls: list[str]
) -> Callable[[], Coroutine[Any, Any, None]]:
    async def step() -> None:
        calls.append(name)
        await original()

    return step


def text_handler(callback: Callback, *, block: bool = True) -> MessageHandler[Any, Any]:
    return MessageHandler(filters.TEXT, callback, block=block)


async def shut_down(app: WebhookApp) -> None:
    """The ASGI lifespan's shutdown, as a server sends it."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "lifespan.shutdown"}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    await app({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send)
    assert sent == [{"type": "lifespan.shutdown.complete"}]


@pytest.fixture
async def webhook_apps() -> AsyncIterator[Callable[..., WebhookApp]]:
    """Makes webhook apps verifying both secrets; an application one of them started (the
    lazy path) is shut down at the end through the lifespan."""
    made: list[WebhookApp] = []

    def make(application: AnyApplication, **options: Any) -> WebhookApp:
        app = webhook_app(
            application, secret_token=SECRET_TOKEN, signing_secret=SIGNING_SECRET, **options
        )
        made.append(app)
        return app

    yield make
    for app in made:
        if app._owned and getattr(app.application, "_initialized", False):
            await shut_down(app)


async def post(
    app: WebhookApp,
    update: dict[str, Any],
    *,
    plain: bool = False,
    attempt: int = 1,
    path: str = "/",
) -> httpx.Response:
    headers, body = request_for(update, plain=plain, attempt=attempt)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://bot") as client:
        return await client.post(path, content=body, headers=headers)


async def boom(_update: Update, _context: ContextTypes.DEFAULT_TYPE) -> None:
    raise RuntimeError("boom")


# ---- errors ------------------------------------------------------------------------------------


async def test_a_raising_handler_without_error_handlers_is_500(
    bot_api: BotApi, webhook_apps: Callable[..., WebhookApp]
) -> None:
    application = make_application(bot_api)
    application.add_handler(text_handler(boom))
    answer = await post(webhook_apps(application), message_update(51))
    assert (answer.status_code, answer.json()) == (500, {"error": "RuntimeError: boom"})


async def test_an_error_handler_that_only_logs_still_gives_500(
    bot_api: BotApi, webhook_apps: Callable[..., WebhookApp]
) -> None:
    application = make_application(bot_api)
    application.add_handler(text_handler(boom))
    told: list[BaseException | None] = []

    async def log_it(_update: object, context: ContextTypes.DEFAULT_TYPE) -> None:
        told.append(context.error)

    application.add_error_handler(log_it)
    answer = await post(webhook_apps(application), message_update(52))
    assert answer.status_code == 500, answer.text
    assert [str(error) for error in told] == ["boom"]  # and the error handler was told


async def test_an_error_handler_raising_application_handler_stop_gives_200(
    bot_api: BotApi, webhook_apps: Callable[..., WebhookApp]
) -> None:
    application = make_application(bot_api)
    application.add_handler(text_handler(boom))
    told: list[BaseException | None] = []

    async def stop_it(_update: object, context: ContextTypes.DEFAULT_TYPE) -> None:
        told.append(context.error)
        raise ApplicationHandlerStop

    application.add_error_handler(stop_it)
    answer = await post(webhook_apps(application), message_update(53))
    assert answer.status_code == 200, answer.text
    assert [str(error) for error in told] == ["boom"]


@pytest.mark.parametrize("block", [True, False])
async def test_terminal_is_422_even_when_an_error_handler_stops_it(
    bot_api: BotApi, webhook_apps: Callable[..., WebhookApp], block: bool
) -> None:
    application = make_application(bot_api)

    async def never(_update: Update, _context: ContextTypes.DEFAULT_TYPE) -> None:
        raise Terminal("never")

    async def stop_it(_update: object, _context: ContextTypes.DEFAULT_TYPE) -> None:
        raise ApplicationHandlerStop

    application.add_handler(text_handler(never, block=block))
    application.add_error_handler(stop_it)
    answer = await post(webhook_apps(application), message_update(54))
    assert (answer.status_code, answer.json()) == (422, {"error": "Terminal: never"})


async def test_a_block_false_handler_is_waited_for(
    bot_api: BotApi, webhook_apps: Callable[..., WebhookApp]
) -> None:
    application = make_application(bot_api)
    effects: list[float] = []

    async def slow(update: Update, _context: ContextTypes.DEFAULT_TYPE) -> None:
        await asyncio.sleep(0.3)
        assert update.message is not None
        await update.message.reply_text("done")
        effects.append(time.monotonic())

    application.add_handler(text_handler(slow, block=False))
    app = webhook_apps(application)
    started = time.monotonic()
    answer = await post(app, message_update(55))
    answered = time.monotonic()
    assert answer.status_code == 200, answer.text
    assert effects, "answered before the block=False handler ended"
    assert effects[0] <= answered
    assert answered - started >= 0.3
    assert [(call["chat_id"], call["text"]) for call in bot_api.fake.sent()] == [(CHAT, "done")]


async def test_a_block_false_handlers_error_is_500(
    bot_api: BotApi, webhook_apps: Callable[..., WebhookApp]
) -> None:
    application = make_application(bot_api)

    async def late(_update: Update, _context: ContextTypes.DEFAULT_TYPE) -> None:
        await asyncio.sleep(0.1)
        raise RuntimeError("late")

    application.add_handler(text_handler(late, block=False))
    answer = await post(webhook_apps(application), message_update(56))
    assert (answer.status_code, answer.json()) == (500, {"error": "RuntimeError: late"})


@pytest.mark.parametrize("block", [True, False])
async def test_current_attempt_in_the_handler_is_the_identity(
    bot_api: BotApi, webhook_apps: Callable[..., WebhookApp], block: bool
) -> None:
    application = make_application(bot_api)
    seen: list[IntakeAttempt | None] = []

    async def remember(_update: Update, _context: ContextTypes.DEFAULT_TYPE) -> None:
        seen.append(current_attempt())

    application.add_handler(text_handler(remember, block=block))
    app = webhook_apps(application)
    answer = await post(app, message_update(57), attempt=4)
    assert answer.status_code == 200, answer.text
    plain = await post(app, message_update(58), plain=True)
    assert plain.status_code == 200, plain.text
    attempt, none = seen
    assert attempt is not None
    assert attempt.identity == identity_of(57, attempt=4)
    assert none is None


@pytest.mark.parametrize(("error", "outcome"), [(None, "completed"), (ValueError(), "failed")])
async def test_a_slow_handler_is_deferred_and_settled(
    bot_api: BotApi,
    webhook_apps: Callable[..., WebhookApp],
    error: Exception | None,
    outcome: str,
) -> None:
    application = make_application(bot_api)

    async def slow(_update: Update, _context: ContextTypes.DEFAULT_TYPE) -> None:
        await asyncio.sleep(0.3)
        if error is not None:
            raise error

    application.add_handler(text_handler(slow))
    callback_api = CallbackApi()
    async with serving_aiohttp(callback_api.app()) as intake_url:
        app = webhook_apps(application, intake_url=intake_url, api_key=API_KEY, defer_after=0.1)
        answer = await post(app, message_update(59))
        assert (answer.status_code, answer.json()) == (202, {"deferred": True})
        await until(lambda: bool(callback_api.settles), "the settle")
        await shut_down(app)  # closes the callback client while its server still runs
    (settle,) = callback_api.settles
    assert settle.body["outcome"] == outcome
    assert settle.body.get("error") == (None if error is None else "ValueError")


# ---- the lifespan ------------------------------------------------------------------------------


async def test_the_lifespan_runs_what_run_webhook_would(bot_api: BotApi) -> None:
    calls: list[str] = []
    application = make_application(bot_api, calls)

    async def reply(update: Update, _context: ContextTypes.DEFAULT_TYPE) -> None:
        calls.append("handled")
        assert update.message is not None
        await update.message.reply_text("served")

    application.add_handler(text_handler(reply))
    app = webhook_app(application, secret_token=SECRET_TOKEN, signing_secret=SIGNING_SECRET)
    async with serve_asgi(app) as url:
        assert calls == ["initialize", "post_init", "start"]
        assert bot_api.fake.called("getMe") == 1
        headers, body = request_for(message_update(61))
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            answer = await client.post("/", content=body, headers=headers)
        assert answer.status_code == 200, answer.text
    assert calls == [
        "initialize",
        "post_init",
        "start",
        "handled",
        "stop",
        "post_stop",
        "shutdown",
        "post_shutdown",
    ]
    assert bot_api.fake.called("getMe") == 1
    assert [call["text"] for call in bot_api.fake.sent()] == ["served"]
    assert not application.running


async def test_the_lifespan_leaves_an_application_the_caller_initialised(
    bot_api: BotApi,
) -> None:
    calls: list[str] = []
    application = make_application(bot_api, calls)

    async def remember(_update: Update, _context: ContextTypes.DEFAULT_TYPE) -> None:
        calls.append("handled")

    application.add_handler(text_handler(remember))
    await application.initialize()
    try:
        app = webhook_app(application, secret_token=SECRET_TOKEN, signing_secret=SIGNING_SECRET)
        async with serve_asgi(app) as url:
            headers, body = request_for(message_update(62))
            async with httpx.AsyncClient(base_url=url, timeout=10) as client:
                answer = await client.post("/", content=body, headers=headers)
            assert answer.status_code == 200, answer.text
        assert calls == ["initialize", "handled"]  # no post_init, start, stop, ...
        assert getattr(application, "_initialized", False)
    finally:
        await application.shutdown()


async def test_without_a_lifespan_the_first_request_initialises_the_application(
    bot_api: BotApi, webhook_apps: Callable[..., WebhookApp]
) -> None:
    calls: list[str] = []
    application = make_application(bot_api, calls)

    async def remember(_update: Update, _context: ContextTypes.DEFAULT_TYPE) -> None:
        calls.append("handled")

    application.add_handler(text_handler(remember))
    app = webhook_apps(application)
    assert calls == []
    first = await post(app, message_update(63))
    assert first.status_code == 200, first.text
    assert calls == ["initialize", "post_init", "start", "handled"]
    assert application.running
    second = await post(app, message_update(64))
    assert second.status_code == 200, second.text
    assert calls[4:] == ["handled"]
    assert bot_api.fake.called("getMe") == 1
    await shut_down(app)
    assert calls[5:] == ["stop", "post_stop", "shutdown", "post_shutdown"]


async def test_concurrent_first_requests_initialise_the_application_once(
    bot_api: BotApi, webhook_apps: Callable[..., WebhookApp]
) -> None:
    calls: list[str] = []
    application = make_application(bot_api, calls)
    application.add_handler(text_handler(lambda *_: asyncio.sleep(0)))
    app = webhook_apps(application)
    answers = await asyncio.gather(*(post(app, message_update(n)) for n in (65, 66, 67)))
    assert [answer.status_code for answer in answers] == [200, 200, 200]
    assert calls == ["initialize", "post_init", "start"]


# ---- the ASGI app ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "size", "status"),
    [
        ("GET", "/", 0, 405),
        ("POST", "/other", 10, 404),
        ("POST", "/", MAX_BODY_BYTES + 1, 413),
        ("POST", "/", MAX_BODY_BYTES, 401),  # at the limit: read, then refused as unsigned
    ],
)
async def test_the_app_serves_post_at_the_root_only(
    bot_api: BotApi,
    webhook_apps: Callable[..., WebhookApp],
    method: str,
    path: str,
    size: int,
    status: int,
) -> None:
    application = make_application(bot_api)
    app = webhook_apps(application)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://bot") as client:
        answer = await client.request(method, path, content=b"x" * size)
    assert answer.status_code == status, answer.text
    if status == 405:
        assert answer.headers["allow"] == "POST"
    if status != 401:
        assert bot_api.fake.called("getMe") == 0  # refused before the application starts


async def test_the_app_serves_its_root_when_mounted_under_a_prefix(
    bot_api: BotApi, webhook_apps: Callable[..., WebhookApp]
) -> None:
    """Mounted in another ASGI app (a FastAPI or Starlette bot, uvicorn's --root-path), the
    app's root is `root_path + "/"`: ASGI's `path` holds the whole path, as Starlette's Mount
    passes it. `_http` compares `scope["path"]` with "/" alone, so it answers 404."""
    application = make_application(bot_api)
    application.add_handler(text_handler(lambda *_: asyncio.sleep(0)))
    outer = Starlette(routes=[Mount("/telegram", app=webhook_apps(application))])
    headers, body = request_for(message_update(71))
    transport = httpx.ASGITransport(app=outer)
    async with httpx.AsyncClient(transport=transport, base_url="http://bot") as client:
        answer = await client.post("/telegram/", content=body, headers=headers)
    assert answer.status_code == 200, answer.text


async def test_an_update_ptbs_types_refuse_is_422(
    bot_api: BotApi, webhook_apps: Callable[..., WebhookApp]
) -> None:
    """`Update.de_json` raises (KeyError: 'date') for a message without its required fields.
    aiogram's adapter calls such an update Terminal (retrying cannot help, and
    docs/research/framework-adapters.md section 7 asks the adapters for one rule); here it
    escapes `_process` as an ordinary error: 500, and the service retries it in vain."""
    application = make_application(bot_api)
    ran: list[Update] = []

    async def remember(update: Update, _context: ContextTypes.DEFAULT_TYPE) -> None:
        ran.append(update)

    application.add_handler(text_handler(remember))
    refused = {"update_id": 72, "message": {"message_id": 1, "text": "no date, no chat"}}
    answer = await post(webhook_apps(application), refused)
    assert answer.status_code == 422, answer.text
    assert ran == []


async def test_the_wrappers_are_installed_once_per_application(
    bot_api: BotApi, webhook_apps: Callable[..., WebhookApp]
) -> None:
    application = make_application(bot_api)
    told: list[BaseException | None] = []

    async def log_it(_update: object, context: ContextTypes.DEFAULT_TYPE) -> None:
        told.append(context.error)

    application.add_handler(text_handler(boom))
    application.add_error_handler(log_it)
    webhook_apps(application)
    wrapped = application.__dict__["process_error"], application.__dict__["create_task"]
    second = webhook_apps(application)
    assert (application.__dict__["process_error"], application.__dict__["create_task"]) == wrapped
    for wrapper, name in zip(wrapped, ("process_error", "create_task"), strict=True):
        inner = inspect.getclosurevars(wrapper).nonlocals[name]
        assert inner.__func__ is getattr(Application, name)  # the method itself, once
        assert inner.__self__ is application

    answer = await post(second, message_update(68))
    assert answer.status_code == 500, answer.text
    assert len(told) == 1


# ---- controls: what python-telegram-bot does without the wrappers ------------------------------


async def test_control_process_update_swallows_a_handlers_error(bot_api: BotApi) -> None:
    application = make_application(bot_api)
    ran: list[str] = []

    async def raising(_update: Update, _context: ContextTypes.DEFAULT_TYPE) -> None:
        ran.append("raised")
        raise RuntimeError("swallowed")

    application.add_handler(text_handler(raising))
    async with application:
        update = Update.de_json(message_update(69), application.bot)
        result = await application.process_update(update)  # returns: nothing to learn from
    assert result is None
    assert ran == ["raised"]
    assert "process_error" not in application.__dict__


async def test_control_process_update_does_not_wait_for_block_false(bot_api: BotApi) -> None:
    application = make_application(bot_api)
    effects: list[str] = []

    async def slow(_update: Update, _context: ContextTypes.DEFAULT_TYPE) -> None:
        await asyncio.sleep(0.2)
        effects.append("ended")

    application.add_handler(text_handler(slow, block=False))
    async with application:
        await application.start()
        await application.process_update(Update.de_json(message_update(70), application.bot))
        assert effects == []  # process_update returned first
        await application.stop()  # which awaits create_task's tasks
    assert effects == ["ended"]
