"""What an update is, and which delivery queue it joins: read off the parsed JSON, never raising.

The update's type is its one key beside `update_id`; its queue is Telegram's own webhook queue
for it (`app.queues`: the table read from the Bot API server's source). Only the oldest open
update of a `(bot, queue_key)` is delivered at a time, as Telegram sends one update of a queue
at a time; a type the table does not know gets no queue and is never held back.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from app.queues import queue_of

_TYPE_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


def classify(update: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(update_type, queue_key) of a parsed Telegram update."""
    update_type = next((key for key in update if key != "update_id"), None)
    if update_type is None or not _TYPE_NAME.fullmatch(update_type):
        # Telegram's types are short snake_case names; anything else (a NUL, a megabyte of
        # key) is kept in the body but never copied into a column.
        return None, None
    return update_type, queue_of(update_type, update[update_type])
