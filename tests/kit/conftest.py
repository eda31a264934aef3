"""What the kit's tests share: updates as Telegram sends them, and the fake Bot API that
the frameworks' bots call."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from app.fake_bot_api import FakeBotApi
from tests.conftest import serving_asgi

CHAT = 4242


def message_update(update_id: int, text: str = "hello", chat: int = CHAT) -> dict[str, Any]:
    """A text message update, as Telegram sends it."""
    return {
        "update_id": update_id,
        "message": {
            "message_id": update_id,
            "date": 1_700_000_000,
            "chat": {"id": chat, "type": "private", "first_name": "U"},
            "from": {"id": chat, "is_bot": False, "first_name": "U"},
            "text": text,
        },
    }


@dataclass
class BotApi:
    fake: FakeBotApi
    url: str


@pytest.fixture(scope="module")
def served_bot_api() -> Iterator[BotApi]:
    fake = FakeBotApi()
    with serving_asgi(fake.app()) as url:
        yield BotApi(fake, url)


@pytest.fixture
def bot_api(served_bot_api: BotApi) -> BotApi:
    """The module's fake Bot API, its record of calls cleared."""
    served_bot_api.fake.calls.clear()
    return served_bot_api
