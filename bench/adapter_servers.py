"""The servers `python -m bench adapters` measures, each in its own process, on uvloop:

    python -m bench.adapter_servers aiogram-own|aiogram-kit|ptb-own|ptb-kit BOT_API_URL

Each runs a bot with one message handler that does nothing (no Bot API call: what is
measured is the path around the handlers; python-telegram-bot asks the fake Bot API at
BOT_API_URL for getMe once, at start), serves POST / on 127.0.0.1 (ephemeral port),
prints `ready <port>` once it accepts requests, and stops on SIGTERM.

- aiogram-own: aiogram 3's `SimpleRequestHandler` in the foreground
  (`handle_in_background=False`, the mode that answers after the handlers, as the kit does),
  checking the secret token.
- aiogram-kit: the kit's `IntakeRequestHandler`, checking the secret token and the Standard
  Webhooks signatures (body and identity).
- ptb-own: what a python-telegram-bot user writes by hand without the kit: an ASGI app that
  checks the secret token, reads the update and awaits `application.process_update`.
  (python-telegram-bot's own webhook server answers once the update is queued, which is the
  path the kit exists to replace, and needs tornado: not a fair baseline.)
- ptb-kit: the kit's `webhook_app`, the secret token and the signatures, under uvicorn.
"""

from __future__ import annotations

import hmac
import json
import sys
from typing import Any

import uvicorn
import uvloop

from bench.intake_servers import AnnouncingServer, serve_aiohttp

SECRET = "bench-downstream-secret"  # noqa: S105 - a fixed bench secret
SIGNING_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # noqa: S105
TOKEN = "42:TEST"  # noqa: S105 - the fake Bot API's
HOST = "127.0.0.1"


async def serve_aiogram(kit: bool) -> None:
    from aiogram import Bot, Dispatcher
    from aiogram.types import Message
    from aiogram.webhook.aiohttp_server import SimpleRequestHandler
    from aiohttp import web

    from telegram_intake_kit.aiogram import IntakeRequestHandler

    bot = Bot(TOKEN)
    dispatcher = Dispatcher()

    @dispatcher.message()
    async def on_message(message: Message) -> None:
        return None

    app = web.Application()
    if kit:
        handler = IntakeRequestHandler(
            dispatcher, bot, secret_token=SECRET, signing_secret=SIGNING_SECRET
        )
        handler.register(app, path="/")
    else:
        own = SimpleRequestHandler(dispatcher, bot, handle_in_background=False, secret_token=SECRET)
        own.register(app, path="/")
    await serve_aiohttp(app)


def ptb_application(bot_api: str) -> Any:
    from telegram import Update
    from telegram.ext import Application, ContextTypes, MessageHandler, filters

    async def on_message(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        return None

    builder = Application.builder().token(TOKEN).base_url(f"{bot_api}/bot").updater(None)
    application = builder.concurrent_updates(True).build()
    application.add_handler(MessageHandler(filters.TEXT, on_message))
    return application


def ptb_own(application: Any) -> Any:
    """By hand: the secret token, the update, process_update, 200 or 500."""
    from telegram import Update

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await application.initialize()
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await application.shutdown()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        headers = dict(scope["headers"])
        given = headers.get(b"x-telegram-bot-api-secret-token", b"")
        status = 401
        if hmac.compare_digest(given, SECRET.encode()):
            update = Update.de_json(json.loads(b"".join(chunks)), application.bot)
            await application.process_update(update)
            status = 200
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    return app


def serve_ptb(kit: bool, bot_api: str) -> None:
    from telegram_intake_kit.ptb import webhook_app

    application = ptb_application(bot_api)
    if kit:
        app = webhook_app(application, secret_token=SECRET, signing_secret=SIGNING_SECRET)
    else:
        app = ptb_own(application)
    config = uvicorn.Config(app, host=HOST, port=0, log_level="warning", loop="uvloop")
    AnnouncingServer(config).run()


if __name__ == "__main__":
    name = sys.argv[1]
    if name.startswith("aiogram"):
        uvloop.run(serve_aiogram(kit=name == "aiogram-kit"))
    else:
        serve_ptb(kit=name == "ptb-kit", bot_api=sys.argv[2])
