"""An aiogram 3 bot behind telegram-intake: `python -m tests.kit.bots.aiogram_bot`."""

from __future__ import annotations

import os

from aiogram import Bot, Dispatcher
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiogram.types import Message, Update
from aiogram.webhook.aiohttp_server import SimpleRequestHandler
from aiohttp import web

from telegram_intake_kit import IntakeAttempt
from telegram_intake_kit.aiogram import IntakeRequestHandler
from tests.kit.bots.behaviour import API_ROOT, PORT, TOKEN, behave, options

dispatcher = Dispatcher()


@dispatcher.message()
async def on_message(
    message: Message, event_update: Update, intake: IntakeAttempt | None = None
) -> None:
    await behave(event_update.update_id, message.text or "", intake, message.answer)


def main() -> None:
    bot = Bot(TOKEN, session=AiohttpSession(api=TelegramAPIServer.from_base(API_ROOT)))
    app = web.Application()
    if os.environ.get("ADAPTER") == "aiogram":  # the control: aiogram's own handler
        secret = options()["secret_token"]
        SimpleRequestHandler(dispatcher, bot, secret_token=secret).register(app, path="/")
    else:
        IntakeRequestHandler(dispatcher, bot, **options()).register(app, path="/")
    web.run_app(app, host="127.0.0.1", port=PORT, print=lambda _: print(f"listening on {PORT}"))


if __name__ == "__main__":
    main()
