"""Which updates a destination takes: grammY's filter queries, read and matched here.

A filter query names an update type, then optionally a key of its object, then optionally a
property of that key's value: `message`, `message:successful_payment`,
`callback_query:data`, `message:entities:url`, `chat_member:from:is_bot`. Shortcuts stand for
several: an empty or `msg` first level for `message` and `channel_post`, `edit` for their
edited forms; an empty second level for `entities` and `caption_entities`, `media` and `file`
for the kinds of media (`:text`, `edit:media`, `::url`). The vocabulary below is grammY's
(1.46), for the update types of `app.queues`; `tests/destinations/test_grammy.py` reads the
same from the real grammY and matches the same updates with both.

How a query matches, as grammY's `matchFilter` does: the update has the type's object; the
object has the key (any value but null); a key with a third level has a truthy value (in
JavaScript's sense: an empty list is truthy, 0, "" and false are not) and, itself or any of
its items, either that property truthy or a `type` equal to it (`me`: the id of the bot
itself). A destination's `filter` is any of its queries; each is matched on its own (grammY's
own array form merges the queries' trees, so that `["message", "message:text"]` there means
text messages only; here it means every message).

Queries are checked when the settings load: an unknown one is an error that names the closest
known query. Matching reads the update's object by its type: dict lookups, no parse.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from app.queues import QUEUES

Keys = Mapping[str, "Keys"]
_NONE: Final[Keys] = {}

# Third level.
_ENTITIES: Final[Keys] = dict.fromkeys(
    (
        "mention", "hashtag", "cashtag", "bot_command", "url", "email", "phone_number", "bold",
        "italic", "underline", "strikethrough", "spoiler", "blockquote",
        "expandable_blockquote", "code", "pre", "text_link", "text_mention", "custom_emoji",
        "date_time",
    ),
    _NONE,
)  # fmt: skip
_USER: Final[Keys] = dict.fromkeys(
    ("me", "is_bot", "is_premium", "added_to_attachment_menu"), _NONE
)
_FORWARD_ORIGIN: Final[Keys] = dict.fromkeys(("user", "hidden_user", "chat", "channel"), _NONE)
_STICKER: Final[Keys] = dict.fromkeys(("is_video", "is_animated", "premium_animation"), _NONE)
_REACTION: Final[Keys] = dict.fromkeys(("emoji", "custom_emoji", "paid"), _NONE)
_GIFT: Final[Keys] = dict.fromkeys(("can_be_upgraded", "is_upgrade_separate", "is_private"), _NONE)


def _keys(*names: str, **nested: Keys) -> dict[str, Keys]:
    return {**dict.fromkeys(names, _NONE), **nested}


# Second level.
_COMMON_MESSAGE: Final = _keys(
    "is_topic_message", "is_automatic_forward", "guest_query_id", "business_connection_id",
    "text", "rich_message", "animation", "audio", "document", "live_photo", "paid_media",
    "photo", "story", "video", "video_note", "voice", "contact", "dice", "game", "poll",
    "venue", "location", "caption", "effect_id", "paid_star_count", "has_media_spoiler",
    "new_chat_title", "new_chat_photo", "delete_chat_photo",
    "message_auto_delete_timer_changed", "pinned_message", "invoice",
    "proximity_alert_triggered", "chat_background_set", "giveaway_created",
    "giveaway_completed", "paid_message_price_changed", "video_chat_scheduled",
    "video_chat_started", "video_chat_ended", "video_chat_participants_invited",
    "web_app_data",
    forward_origin=_FORWARD_ORIGIN,
    sticker=_STICKER,
    entities=_ENTITIES,
    caption_entities=_ENTITIES,
    link_preview_options=_keys(
        "url", "prefer_small_media", "prefer_large_media", "show_above_text"
    ),
    giveaway=_keys("only_new_members", "has_public_winners"),
    giveaway_winners=_keys("only_new_members", "was_refunded"),
    gift=_GIFT,
    gift_upgrade_sent=_GIFT,
    unique_gift=_keys("transfer_star_count", "text", "is_private"),
)  # fmt: skip
_MESSAGE: Final = {
    **_COMMON_MESSAGE,
    **_keys(
        "direct_messages_topic", "chat_owner_changed", "community_chat_joined",
        "group_chat_created", "supergroup_chat_created", "migrate_to_chat_id",
        "migrate_from_chat_id", "successful_payment", "refunded_payment", "users_shared",
        "chat_shared", "connected_website", "managed_bot_created", "write_access_allowed",
        "passport_data", "boost_added", "forum_topic_closed", "forum_topic_reopened",
        "general_forum_topic_hidden", "general_forum_topic_unhidden", "checklist_tasks_done",
        "checklist_tasks_added", "community_chat_added", "community_chat_removed",
        "poll_option_added", "poll_option_deleted", "suggested_post_info",
        "suggested_post_approved", "suggested_post_approval_failed",
        "suggested_post_declined", "suggested_post_paid", "suggested_post_refunded",
        "sender_boost_count",
        chat_owner_left=_keys("new_owner"),
        new_chat_members=_USER,
        left_chat_member=_USER,
        forum_topic_created=_keys("is_name_implicit"),
        forum_topic_edited=_keys("name", "icon_custom_emoji_id"),
        checklist=_keys("others_can_add_tasks", "others_can_mark_tasks_as_done"),
    ),
}  # fmt: skip
_CHANNEL_POST: Final = {
    **_COMMON_MESSAGE,
    **_keys("channel_chat_created", "direct_message_price_changed", "is_paid_post"),
}
_CHAT_MEMBER_UPDATED: Final = _keys(**{"from": _USER})

# First level: every update type of app.queues, with the keys grammY filters its object by.
VOCABULARY: Final[Mapping[str, Keys]] = {
    "message": _MESSAGE,
    "edited_message": _MESSAGE,
    "channel_post": _CHANNEL_POST,
    "edited_channel_post": _CHANNEL_POST,
    "inline_query": _NONE,
    "chosen_inline_result": _NONE,
    "callback_query": _keys("data", "game_short_name"),
    "shipping_query": _NONE,
    "pre_checkout_query": _NONE,
    "poll": _NONE,
    "poll_answer": _NONE,
    "my_chat_member": _CHAT_MEMBER_UPDATED,
    "chat_member": _CHAT_MEMBER_UPDATED,
    "chat_join_request": _NONE,
    "chat_boost": _NONE,
    "removed_chat_boost": _NONE,
    "message_reaction": _keys(old_reaction=_REACTION, new_reaction=_REACTION),
    "message_reaction_count": _keys(reactions=_REACTION),
    "business_connection": _keys("can_reply", "is_enabled"),
    "business_message": _MESSAGE,
    "edited_business_message": _MESSAGE,
    "deleted_business_messages": _NONE,
    "purchased_paid_media": _NONE,
    "managed_bot": _NONE,
    "guest_message": _MESSAGE,
}
assert VOCABULARY.keys() == QUEUES.keys(), "every update type of app.queues, and only those"

SHORTCUTS_1: Final = {
    "": ("message", "channel_post"),
    "msg": ("message", "channel_post"),
    "edit": ("edited_message", "edited_channel_post"),
}
SHORTCUTS_2: Final = {
    "": ("entities", "caption_entities"),
    "media": ("photo", "live_photo", "video"),
    "file": (
        "photo", "live_photo", "animation", "audio", "document", "video", "video_note",
        "voice", "sticker",
    ),
}  # fmt: skip
ME: Final = "me"  # the third level that names the bot itself (its id: the token's prefix)


class FilterError(ValueError):
    """A filter query that names nothing grammY knows, with the closest one that it does."""


Path = tuple[str, ...]  # one expanded query: (type,), (type, key) or (type, key, property)


def expand(query: str) -> tuple[Path, ...]:
    """The queries without shortcuts that `query` stands for, as grammY expands them;
    FilterError when it is not a query of the vocabulary."""
    if not query:
        raise FilterError(
            "an empty filter query names nothing; leave `filter` out for every update"
        )
    parts = query.split(":")
    if len(parts) > 3:
        raise FilterError(_unknown(query, "a filter query has at most three levels"))
    first = parts[0]
    second = parts[1] if len(parts) > 1 else None
    third = parts[2] if len(parts) > 2 else None
    paths: list[tuple[str, str | None, str | None]] = [(first, second, third)]
    if first in SHORTCUTS_1 and (first or second or third):
        paths = [(name, second, third) for name in SHORTCUTS_1[first]]
        if second is not None and not (second in SHORTCUTS_2 and (second or third)):
            # `:new_chat_members` is a message's alone: keep the expansions that know it
            paths = [path for path in paths if second in VOCABULARY[path[0]]]
    if second in SHORTCUTS_2 and (second or third):
        paths = [(one, name, three) for one, _, three in paths for name in SHORTCUTS_2[second]]
        if third is not None:
            paths = [path for path in paths if third in _level(path[0], path[1])]
    if not paths:
        raise FilterError(_unknown(query, "its shortcuts expand to no known query"))
    found = []
    for one, two, three in paths:
        if one not in VOCABULARY:
            raise FilterError(_unknown(query, f"{one!r} is not an update type"))
        if two is not None and two not in VOCABULARY[one]:
            raise FilterError(_unknown(query, f"{one} has no key {two!r} to filter by"))
        if three is not None and three not in _level(one, two):
            raise FilterError(_unknown(query, f"{one}:{two} has no property {three!r}"))
        found.append(tuple(part for part in (one, two, three) if part is not None))
    return tuple(found)


def _level(first: str, second: str | None) -> Keys:
    return VOCABULARY.get(first, _NONE).get(second or "", _NONE)


def _unknown(query: str, why: str) -> str:
    close = difflib.get_close_matches(query, known_queries(), n=1, cutoff=0.0)
    hint = f"; the closest known query is {close[0]!r}" if close else ""
    return f"unknown filter query {query!r}: {why}{hint}"


@functools.cache
def known_queries() -> tuple[str, ...]:
    """Every query of the vocabulary without shortcuts, and the shortcuts' own first and
    second levels (`msg`, `edit`, `:text`, `message:media`...): what an error suggests from."""
    found: set[str] = set(SHORTCUTS_1) - {""}
    for first, keys in VOCABULARY.items():
        found.add(first)
        for second, properties in keys.items():
            found.add(f"{first}:{second}")
            found.update(f"{first}:{second}:{third}" for third in properties)
        found.update(
            f"{first}:{short}"
            for short, names in SHORTCUTS_2.items()
            if short and any(name in keys for name in names)
        )
    for short in SHORTCUTS_1:
        found.update(f"{short}:{second}" for second in _MESSAGE)
        found.update(f"{short}:{second}" for second in SHORTCUTS_2)
    return tuple(sorted(found))


@dataclass(frozen=True)
class UpdateFilter:
    """A destination's filter: any of `include` (every update when it is empty) and none of
    `exclude`, each a list of filter queries. `bot_id` is the bot's own id, for `me`."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    bot_id: int | None = None
    _tests: tuple[Tests, Tests] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for query in (*self.include, *self.exclude):
            paths = expand(query)
            if self.bot_id is None and any(path[2:] == (ME,) for path in paths):
                raise FilterError(
                    f"filter query {query!r}: `me` is the bot's own id, read from its "
                    "bot_token; set bot_token"
                )
        object.__setattr__(self, "_tests", (_tests(self.include), _tests(self.exclude)))

    @property
    def everything(self) -> bool:
        return not self.include and not self.exclude

    def update_types(self) -> frozenset[str] | None:
        """The update types this filter can match; None: any."""
        if not self.include:
            return None
        return frozenset(path[0] for query in self.include for path in expand(query))

    def matches(self, update_type: str | None, payload: Any) -> bool:
        """Whether the update whose type is `update_type` and object `payload` passes."""
        include, exclude = self._tests
        if include and not _passes(include.get(update_type or ""), payload, self.bot_id):
            return False
        return not (exclude and _passes(exclude.get(update_type or ""), payload, self.bot_id))


