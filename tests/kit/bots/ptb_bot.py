"""A python-telegram-bot bot behind telegram-intake: `python -m tests.kit.bots.ptb_bot`."""

from __future__ import annotations

import uvicorn
from telegram import Update
from telegram.ext import Application, ContextTypes, MessageHandler, filters

from telegram_intake_kit import current_attempt
from telegram_intake_kit.ptb import webhook_app
from tests.kit.bots.behaviour import API_ROOT, PORT, TOKEN, behave, options


async def on_message(update: Update, _context: ContextTypes.DEFAULT_TYPE) -> None:
    assert update.message is not None
    await behave(
        update.update_id, update.message.text or "", current_attempt(), update.message.reply_text
    )


def main() -> None:
    application = (
        Application.builder()
        .token(TOKEN)
        .base_url(f"{API_ROOT}/bot")
        .updater(None)
        .concurrent_updates(True)  # behind the service, chats run in parallel
        .build()
    )
    application.add_handler(MessageHandler(filters.TEXT, on_message))
    app = webhook_app(application, **options())
    print(f"listening on {PORT}", flush=True)
    uvicorn.run(app, host="127.0.0.1", port=PORT, log_level="warning")


if __name__ == "__main__":
    main()
