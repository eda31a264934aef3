"""What an update is, and which delivery queue it joins: read off the parsed JSON, never raising.

The Bot API delivers one chat's updates in order, and one user's, while different chats and
users proceed in parallel. The intake orders its deliveries the same way: each update gets a
`queue_key`, and only the oldest open update of a `(bot, queue_key)` is delivered at a time.

- Chat updates (messages, edits, reactions, membership, join requests, boosts) are keyed by
  the chat's id.
- User updates (callback, inline, shipping and pre-checkout queries, chosen inline results,
  poll answers) are keyed by the sender's id; a poll answer from an anonymous chat, by that
  chat's id.
- Anything else (polls, paid media purchases, business connections, types this code does
  not know yet) has no key, so it is never held back behind another update.

The key is the plain decimal id for chats and users alike. That is intended: a private
chat's id is its user's id, so a user's private messages and their callback queries share
one queue, as they do in the Bot API.

This runs on every webhook request, so it is plain dict lookups: no model, no copies. A
malformed inner shape (missing object, an id that is not an integer) gets no key rather
than an error, since the intake records every update object it is given.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

# Update types whose queue is the chat at `<update_type>.chat.id`.
CHAT_KEYED: Final = frozenset(
    {
        "message",
        "edited_message",
        "channel_post",
        "edited_channel_post",
        "business_message",
        "edited_business_message",
        "deleted_business_messages",
        "message_reaction",
        "message_reaction_count",
        "chat_member",
        "my_chat_member",
        "chat_join_request",
        "chat_boost",
        "removed_chat_boost",
    }
)

# Update types whose queue is the sender at `<update_type>.from.id`.
SENDER_KEYED: Final = frozenset(
    {
        "callback_query",
        "inline_query",
        "chosen_inline_result",
        "shipping_query",
        "pre_checkout_query",
    }
)

# Telegram ids fit in a signed 64-bit integer; anything wider is not an id (and a huge int
# could even exceed Python's int-to-str digit limit).
_MIN_ID: Final = -(2**63)
_MAX_ID: Final = 2**63 - 1


_TYPE_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


def classify(update: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(update_type, queue_key) of a parsed Telegram update."""
    update_type = next((key for key in update if key != "update_id"), None)
    if update_type is None or not _TYPE_NAME.fullmatch(update_type):
        # Telegram's types are short snake_case names; anything else (a NUL, a megabyte of
        # key) is kept in the body but never copied into a column.
        return None, None
    payload = update[update_type]
    if update_type in CHAT_KEYED:
        return update_type, _id_of(payload, "chat")
    if update_type in SENDER_KEYED:
        return update_type, _id_of(payload, "from")
    if update_type == "poll_answer":
        # An anonymous chat's vote carries voter_chat, and (for backward compatibility) a
        # placeholder `user` shared by every such vote (@Channel_Bot): the chat decides.
        if isinstance(payload, Mapping) and "voter_chat" in payload:
            return update_type, _id_of(payload, "voter_chat")
        return update_type, _id_of(payload, "user")
    return update_type, None


def _id_of(payload: Any, field: str) -> str | None:
    """`payload[field]["id"]` as a decimal string, or None unless that is an integer id."""
    if not isinstance(payload, Mapping):
        return None
    holder = payload.get(field)
    if not isinstance(holder, Mapping):
        return None
    value = holder.get("id")
    # type() rather than isinstance(): a bool is an int subclass, and never an id.
    if type(value) is not int or not _MIN_ID <= value <= _MAX_ID:
        return None
    return str(value)
