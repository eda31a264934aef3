"""Whom an update concerns: every user and chat id it names, in any role.

The Bot API names people and chats in two ways, and the walk below reads both wherever they
sit in the update, however deep (a reply's sender, a forward's origin, a member's user, a
reaction's actor, a business connection, a giveaway's winners...):
- a `User` object (recognised by `is_bot`, a field every User has and no other type) or a
  `Chat` object (a `type` of private, group, supergroup or channel, beside an integer `id`);
- the fields that hold such an id as a bare number: `user_id` (Contact, SharedUser,
  ChatMemberUpdated's via_join_request...), `user_ids`, `chat_id` (ChatShared, ...),
  `user_chat_id` (ChatJoinRequest, BusinessConnection) and `sender_chat_id`.
A private chat's id is its user's id, so users and chats share one space of ids: erasing a
user erases their private chat with the bot, and the other way round. Groups and channels
have negative ids, which no user has.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, TypeGuard

CHAT_TYPES: Final = frozenset({"private", "group", "supergroup", "channel"})
ID_FIELDS: Final = frozenset({"user_id", "chat_id", "user_chat_id", "sender_chat_id"})
ID_LISTS: Final = frozenset({"user_ids", "chat_ids"})
MAX_DEPTH: Final = 64  # deeper than any Bot API type nests; a hostile body stops here


def _an_id(value: Any) -> TypeGuard[int]:
    return type(value) is int  # never a bool, which is an int too


def subjects_of(update: Mapping[str, Any]) -> tuple[int, ...]:
    """Every user and chat id `update` names, once each, in ascending order."""
    found: set[int] = set()
    pending: list[tuple[Any, int]] = [(update, 0)]
    while pending:
        value, depth = pending.pop()
        if depth > MAX_DEPTH:
            continue
        if isinstance(value, Mapping):
            identifier = value.get("id")
            if _an_id(identifier) and ("is_bot" in value or value.get("type") in CHAT_TYPES):
                found.add(identifier)
            for key, item in value.items():
                if key in ID_FIELDS and _an_id(item):
                    found.add(item)
                elif key in ID_LISTS and isinstance(item, list):
                    found.update(number for number in item if _an_id(number))
                elif isinstance(item, Mapping | list):
                    pending.append((item, depth + 1))
        elif isinstance(value, list):
            pending.extend((item, depth + 1) for item in value if isinstance(item, Mapping | list))
    return tuple(sorted(found))
