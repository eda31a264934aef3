"""The wire models repeat a store rule on purpose (the kit must not import app.store)."""

from __future__ import annotations

from app.store import validate
from telegram_intake_kit import wire


def test_bot_pattern_is_the_stores_bot_name_rule() -> None:
    assert validate.BOT_NAME.pattern == wire.BOT_PATTERN


def test_wire_limits_are_the_stores() -> None:
    assert validate.MAX_BIGINT == wire.MAX_BIGINT
    assert validate.MAX_INTEGER == wire.MAX_INTEGER
