"""telegram-intake: durable webhook intake for Telegram bots."""

__version__ = "0.1.0"