# Per update type, the tests of the queries that name it: None for the type alone, else its
# key and the key's property (None: the key alone).
Test = tuple[str, str | None] | None
Tests = Mapping[str, tuple[Test, ...]]


def _tests(queries: Iterable[str]) -> Tests:
    found: dict[str, list[Test]] = {}
    for query in queries:
        for path in expand(query):
            test = None if len(path) == 1 else (path[1], path[2] if len(path) == 3 else None)
            found.setdefault(path[0], []).append(test)
    return {first: tuple(tests) for first, tests in found.items()}


def _passes(tests: tuple[Test, ...] | None, payload: Any, bot_id: int | None) -> bool:
    """Whether `payload`, the update's object, passes any of `tests` (grammY's rules: the
    object not null for the type alone; truthy and holding the key, not null, for a key; the
    key's value truthy and having the property for a property)."""
    if tests is None or payload is None:
        return False
    for test in tests:
        if test is None:
            return True
        if not (_truthy(payload) and isinstance(payload, Mapping)):
            continue
        key, prop = test
        value = payload.get(key)
        if prop is None:
            if value is not None:
                return True
        elif _truthy(value) and _has(value, prop, bot_id):
            return True
    return False


def _has(value: Any, prop: str, bot_id: int | None) -> bool:
    """Whether `value`, or any item of it when it is a list, has `prop` (grammY's third
    level): the property truthy or a `type` equal to it; `me`: the bot's own id."""
    for item in value if isinstance(value, list) else (value,):
        if not isinstance(item, Mapping):
            continue
        if prop == ME:
            if bot_id is not None and item.get("id") == bot_id:
                return True
        elif _truthy(item.get(prop)) or item.get("type") == prop:
            return True
    return False


def _truthy(value: Any) -> bool:
    """JavaScript's truthiness, which grammY's matching relies on: objects and lists are true
    even when empty; null, false, 0 and "" are not."""
    if value is None or value is False or value == "":
        return False
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value != 0
    return True
