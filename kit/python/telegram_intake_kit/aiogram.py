"""aiogram 3 behind telegram-intake: `IntakeRequestHandler` in place of `SimpleRequestHandler`.

    IntakeRequestHandler(dispatcher, bot, secret_token=S).register(app, path="/webhook")

aiogram's own handler answers Telegram before the handlers run (`handle_in_background=True`
by default), so behind the service a handler that raised was never retried and chat order was
lost; in the foreground it answers 200 anyway after 55 s. This one answers after
`dispatcher.feed_update` has returned, as `telegram_intake_kit.adapter` says: 200, 500 when a
handler raised, 422 for `Terminal`, 202 past `defer_after` with a callback API to settle in.

- Handlers get the attempt as the argument `intake` (an `IntakeAttempt`, or None for a plain
  bot's request); `telegram_intake_kit.current_attempt()` gives it too.
- An error that one of the bot's `errors` handlers handles counts as handled, as in aiogram
  itself; but `Terminal` is seen (by an outer middleware) before any errors handler can
  swallow it, and still gives 422.
- A handler's returned method (`return message.answer(...)`, aiogram's "webhook reply") is
  called here: nobody would execute it from the answer's body. Its API error is a failure.
- An update aiogram cannot read (its types refuse it) is `Terminal`: retrying cannot help,
  and the operator who upgrades aiogram redrives it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

from aiogram import Bot, Dispatcher
from aiogram.methods import TelegramMethod
from aiogram.types import TelegramObject, Update
from aiohttp import web
from pydantic import ValidationError

from telegram_intake_kit.adapter import DEFAULT_DEFER_AFTER, DEFAULT_DEFERRED_LEASE, Intake
from telegram_intake_kit.attempt import IntakeAttempt, Terminal
from telegram_intake_kit.forwarded import Forwarded

# The Terminal raised in this update's handlers, seen before aiogram's errors handlers.
_terminal: ContextVar[list[Terminal] | None] = ContextVar("intake_aiogram_terminal", default=None)

Next = Callable[[TelegramObject, dict[str, Any]], Awaitable[Any]]


class IntakeRequestHandler:
    """An aiohttp handler running aiogram's dispatcher for forwarded updates. Extra keyword
    arguments reach the handlers, as `SimpleRequestHandler`'s do."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        bot: Bot,
        *,
        secret_token: str | None = None,
        signing_secret: str | None = None,
        intake_url: str | None = None,
        api_key: str | None = None,
        defer_after: float = DEFAULT_DEFER_AFTER,
        deferred_lease: float = DEFAULT_DEFERRED_LEASE,
        **data: Any,
    ) -> None:
        self.dispatcher = dispatcher
        self.bot = bot
        self.data = data
        self.intake = Intake(
            secret_token=secret_token,
            signing_secret=signing_secret,
            intake_url=intake_url,
            api_key=api_key,
            defer_after=defer_after,
            deferred_lease=deferred_lease,
        )
        if _see_terminal not in dispatcher.update.outer_middleware:
            dispatcher.update.outer_middleware.register(_see_terminal)

    def register(self, app: web.Application, /, path: str, **kwargs: Any) -> None:
        """Serve POST `path` on `app`; close the bot's session and the callback client when
        `app` shuts down."""
        app.on_shutdown.append(self._close)
        app.router.add_route("POST", path, self.handle, **kwargs)

    async def handle(self, request: web.Request) -> web.Response:
        answer = await self.intake.handle(request.headers, await request.read(), self._feed)
        return web.json_response(answer.body, status=answer.status)

    async def _feed(self, forwarded: Forwarded, attempt: IntakeAttempt | None) -> None:
        try:
            update = Update.model_validate(forwarded.update, context={"bot": self.bot})
        except ValidationError as error:
            raise Terminal(f"aiogram cannot read this update: {error}") from error
        seen: list[Terminal] = []
        _terminal.set(seen)
        # `intake` always, None included: a handler that names it must always receive it.
        try:
            result = await self.dispatcher.feed_update(
                self.bot, update, **self.data, intake=attempt
            )
        except Exception:
            if seen:  # an errors handler raised something else after the Terminal
                raise seen[0] from None
            raise
        if seen:
            raise seen[0]  # an errors handler took it; it still says "never"
        if isinstance(result, TelegramMethod):
            await self.bot(result)

    async def _close(self, _app: web.Application) -> None:
        await self.intake.aclose()
        await self.bot.session.close()


async def _see_terminal(handler: Next, event: TelegramObject, data: dict[str, Any]) -> Any:
    """Outer update middleware: it runs inside aiogram's ErrorsMiddleware, so it sees a
    handler's exception before the bot's errors handlers do."""
    try:
        return await handler(event, data)
    except Terminal as terminal:
        seen = _terminal.get()
        if seen is not None:
            seen.append(terminal)
        raise
