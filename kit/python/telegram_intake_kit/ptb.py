"""python-telegram-bot (21+) behind telegram-intake: `webhook_app(application)`, an ASGI app.

    uvicorn.run(webhook_app(application, secret_token=S), host="127.0.0.1", port=8443)

in place of `application.run_webhook(...)`, whose server answers once the update is queued
(so behind the service a handler that raised was never retried and chat order was lost),
and which calls setWebhook, taking the webhook from the service. This app answers `POST /`
after the update's handlers have ended, as `telegram_intake_kit.adapter` says: 200, 500 when
a handler raised, 422 for `Terminal`, 202 past `defer_after` with a callback API to settle in.

- Handlers get the attempt from `telegram_intake_kit.current_attempt()`.
- `block=False` handlers are waited for too: the answer is the verdict on all of them.
- python-telegram-bot hands a handler's error to every error handler and has no notion of
  "handled"; the one explicit word is an error handler raising `ApplicationHandlerStop`. So
  an error counts as handled only then; otherwise it is answered 500 and retried, error
  handlers or not (they are for telling someone, and they still do). `Terminal` is always 422.
- Updates go through the application's update processor, so `concurrent_updates` holds as
  under `run_webhook` (the default, 1, handles one update at a time).
- The lifespan runs what `run_webhook` would: `initialize()`, `post_init`, `start()`, and at
  the end `stop()`, `post_stop`, `shutdown()`, `post_shutdown`; unless the caller initialised
  the application already, which then stays the caller's to stop. Without a lifespan (a
  server that runs none) the first request initialises it.

Errors are read by wrapping, on this application object, `process_error` (both of
python-telegram-bot's call sites go through it) and `create_task` (to collect the `block=False`
tasks of the update); tests/kit/test_ptb.py holds both to the installed release.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from telegram import Update
from telegram.ext import Application, ExtBot

from telegram_intake_kit.adapter import (
    DEFAULT_DEFER_AFTER,
    DEFAULT_DEFERRED_LEASE,
    Answer,
    Intake,
)
from telegram_intake_kit.attempt import IntakeAttempt, Terminal
from telegram_intake_kit.forwarded import Forwarded

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
AnyApplication = Application[Any, Any, Any, Any, Any, Any]

MAX_BODY_BYTES = 16 * 1024 * 1024


@dataclass
class _Seen:
    """What one update's handlers did, gathered by the wrappers."""

    errors: list[tuple[Exception, bool]] = field(default_factory=list)  # (error, stopped)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)


_seen: ContextVar[_Seen | None] = ContextVar("intake_ptb_seen", default=None)


def webhook_app(
    application: AnyApplication,
    *,
    secret_token: str | None = None,
    signing_secret: str | None = None,
    intake_url: str | None = None,
    api_key: str | None = None,
    defer_after: float = DEFAULT_DEFER_AFTER,
    deferred_lease: float = DEFAULT_DEFERRED_LEASE,
) -> WebhookApp:
    """The ASGI app serving `application` behind telegram-intake."""
    intake = Intake(
        secret_token=secret_token,
        signing_secret=signing_secret,
        intake_url=intake_url,
        api_key=api_key,
        defer_after=defer_after,
        deferred_lease=deferred_lease,
    )
    return WebhookApp(application, intake)


class WebhookApp:
    def __init__(self, application: AnyApplication, intake: Intake) -> None:
        self.application = application
        self.intake = intake
        self._owned = False  # initialised here, so stopped here
        self._starting = asyncio.Lock()
        _watch(application)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if path not in ("", "/"):
            await _answer(send, Answer(404, {"error": "not found"}))
            return
        if scope["method"] != "POST":
            await _answer(send, Answer(405, {"error": "POST only"}), allow=True)
            return
        body = await _body(receive)
        if body is None:
            await _answer(send, Answer(413, {"error": "body too large"}))
            return
        headers = {
            name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]
        }
        await self._start()
        await _answer(send, await self.intake.handle(headers, body, self._process))

    async def _process(self, forwarded: Forwarded, _attempt: IntakeAttempt | None) -> None:
        application = self.application
        try:
            update = Update.de_json(forwarded.update, application.bot)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            # As for aiogram: a retry cannot help; upgrade the library and redrive it.
            raise Terminal(f"python-telegram-bot cannot read this update: {error!r}") from error
        if isinstance(application.bot, ExtBot):
            application.bot.insert_callback_data(update)
        seen = _Seen()
        _seen.set(seen)
        await application.update_processor.process_update(
            update, application.process_update(update)
        )
        while seen.tasks:  # block=False handlers, and whatever tasks they start in turn
            started, seen.tasks = seen.tasks, []
            await asyncio.gather(*started, return_exceptions=True)
        unhandled = [error for error, stopped in seen.errors if not stopped]
        terminal = [error for error, _ in seen.errors if isinstance(error, Terminal)]
        if terminal:
            raise terminal[0]
        if unhandled:
            raise unhandled[0]

    async def _start(self) -> None:
        async with self._starting:
            if getattr(self.application, "_initialized", False):
                return  # the caller's, or started already
            await self.application.initialize()
            if self.application.post_init is not None:
                await self.application.post_init(self.application)
            await self.application.start()
            self._owned = True

    async def _stop(self) -> None:
        await self.intake.aclose()
        if not self._owned:
            return
        self._owned = False  # a second shutdown message stops nothing twice
        application = self.application
        if application.running:
            await application.stop()
        if application.post_stop is not None:
            await application.post_stop(application)
        await application.shutdown()
        if application.post_shutdown is not None:
            await application.post_shutdown(application)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self._start()
                except Exception as error:
                    await send({"type": "lifespan.startup.failed", "message": repr(error)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self._stop()
                await send({"type": "lifespan.shutdown.complete"})
                return


def _watch(application: AnyApplication) -> None:
    """Wrap the application's `process_error` and `create_task` so that the update being
    processed learns of its handlers' errors and non-blocking tasks. Once per application."""
    if getattr(application, "_intake_watched", False):
        return
    process_error = application.process_error
    create_task = application.create_task

    async def seeing_errors(
        update: object | None, error: Exception, job: Any = None, coroutine: Any = None
    ) -> bool:
        stopped = await process_error(update=update, error=error, job=job, coroutine=coroutine)
        seen = _seen.get()
        if seen is not None:
            seen.errors.append((error, stopped))
        return stopped

    def seeing_tasks(
        coroutine: Any, update: object | None = None, *, name: str | None = None
    ) -> Any:
        task = create_task(coroutine, update=update, name=name)
        seen = _seen.get()
        if seen is not None:
            seen.tasks.append(task)
        return task

    # Instance attributes shadow the methods; Application's bases leave it a __dict__.
    setattr(application, "process_error", seeing_errors)  # noqa: B010
    setattr(application, "create_task", seeing_tasks)  # noqa: B010
    setattr(application, "_intake_watched", True)  # noqa: B010


async def _body(receive: Receive) -> bytes | None:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def _answer(send: Send, answer: Answer, *, allow: bool = False) -> None:
    body = json.dumps(answer.body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if allow:
        headers.append((b"allow", b"POST"))
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
