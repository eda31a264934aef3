"""Telegram's delivery queues: which updates the Bot API server keeps in order, as one table.

The Bot API server (tdlib/telegram-bot-api) gives every webhook update a queue id and sends
one update of a queue at a time: the next waits until the previous one is answered 200 or
expires. Updates of different queues go out in parallel. The queue id is an id read off the
update plus a category times 2^33 (`Client.cpp`, each `add_update` call); two updates share
a queue exactly when those sums are equal. The service keeps the same queues: an update's
`queue_key` is that sum in decimal, so two rows share a key exactly when Telegram would hold
them in one queue (no stricter: an inline query never waits behind a failing message of the
same user; no looser: a poll's answers stay in order).

Read from `telegram-bot-api/Client.cpp` at commit 01a3679 (2026-05-07, Bot API 10.0); the
Bot API 10.1 changelog adds no update type. docs/telegram-queues.md has the same table with
the line of Client.cpp each row comes from; docs/research/telegram-bot-api-queues.md, the
reading in full.

Two quirks of Telegram's, kept because they are Telegram's: `guest_message` (the chat, 12)
and `purchased_paid_media` (the buyer, 12) share category 12, so a guest message in a
private chat shares its queue with that user's purchases; and a poll's queue is its raw id,
with no category, so in theory it can meet a chat's. An update type not in the table (one
newer than this code) gets no queue: it is never held back, and holds nothing back.

`queue_of` runs on every webhook request: dict lookups, no model. A malformed shape (a
missing object, an id that is not an integer) gets no queue rather than an error, since the
intake records every update it is given. `app/store/rekey.py` renders the same table as SQL,
for the rows that code older than this table records (revision 0006).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

SOURCE: Final = "tdlib/telegram-bot-api Client.cpp at 01a3679 (2026-05-07), Bot API 10.0"
CATEGORY: Final = 1 << 33
# Chat and user ids have at most 52 significant bits (the Bot API's own words); the service
# takes an id up to 2^53 - 1, where a double still holds every integer, and no wider, so the
# sum with a category stays well inside 64 bits on every database.
MAX_ID: Final = (1 << 53) - 1
# A poll id is TDLib's int64, sent as a decimal string; it is the queue id as it stands. The
# pattern is its canonical spelling (app/store/rekey.py reads it in SQL too).
POLL_ID: Final = r"-?[1-9][0-9]{0,18}|0"
MIN_INT64: Final = -(1 << 63)
MAX_INT64: Final = (1 << 63) - 1
_POLL_ID = re.compile(POLL_ID)


@dataclass(frozen=True)
class Queue:
    """Where an update's queue id comes from: the integer at `path` inside the update's
    object, plus `category` times 2^33; `category` None: the decimal string at `path` is
    the queue id itself (a poll's id)."""

    path: tuple[str, ...]
    category: int | None
    line: int  # the line of Client.cpp (01a3679) that computes it

    def of(self, payload: Any) -> str | None:
        """The queue key of an update whose object is `payload`, or None."""
        value = payload
        for field in self.path:
            if not isinstance(value, Mapping):
                return None
            value = value.get(field)
        if self.category is None:
            if isinstance(value, str) and _POLL_ID.fullmatch(value):
                return value if MIN_INT64 <= int(value) <= MAX_INT64 else None
            return None
        # type() rather than isinstance(): a bool is an int subclass, and never an id.
        if type(value) is not int or not -MAX_ID <= value <= MAX_ID:
            return None
        return str(value + self.category * CATEGORY)


_CHAT = ("chat", "id")
_FROM = ("from", "id")

# Every update type of the Bot API, in Telegram's order (`UpdateType` in Client.h): the names
# setWebhook's allowed_updates takes, and the queue each one joins.
QUEUES: Final[dict[str, Queue]] = {
    "message": Queue(_CHAT, 0, 17959),
    "edited_message": Queue(_CHAT, 0, 17959),
    "channel_post": Queue(_CHAT, 0, 17959),
    "edited_channel_post": Queue(_CHAT, 0, 17959),
    "inline_query": Queue(_FROM, 1, 17075),
    "chosen_inline_result": Queue(_FROM, 2, 17083),
    "callback_query": Queue(_FROM, 3, 17158),
    "shipping_query": Queue(_FROM, 4, 17236),
    "pre_checkout_query": Queue(_FROM, 4, 17242),
    "poll": Queue(("id",), None, 17062),
    "poll_answer": Queue(("poll_id",), None, 17067),
    "my_chat_member": Queue(_CHAT, 5, 17279),
    # The member whose status changed (Telegram reads it from old_chat_member).
    "chat_member": Queue(("old_chat_member", "user", "id"), 6, 17279),
    "chat_join_request": Queue(_FROM, 6, 17293),
    "chat_boost": Queue(_CHAT, 7, 17305),
    "removed_chat_boost": Queue(_CHAT, 7, 17305),
    "message_reaction": Queue(_CHAT, 8, 17321),
    "message_reaction_count": Queue(_CHAT, 9, 17334),
    "business_connection": Queue(("user", "id"), 10, 17346),
    "business_message": Queue(_CHAT, 11, 18005),
    "edited_business_message": Queue(_CHAT, 11, 18005),
    "deleted_business_messages": Queue(_CHAT, 11, 17352),
    "purchased_paid_media": Queue(_FROM, 12, 17248),
    "managed_bot": Queue(("user", "id"), 13, 17254),
    "guest_message": Queue(_CHAT, 12, 18050),
}

# What Telegram delivers when setWebhook names no allowed_updates (Client.h,
# DEFAULT_ALLOWED_UPDATE_TYPES): every type but these, which a bot must ask for by name.
OPT_IN: Final = ("chat_member", "message_reaction", "message_reaction_count")
DEFAULT_UPDATES: Final = tuple(name for name in QUEUES if name not in OPT_IN)


def queue_of(update_type: str, payload: Any) -> str | None:
    """The queue key of an update of `update_type` whose object is `payload`: Telegram's
    webhook queue id in decimal, or None (a type not in the table, a malformed shape)."""
    queue = QUEUES.get(update_type)
    return None if queue is None else queue.of(payload)


def unknown_update_types(names: tuple[str, ...] | list[str]) -> list[str]:
    """The names among `names` that are not update types of the Bot API (exact, lower case:
    Telegram lower-cases names itself, but a name that needs it is a typo here)."""
    return [name for name in names if name not in QUEUES]
