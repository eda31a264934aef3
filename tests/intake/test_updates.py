"""classify(): the update type and Telegram's own webhook queue of every update, and of bad shapes.

Each update is a JSON string as Telegram sends it, parsed with json.loads, so the key order is
the real one. Every expected queue key is written out by hand from Telegram's rule
(docs/research/telegram-bot-api-queues.md: the Bot API server's `webhook_queue_id` is an id of
the update plus a category times 2^33; a poll's is its id as it stands), never computed with
`app.queues`: a test that recomputed the key with the code under test could not fail.
"""

from __future__ import annotations

import itertools
import json
from types import MappingProxyType
from typing import Any

import pytest

from app.intake.updates import classify
from app.queues import OPT_IN, QUEUES

# A user, their private chat (same id), an admin, the bot, a supergroup, a basic group and a
# channel.
USER = (
    '{"id": 123456789, "is_bot": false, "first_name": "Anna", "username": "anna_k",'
    ' "language_code": "en"}'
)
ADMIN = '{"id": 987654321, "is_bot": false, "first_name": "Ben", "username": "ben_admin"}'
BOT = '{"id": 7012345678, "is_bot": true, "first_name": "Intake Bot", "username": "intake_bot"}'
PRIVATE = '{"id": 123456789, "first_name": "Anna", "username": "anna_k", "type": "private"}'
SUPERGROUP = (
    '{"id": -1001234567890, "title": "Intake Testers", "username": "intake_testers",'
    ' "type": "supergroup"}'
)
GROUP = (
    '{"id": -4012345678, "title": "Family", "type": "group",'
    ' "all_members_are_administrators": true}'
)
CHANNEL = (
    '{"id": -1009876543210, "title": "Intake News", "username": "intake_news", "type": "channel"}'
)
POLL_ID = "5366306404457152513"


def _fill(template: str) -> str:
    return (
        template.replace("$USER", USER)
        .replace("$ADMIN", ADMIN)
        .replace("$BOT", BOT)
        .replace("$PRIVATE", PRIVATE)
        .replace("$SUPERGROUP", SUPERGROUP)
        .replace("$GROUP", GROUP)
        .replace("$CHANNEL", CHANNEL)
    )


def _type_of(update: dict[str, Any]) -> str | None:
    return next((key for key in update if key != "update_id"), None)


# Telegram's facts, copied from the research memo (Client.cpp, each `add_update` call), not
# from app.queues: the field of the update's object holding the id, and the category (None:
# the poll id string is the queue id itself). test_the_table_is_telegrams checks the code
# against it row by row.
TELEGRAM: dict[str, tuple[tuple[str, ...], int | None]] = {
    "message": (("chat", "id"), 0),
    "edited_message": (("chat", "id"), 0),
    "channel_post": (("chat", "id"), 0),
    "edited_channel_post": (("chat", "id"), 0),
    "inline_query": (("from", "id"), 1),
    "chosen_inline_result": (("from", "id"), 2),
    "callback_query": (("from", "id"), 3),
    "shipping_query": (("from", "id"), 4),
    "pre_checkout_query": (("from", "id"), 4),
    "poll": (("id",), None),
    "poll_answer": (("poll_id",), None),
    "my_chat_member": (("chat", "id"), 5),
    "chat_member": (("old_chat_member", "user", "id"), 6),
    "chat_join_request": (("from", "id"), 6),
    "chat_boost": (("chat", "id"), 7),
    "removed_chat_boost": (("chat", "id"), 7),
    "message_reaction": (("chat", "id"), 8),
    "message_reaction_count": (("chat", "id"), 9),
    "business_connection": (("user", "id"), 10),
    "business_message": (("chat", "id"), 11),
    "edited_business_message": (("chat", "id"), 11),
    "deleted_business_messages": (("chat", "id"), 11),
    "purchased_paid_media": (("from", "id"), 12),
    "managed_bot": (("user", "id"), 13),
    "guest_message": (("chat", "id"), 12),
}


REALISTIC = [
    pytest.param(
        """{"update_id": 915300001, "message": {"message_id": 52, "from": $USER,
        "chat": $PRIVATE, "date": 1718000000, "text": "/start",
        "entities": [{"offset": 0, "length": 6, "type": "bot_command"}]}}""",
        ("message", "123456789"),
        id="message-private-chat",
    ),
    pytest.param(
        """{"update_id": 915300002, "message": {"message_id": 1044, "from": $USER,
        "chat": $SUPERGROUP, "date": 1718000010, "message_thread_id": 1040,
        "is_topic_message": true, "text": "hello, group"}}""",
        ("message", "-1001234567890"),
        id="message-supergroup-negative-id",
    ),
    pytest.param(
        """{"update_id": 915300003, "edited_message": {"message_id": 77, "from": $USER,
        "chat": $GROUP, "date": 1718000020, "edit_date": 1718000080, "text": "fixed typo"}}""",
        ("edited_message", "-4012345678"),
        id="edited_message-basic-group",
    ),
    pytest.param(
        """{"update_id": 915300004, "channel_post": {"message_id": 310, "sender_chat": $CHANNEL,
        "chat": $CHANNEL, "date": 1718000030, "text": "Release 1.2 is out"}}""",
        ("channel_post", "-1009876543210"),
        id="channel_post",
    ),
    pytest.param(
        """{"update_id": 915300005, "edited_channel_post": {"message_id": 310,
        "sender_chat": $CHANNEL, "chat": $CHANNEL, "date": 1718000030,
        "edit_date": 1718000300, "text": "Release 1.2.1 is out"}}""",
        ("edited_channel_post", "-1009876543210"),
        id="edited_channel_post",
    ),
    pytest.param(
        """{"update_id": 915300006, "inline_query": {"id": "530255463125768400",
        "from": $USER, "chat_type": "sender", "query": "cats", "offset": ""}}""",
        ("inline_query", str(123456789 + 1 * 2**33)),
        id="inline_query",
    ),
    pytest.param(
        """{"update_id": 915300007, "chosen_inline_result": {"result_id": "cat-7",
        "from": $USER, "query": "cats", "inline_message_id": "AgAAAJwBAAB1UWkHbl5Sl1e5ah1"}}""",
        ("chosen_inline_result", str(123456789 + 2 * 2**33)),
        id="chosen_inline_result",
    ),
    pytest.param(
        # The button's message is in a group; the queue is still the user who pressed it.
        """{"update_id": 915300008, "callback_query": {"id": "530255463125768312",
        "from": $USER, "message": {"message_id": 1050, "from": $BOT, "chat": $SUPERGROUP,
        "date": 1718000140, "text": "Pick a page",
        "reply_markup": {"inline_keyboard": [[{"text": "2", "callback_data": "page:2"}]]}},
        "chat_instance": "-8271682632112498", "data": "page:2"}}""",
        ("callback_query", str(123456789 + 3 * 2**33)),
        id="callback_query-chat-message-keyed-by-sender",
    ),
    pytest.param(
        """{"update_id": 915300009, "callback_query": {"id": "530255463125768313",
        "from": $USER, "inline_message_id": "AgAAAJwBAAB1UWkHbl5Sl1e5ah0",
        "chat_instance": "4176315212382547180", "data": "vote:yes"}}""",
        ("callback_query", str(123456789 + 3 * 2**33)),
        id="callback_query-inline-message",
    ),
    pytest.param(
        # A button under a message Ben's business account sent to Anna through the bot.
        """{"update_id": 915300010, "callback_query": {"id": "530255463125768314",
        "from": $USER, "message": {"message_id": 9010, "from": $ADMIN, "chat": $PRIVATE,
        "date": 1718000145, "business_connection_id": "AbCdEfGh1234",
        "text": "Pick a time", "reply_markup": {"inline_keyboard": [[
        {"text": "10:00", "callback_data": "slot:10"}]]}},
        "chat_instance": "-3318852391245113", "data": "slot:10"}}""",
        ("callback_query", str(123456789 + 3 * 2**33)),
        id="callback_query-business-message",
    ),
    pytest.param(
        """{"update_id": 915300011, "shipping_query": {"id": "530255463125768500",
        "from": $USER, "invoice_payload": "order-42", "shipping_address": {
        "country_code": "DE", "state": "", "city": "Berlin",
        "street_line1": "Unter den Linden 1", "street_line2": "", "post_code": "10117"}}}""",
        ("shipping_query", str(123456789 + 4 * 2**33)),
        id="shipping_query",
    ),
    pytest.param(
        """{"update_id": 915300012, "pre_checkout_query": {"id": "530255463125768600",
        "from": $USER, "currency": "EUR", "total_amount": 1500,
        "invoice_payload": "order-42", "shipping_option_id": "dhl"}}""",
        ("pre_checkout_query", str(123456789 + 4 * 2**33)),
        id="pre_checkout_query",
    ),
    pytest.param(
        """{"update_id": 915300013, "poll": {"id": "5366306404457152513",
        "question": "Lunch?", "options": [{"text": "Pizza", "voter_count": 3},
        {"text": "Sushi", "voter_count": 2}], "total_voter_count": 5, "is_closed": false,
        "is_anonymous": false, "type": "regular", "allows_multiple_answers": false}}""",
        ("poll", "5366306404457152513"),
        id="poll",
    ),
    pytest.param(
        """{"update_id": 915300014, "poll_answer": {"poll_id": "5366306404457152513",
        "user": $USER, "option_ids": [1], "option_persistent_ids": ["1"]}}""",
        ("poll_answer", "5366306404457152513"),
        id="poll_answer-user",
    ),
    pytest.param(
        # An anonymous chat's vote: `user` is the placeholder @Channel_Bot; the poll decides.
        """{"update_id": 915300015, "poll_answer": {"poll_id": "5366306404457152513",
        "voter_chat": $CHANNEL, "user": {"id": 136817688, "is_bot": true,
        "first_name": "Channel", "username": "Channel_Bot"}, "option_ids": [0],
        "option_persistent_ids": ["0"]}}""",
        ("poll_answer", "5366306404457152513"),
        id="poll_answer-voter_chat",
    ),
    pytest.param(
        """{"update_id": 915300016, "my_chat_member": {"chat": $GROUP, "from": $ADMIN,
        "date": 1718000100, "old_chat_member": {"user": $BOT, "status": "left"},
        "new_chat_member": {"user": $BOT, "status": "member"}}}""",
        ("my_chat_member", str(-4012345678 + 5 * 2**33)),
        id="my_chat_member-added-to-group",
    ),
    pytest.param(
        """{"update_id": 915300017, "my_chat_member": {"chat": $PRIVATE, "from": $USER,
        "date": 1718000110, "old_chat_member": {"user": $BOT, "status": "member"},
        "new_chat_member": {"user": $BOT, "status": "kicked", "until_date": 0}}}""",
        ("my_chat_member", str(123456789 + 5 * 2**33)),
        id="my_chat_member-user-blocked-bot",
    ),
    pytest.param(
        # Ben (`from`) added Anna: the queue is Anna's, not the chat's and not Ben's.
        """{"update_id": 915300018, "chat_member": {"chat": $SUPERGROUP, "from": $ADMIN,
        "date": 1718000090, "old_chat_member": {"user": $USER, "status": "left"},
        "new_chat_member": {"user": $USER, "status": "member"}}}""",
        ("chat_member", str(123456789 + 6 * 2**33)),
        id="chat_member-keyed-by-member",
    ),
    pytest.param(
        """{"update_id": 915300019, "chat_join_request": {"chat": $SUPERGROUP, "from": $USER,
        "user_chat_id": 123456789, "date": 1718000120, "bio": "hi",
        "invite_link": {"invite_link": "https://t.me/+AbCdEfGhIjK...", "creator": $ADMIN,
        "creates_join_request": true, "is_primary": false, "is_revoked": false}}}""",
        ("chat_join_request", str(123456789 + 6 * 2**33)),
        id="chat_join_request",
    ),
    pytest.param(
        """{"update_id": 915300020, "chat_boost": {"chat": $CHANNEL, "boost": {
        "boost_id": "MTIzNDU2Nzg5OjE3MTgwMDAxMzA=", "add_date": 1718000130,
        "expiration_date": 1720592130, "source": {"source": "premium", "user": $USER}}}}""",
        ("chat_boost", str(-1009876543210 + 7 * 2**33)),
        id="chat_boost",
    ),
    pytest.param(
        """{"update_id": 915300021, "removed_chat_boost": {"chat": $CHANNEL,
        "boost_id": "MTIzNDU2Nzg5OjE3MTgwMDAxMzA=", "remove_date": 1720592130,
        "source": {"source": "premium", "user": $USER}}}""",
        ("removed_chat_boost", str(-1009876543210 + 7 * 2**33)),
        id="removed_chat_boost",
    ),
    pytest.param(
        # Ben reacts: the queue is the chat's, not the reacting user's.
        """{"update_id": 915300022, "message_reaction": {"chat": $SUPERGROUP,
        "message_id": 1044, "user": $ADMIN, "date": 1718000060, "old_reaction": [],
        "new_reaction": [{"type": "emoji", "emoji": "\\ud83d\\udc4d"}]}}""",
        ("message_reaction", str(-1001234567890 + 8 * 2**33)),
        id="message_reaction",
    ),
    pytest.param(
        """{"update_id": 915300023, "message_reaction_count": {"chat": $CHANNEL,
        "message_id": 310, "date": 1718000070, "reactions": [
        {"type": {"type": "emoji", "emoji": "\\ud83d\\udd25"}, "total_count": 12},
        {"type": {"type": "custom_emoji", "custom_emoji_id": "5368324170671202286"},
        "total_count": 3}]}}""",
        ("message_reaction_count", str(-1009876543210 + 9 * 2**33)),
        id="message_reaction_count",
    ),
    pytest.param(
        # Ben connects the bot to his business account.
        """{"update_id": 915300024, "business_connection": {"id": "AbCdEfGh1234",
        "user": $ADMIN, "user_chat_id": 987654321, "date": 1718000150, "is_enabled": true,
        "can_reply": true, "rights": {"can_reply": true, "can_read_messages": true}}}""",
        ("business_connection", str(987654321 + 10 * 2**33)),
        id="business_connection",
    ),
    pytest.param(
        # Anna writes to Ben's business account: the chat is Anna's private chat with Ben.
        """{"update_id": 915300025, "business_message": {"message_id": 9001, "from": $USER,
        "chat": $PRIVATE, "date": 1718000040, "business_connection_id": "AbCdEfGh1234",
        "text": "Is the shop open today?"}}""",
        ("business_message", str(123456789 + 11 * 2**33)),
        id="business_message",
    ),
    pytest.param(
        """{"update_id": 915300026, "edited_business_message": {"message_id": 9001,
        "from": $USER, "chat": $PRIVATE, "date": 1718000040, "edit_date": 1718000050,
        "business_connection_id": "AbCdEfGh1234", "text": "Is the shop open tomorrow?"}}""",
        ("edited_business_message", str(123456789 + 11 * 2**33)),
        id="edited_business_message",
    ),
    pytest.param(
        """{"update_id": 915300027, "deleted_business_messages": {
        "business_connection_id": "AbCdEfGh1234", "chat": $PRIVATE,
        "message_ids": [9001, 9002]}}""",
        ("deleted_business_messages", str(123456789 + 11 * 2**33)),
        id="deleted_business_messages",
    ),
    pytest.param(
        """{"update_id": 915300028, "purchased_paid_media": {"from": $USER,
        "paid_media_payload": "album-3"}}""",
        ("purchased_paid_media", str(123456789 + 12 * 2**33)),
        id="purchased_paid_media",
    ),
    pytest.param(
        # Anna created a bot this (manager) bot manages: the queue is Anna's, not the new bot's.
        """{"update_id": 915300029, "managed_bot": {"user": $USER, "bot": {"id": 8123456789,
        "is_bot": true, "first_name": "Anna's Shop", "username": "anna_shop_bot"}}}""",
        ("managed_bot", str(123456789 + 13 * 2**33)),
        id="managed_bot",
    ),
    pytest.param(
        """{"update_id": 915300030, "guest_message": {"message_id": 1060, "from": $USER,
        "chat": $SUPERGROUP, "date": 1718000160, "guest_query_id": "7290815621314785409",
        "text": "@intake_bot summarise the thread"}}""",
        ("guest_message", str(-1001234567890 + 12 * 2**33)),
        id="guest_message-supergroup",
    ),
    pytest.param(
        # Category 12 in a private chat: the same queue as Anna's purchased_paid_media above.
        """{"update_id": 915300031, "guest_message": {"message_id": 60, "from": $USER,
        "chat": $PRIVATE, "date": 1718000170, "guest_query_id": "7290815621314785410",
        "text": "@intake_bot hello"}}""",
        ("guest_message", str(123456789 + 12 * 2**33)),
        id="guest_message-private-chat",
    ),
    pytest.param(
        """{"message": {"message_id": 53, "from": $USER, "chat": $PRIVATE,
        "date": 1718000180, "text": "update_id comes last"}, "update_id": 915300032}""",
        ("message", "123456789"),
        id="update_id-not-first",
    ),
]

# Bodies whose type the table does not know, or that have none.
NO_QUEUE = [
    pytest.param(
        # A type newer than this code (the brief's example: `subscription`, Bot API 10.2). A
        # made-up body with a chat and a sender: still no queue, it is never held back.
        """{"update_id": 915300033, "subscription": {"chat": $SUPERGROUP,
        "from": $USER, "date": 1718000190}}""",
        ("subscription", None),
        id="unknown-newer-type",
    ),
    pytest.param(
        """{"update_id": 915300034, "some_new_update": {"chat": $PRIVATE, "from": $USER}}""",
        ("some_new_update", None),
        id="unknown-type-update_id-first",
    ),
    pytest.param(
        """{"some_new_update": {"chat": $PRIVATE}, "update_id": 915300035}""",
        ("some_new_update", None),
        id="unknown-type-update_id-last",
    ),
    pytest.param('{"update_id": 915300036}', (None, None), id="only-update_id"),
]


@pytest.mark.parametrize(("raw", "expected"), REALISTIC + NO_QUEUE)
def test_classify_realistic_updates(raw: str, expected: tuple[str | None, str | None]) -> None:
    assert classify(json.loads(_fill(raw))) == expected


@pytest.mark.parametrize(("raw", "expected"), REALISTIC)
def test_realistic_keys_follow_telegrams_table(raw: str, expected: tuple[str, str]) -> None:
    """The hand-written key and the test's own table agree: a typo in either shows here."""
    update = json.loads(_fill(raw))
    update_type = _type_of(update)
    assert update_type == expected[0]
    path, category = TELEGRAM[update_type]
    value: Any = update[update_type]
    for field in path:
        value = value[field]
    assert expected[1] == (value if category is None else str(value + category * 2**33))


def test_every_type_of_the_table_has_a_realistic_case() -> None:
    covered = {_type_of(json.loads(_fill(case.values[0]))) for case in REALISTIC}
    assert set(QUEUES) <= covered
    assert covered <= set(TELEGRAM)


def test_the_table_has_every_type_telegram_has() -> None:
    # The 25 public types of Client.cpp's get_update_type_name (custom_event and
    # custom_query are internal and never sent to a bot).
    assert list(QUEUES) == list(TELEGRAM)
    assert len(QUEUES) == 25


@pytest.mark.parametrize("update_type", list(TELEGRAM))
def test_the_table_is_telegrams(update_type: str) -> None:
    queue = QUEUES[update_type]
    assert (queue.path, queue.category) == TELEGRAM[update_type]


def test_opt_in_types_are_telegrams() -> None:
    # Client.h's DEFAULT_ALLOWED_UPDATE_TYPES leaves out exactly these three.
    assert set(OPT_IN) == {"chat_member", "message_reaction", "message_reaction_count"}
    assert set(OPT_IN) <= set(QUEUES)


# One user U = 123456789 everywhere: their private chat has the same id. Some of these never
# happen in a private chat (a channel post, a boost, an anonymous reaction count): the queue
# is arithmetic on the id, whatever the chat, so they show what the categories keep apart.
SAME_ID = {
    "message": '{"message_id": 1, "from": $USER, "chat": $PRIVATE, "date": 1718000000}',
    "edited_message": (
        '{"message_id": 1, "from": $USER, "chat": $PRIVATE, "date": 1718000000,'
        ' "edit_date": 1718000010}'
    ),
    "channel_post": '{"message_id": 2, "chat": $PRIVATE, "date": 1718000000}',
    "edited_channel_post": (
        '{"message_id": 2, "chat": $PRIVATE, "date": 1718000000, "edit_date": 1718000010}'
    ),
    "inline_query": '{"id": "1", "from": $USER, "query": "", "offset": ""}',
    "chosen_inline_result": '{"result_id": "r", "from": $USER, "query": ""}',
    "callback_query": '{"id": "2", "from": $USER, "chat_instance": "1", "data": "x"}',
    "shipping_query": (
        '{"id": "3", "from": $USER, "invoice_payload": "p", "shipping_address": {}}'
    ),
    "pre_checkout_query": (
        '{"id": "4", "from": $USER, "currency": "EUR", "total_amount": 100, "invoice_payload": "p"}'
    ),
    "my_chat_member": (
        '{"chat": $PRIVATE, "from": $USER, "date": 1718000000,'
        ' "old_chat_member": {"user": $BOT, "status": "member"},'
        ' "new_chat_member": {"user": $BOT, "status": "kicked", "until_date": 0}}'
    ),
    "chat_member": (
        '{"chat": $SUPERGROUP, "from": $ADMIN, "date": 1718000000,'
        ' "old_chat_member": {"user": $USER, "status": "member"},'
        ' "new_chat_member": {"user": $USER, "status": "left"}}'
    ),
    "chat_join_request": (
        '{"chat": $SUPERGROUP, "from": $USER, "user_chat_id": 123456789, "date": 1718000000}'
    ),
    "chat_boost": (
        '{"chat": $PRIVATE, "boost": {"boost_id": "b", "add_date": 1718000000,'
        ' "expiration_date": 1720592000, "source": {"source": "premium", "user": $USER}}}'
    ),
    "removed_chat_boost": (
        '{"chat": $PRIVATE, "boost_id": "b", "remove_date": 1720592000,'
        ' "source": {"source": "premium", "user": $USER}}'
    ),
    "message_reaction": (
        '{"chat": $PRIVATE, "message_id": 1, "user": $USER, "date": 1718000000,'
        ' "old_reaction": [], "new_reaction": []}'
    ),
    "message_reaction_count": (
        '{"chat": $PRIVATE, "message_id": 1, "date": 1718000000, "reactions": []}'
    ),
    "business_connection": (
        '{"id": "c", "user": $USER, "user_chat_id": 123456789, "date": 1718000000,'
        ' "is_enabled": true, "can_reply": false}'
    ),
    "business_message": (
        '{"message_id": 3, "from": $USER, "chat": $PRIVATE, "date": 1718000000,'
        ' "business_connection_id": "c"}'
    ),
    "edited_business_message": (
        '{"message_id": 3, "from": $USER, "chat": $PRIVATE, "date": 1718000000,'
        ' "edit_date": 1718000010, "business_connection_id": "c"}'
    ),
    "deleted_business_messages": (
        '{"business_connection_id": "c", "chat": $PRIVATE, "message_ids": [3]}'
    ),
    "purchased_paid_media": '{"from": $USER, "paid_media_payload": "p"}',
    "managed_bot": '{"user": $USER, "bot": $BOT}',
    "guest_message": (
        '{"message_id": 4, "from": $USER, "chat": $PRIVATE, "date": 1718000000,'
        ' "guest_query_id": "g"}'
    ),
}

# The only types that share a queue for the same id: Telegram's own groups.
SHARED = [
    {"message", "edited_message", "channel_post", "edited_channel_post"},  # category 0
    {"shipping_query", "pre_checkout_query"},  # 4
    {"chat_member", "chat_join_request"},  # 6: the member, the user asking to join
    {"chat_boost", "removed_chat_boost"},  # 7
    {"business_message", "edited_business_message", "deleted_business_messages"},  # 11
    # 12 twice: Telegram's quirk, kept because it is Telegram's. A guest message in U's
    # private chat waits behind U's paid-media purchases, and the other way round.
    {"guest_message", "purchased_paid_media"},
]


def _same_id_key(update_type: str) -> str | None:
    update = json.loads(_fill(f'{{"update_id": 1, "{update_type}": {SAME_ID[update_type]}}}'))
    kind, key = classify(update)
    assert kind == update_type
    return key


def test_one_id_in_every_category_gets_distinct_queues_but_telegrams_shared_ones() -> None:
    assert set(SAME_ID) == set(QUEUES) - {"poll", "poll_answer"}
    assert all(group <= set(SAME_ID) for group in SHARED)
    assert sum(len(group) for group in SHARED) == len(set().union(*SHARED))  # disjoint
    keys = {update_type: _same_id_key(update_type) for update_type in SAME_ID}
    assert None not in keys.values()
    for a, b in itertools.combinations(SAME_ID, 2):
        shared = any({a, b} <= group for group in SHARED)
        assert (keys[a] == keys[b]) == shared, (a, b, keys[a], keys[b])
    assert keys["message"] == "123456789"
    assert keys["guest_message"] == keys["purchased_paid_media"] == str(123456789 + 12 * 2**33)
    singles = len(SAME_ID) - sum(len(group) for group in SHARED)
    assert len(set(keys.values())) == singles + len(SHARED)


def test_telegrams_own_arithmetic_collision_is_kept() -> None:
    # User 2^33 + 100's private chat and user 100's inline queries: one sum, so one queue at
    # Telegram (it serialises them), and one here.
    message = {"update_id": 1, "message": {"message_id": 1, "chat": {"id": 2**33 + 100}}}
    inline = {"update_id": 2, "inline_query": {"id": "1", "from": {"id": 100}, "query": ""}}
    assert classify(message) == ("message", "8589934692")
    assert classify(inline) == ("inline_query", "8589934692")


def test_a_group_and_its_reactions_are_three_queues() -> None:
    chat = {"id": -1001234567890, "type": "supergroup"}
    keys = [
        classify({"update_id": 1, "message": {"message_id": 1, "chat": chat}})[1],
        classify({"update_id": 2, "message_reaction": {"message_id": 1, "chat": chat}})[1],
        classify({"update_id": 3, "message_reaction_count": {"message_id": 1, "chat": chat}})[1],
    ]
    assert keys == [
        "-1001234567890",
        str(-1001234567890 + 8 * 2**33),
        str(-1001234567890 + 9 * 2**33),
    ]


def test_a_poll_id_can_meet_a_chat_id() -> None:
    # A poll's queue has no category (Client.cpp 17062): a poll whose id equals a chat's id
    # shares that chat's message queue. Telegram's, kept.
    poll = {"update_id": 1, "poll": {"id": "123456789", "question": "?", "options": []}}
    message = {"update_id": 2, "message": {"message_id": 1, "chat": {"id": 123456789}}}
    assert classify(poll)[1] == classify(message)[1] == "123456789"


def _chat_member(chat_id: int, member_id: int, admin_id: int) -> dict[str, Any]:
    return {
        "update_id": 1,
        "chat_member": {
            "chat": {"id": chat_id, "type": "supergroup"},
            "from": {"id": admin_id, "is_bot": False, "first_name": "Admin"},
            "date": 1718000000,
            "old_chat_member": {"user": {"id": member_id, "is_bot": False}, "status": "left"},
            "new_chat_member": {"user": {"id": member_id, "is_bot": False}, "status": "member"},
        },
    }


def test_chat_member_is_keyed_by_the_member() -> None:
    anna_here = classify(_chat_member(-1001234567890, 123456789, 987654321))
    anna_there = classify(_chat_member(-1005555555555, 123456789, 111111111))
    ben_here = classify(_chat_member(-1001234567890, 987654321, 987654321))
    assert anna_here == anna_there == ("chat_member", str(123456789 + 6 * 2**33))
    assert ben_here == ("chat_member", str(987654321 + 6 * 2**33))
    # Not the chat's (-1001234567890 + 6 * 2^33) and not the acting admin's.
    assert anna_here[1] != str(-1001234567890 + 6 * 2**33)


def test_chat_member_reads_the_old_member_only() -> None:
    update = _chat_member(-1001234567890, 123456789, 987654321)
    update["chat_member"]["new_chat_member"]["user"]["id"] = 555
    assert classify(update) == ("chat_member", str(123456789 + 6 * 2**33))
    del update["chat_member"]["old_chat_member"]
    assert classify(update) == ("chat_member", None)


def _poll(poll_id: Any) -> dict[str, Any]:
    return {
        "update_id": 1,
        "poll": {"id": poll_id, "question": "Lunch?", "options": [], "is_closed": False},
    }


def _poll_answer(poll_id: Any, voter: dict[str, Any] | None = None) -> dict[str, Any]:
    voter = {"user": {"id": 123456789, "is_bot": False}} if voter is None else voter
    return {"update_id": 2, "poll_answer": {"poll_id": poll_id, **voter, "option_ids": [0]}}


def test_a_poll_and_its_answers_share_a_queue() -> None:
    assert classify(_poll(POLL_ID)) == ("poll", POLL_ID)
    anna = classify(_poll_answer(POLL_ID))
    ben = classify(_poll_answer(POLL_ID, {"user": {"id": 987654321, "is_bot": False}}))
    channel = classify(_poll_answer(POLL_ID, {"voter_chat": {"id": -1009876543210}}))
    nobody = classify(_poll_answer(POLL_ID, {}))  # the voter plays no part
    assert anna == ben == channel == nobody == ("poll_answer", POLL_ID)
    assert classify(_poll("5366306404457152514"))[1] == "5366306404457152514"
    assert classify(_poll_answer("5366306404457152514"))[1] != POLL_ID


@pytest.mark.parametrize(
    "poll_id",
    ["0", "7", "-5", "9223372036854775807", "-9223372036854775808", POLL_ID],
)
def test_a_canonical_poll_id_is_the_key(poll_id: str) -> None:
    assert classify(_poll(poll_id)) == ("poll", poll_id)
    assert classify(_poll_answer(poll_id)) == ("poll_answer", poll_id)


@pytest.mark.parametrize(
    "poll_id",
    [
        "007",
        "-0",
        "12a",
        "",
        "+5",
        " 5",
        "5 ",
        "5\n",
        "1_000",
        "5.0",
        "\u0661\u0662\u0663",  # Arabic-Indic digits: int() takes them, Telegram never sends them
        str(2**63),
        str(-(2**63) - 1),
        "12345678901234567890",
        int(POLL_ID),
        5,
        5.0,
        True,
        None,
        [POLL_ID],
        {"id": POLL_ID},
    ],
    ids=repr,
)
def test_a_non_canonical_poll_id_gets_no_queue(poll_id: Any) -> None:
    assert classify(_poll(poll_id)) == ("poll", None)
    assert classify(_poll_answer(poll_id)) == ("poll_answer", None)


MALFORMED = [
    pytest.param(
        '{"update_id": 1, "message": {"message_id": 5, "date": 1718000000}}',
        ("message", None),
        id="message-without-chat",
    ),
    pytest.param(
        '{"update_id": 1, "message": {"message_id": 5,'
        ' "chat": {"id": "123456789", "type": "private"}}}',
        ("message", None),
        id="chat-id-string",
    ),
    pytest.param(
        '{"update_id": 1, "message": {"message_id": 5, "chat": {"id": true, "type": "private"}}}',
        ("message", None),
        id="chat-id-bool",
    ),
    pytest.param(
        '{"update_id": 1, "message": {"message_id": 5,'
        ' "chat": {"id": 123456789.0, "type": "private"}}}',
        ("message", None),
        id="chat-id-float",
    ),
    pytest.param(
        '{"update_id": 1, "message": {"message_id": 5, "chat": {"id": 1e9, "type": "group"}}}',
        ("message", None),
        id="chat-id-exponent-float",
    ),
    pytest.param(
        '{"update_id": 1, "message": {"message_id": 5, "chat": {"id": null, "type": "private"}}}',
        ("message", None),
        id="chat-id-null",
    ),
    pytest.param(
        '{"update_id": 1, "message": {"message_id": 5, "chat": {"type": "private"}}}',
        ("message", None),
        id="chat-without-id",
    ),
    pytest.param(
        '{"update_id": 1, "message": {"message_id": 5, "chat": 123456789}}',
        ("message", None),
        id="chat-is-a-number",
    ),
    pytest.param(
        '{"update_id": 1, "message": {"message_id": 5, "chat": [123456789]}}',
        ("message", None),
        id="chat-is-a-list",
    ),
    pytest.param(
        '{"update_id": 1, "message": {"message_id": 5, "chat": "123456789"}}',
        ("message", None),
        id="chat-is-a-string",
    ),
    pytest.param(
        '{"update_id": 1, "message": [1, 2, 3]}', ("message", None), id="message-is-a-list"
    ),
    pytest.param(
        '{"update_id": 1, "message": "hello"}', ("message", None), id="message-is-a-string"
    ),
    pytest.param('{"update_id": 1, "message": null}', ("message", None), id="message-is-null"),
    pytest.param(
        '{"update_id": 1, "message": {"chat": {"id": 18446744073709551616}}}',
        ("message", None),
        id="chat-id-beyond-64-bits",
    ),
    pytest.param(
        '{"update_id": 1, "message": {"chat": {"id": -9223372036854775808}}}',
        ("message", None),
        id="chat-id-min-int64-beyond-2^53",
    ),
    pytest.param(
        '{"update_id": 1, "message": {"chat": {"id": 9007199254740992}}}',
        ("message", None),
        id="chat-id-2^53",
    ),
    pytest.param(
        '{"update_id": 1, "callback_query": {"id": "5", "data": "x"}}',
        ("callback_query", None),
        id="callback_query-without-from",
    ),
    pytest.param(
        # The chat of the button's message is no fallback for a missing sender.
        '{"update_id": 1, "callback_query": {"id": "5", "message": {"message_id": 1,'
        ' "chat": {"id": 123456789}}, "data": "x"}}',
        ("callback_query", None),
        id="callback_query-without-from-but-with-chat",
    ),
    pytest.param(
        '{"update_id": 1, "inline_query": {"id": "5", "from": {"id": false}}}',
        ("inline_query", None),
        id="inline_query-from-id-bool",
    ),
    pytest.param(
        '{"update_id": 1, "inline_query": {"id": "5", "from": [123456789]}}',
        ("inline_query", None),
        id="inline_query-from-is-a-list",
    ),
    pytest.param(
        '{"update_id": 1, "chat_member": {"chat": {"id": -1001234567890},'
        ' "from": {"id": 987654321}, "old_chat_member": [{"user": {"id": 123456789}}]}}',
        ("chat_member", None),
        id="chat_member-old_chat_member-is-a-list",
    ),
    pytest.param(
        '{"update_id": 1, "chat_member": {"chat": {"id": -1001234567890},'
        ' "from": {"id": 987654321}, "old_chat_member": {"user": "123456789"}}}',
        ("chat_member", None),
        id="chat_member-user-is-a-string",
    ),
    pytest.param(
        # Neither the chat nor the acting admin stands in for a missing member.
        '{"update_id": 1, "chat_member": {"chat": {"id": -1001234567890},'
        ' "from": {"id": 987654321}, "date": 1718000000}}',
        ("chat_member", None),
        id="chat_member-without-members",
    ),
    pytest.param(
        '{"update_id": 1, "chat_join_request": {"chat": {"id": -1001234567890},'
        ' "user_chat_id": 123456789, "date": 1718000000}}',
        ("chat_join_request", None),
        id="chat_join_request-without-from-not-user_chat_id",
    ),
    pytest.param(
        '{"update_id": 1, "business_connection": {"id": "c", "user": {"id": "987654321"},'
        ' "user_chat_id": 987654321}}',
        ("business_connection", None),
        id="business_connection-user-id-string",
    ),
    pytest.param(
        '{"update_id": 1, "managed_bot": {"bot": {"id": 8123456789, "is_bot": true}}}',
        ("managed_bot", None),
        id="managed_bot-without-user-not-bot",
    ),
    pytest.param(
        '{"update_id": 1, "poll_answer": {"user": {"id": 123456789}, "option_ids": [0]}}',
        ("poll_answer", None),
        id="poll_answer-without-poll_id-not-user",
    ),
    pytest.param(
        '{"update_id": 1, "poll_answer": []}', ("poll_answer", None), id="poll_answer-is-a-list"
    ),
    pytest.param(
        '{"update_id": 1, "poll": {"question": "?", "options": []}}',
        ("poll", None),
        id="poll-without-id",
    ),
    pytest.param(
        '{"update_id": 1, "purchased_paid_media": ["from", 123456789]}',
        ("purchased_paid_media", None),
        id="purchased_paid_media-is-a-list",
    ),
    pytest.param(
        '{"update_id": 1, "some_new_update": 42}',
        ("some_new_update", None),
        id="unknown-type-scalar-payload",
    ),
    pytest.param("{}", (None, None), id="empty-object"),
]


@pytest.mark.parametrize(("raw", "expected"), MALFORMED)
def test_classify_malformed_shapes_never_raise(
    raw: str, expected: tuple[str | None, str | None]
) -> None:
    assert classify(json.loads(raw)) == expected


# A type whose id is a chat's, one whose id is a sender's, and the nested member's.
BOUNDED = [
    pytest.param("message", ("chat",), 0, id="message"),
    pytest.param("inline_query", ("from",), 1, id="inline_query"),
    pytest.param("chat_member", ("old_chat_member", "user"), 6, id="chat_member"),
    pytest.param("managed_bot", ("user",), 13, id="managed_bot"),
]


def _with_id(update_type: str, path: tuple[str, ...], value: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {"id": value}
    for field in reversed(path):
        payload = {field: payload}
    return {"update_id": 1, update_type: payload}


@pytest.mark.parametrize(("update_type", "path", "category"), BOUNDED)
@pytest.mark.parametrize("value", [2**53 - 1, -(2**53 - 1)], ids=["max", "min"])
def test_ids_at_the_bounds_are_accepted(
    update_type: str, path: tuple[str, ...], category: int, value: int
) -> None:
    # 2^53 - 1 = 9007199254740991: the widest integer a double holds exactly.
    assert value in (9007199254740991, -9007199254740991)
    expected = str(value + category * 2**33)
    assert classify(_with_id(update_type, path, value)) == (update_type, expected)


@pytest.mark.parametrize(("update_type", "path", "category"), BOUNDED)
@pytest.mark.parametrize(
    "value",
    [2**53, -(2**53), 2**63 - 1, -(2**63), 2**64],
    ids=["2^53", "-2^53", "int64-max", "int64-min", "2^64"],
)
def test_ids_beyond_the_bounds_are_refused(
    update_type: str, path: tuple[str, ...], category: int, value: int
) -> None:
    assert classify(_with_id(update_type, path, value)) == (update_type, None)


@pytest.mark.parametrize("update_type", list(TELEGRAM))
@pytest.mark.parametrize("value", [True, False], ids=["true", "false"])
def test_a_bool_is_never_an_id(update_type: str, value: bool) -> None:
    path, _ = TELEGRAM[update_type]
    payload: Any = value
    for field in reversed(path):
        payload = {field: payload}
    assert classify({"update_id": 1, update_type: payload}) == (update_type, None)


def test_the_first_type_key_wins() -> None:
    # Telegram sends one; if a body held two, the first beside update_id is the type.
    update = json.loads(
        '{"update_id": 1, "inline_query": {"from": {"id": 5}}, "message": {"chat": {"id": 5}}}'
    )
    assert classify(update) == ("inline_query", str(5 + 1 * 2**33))


def test_classify_accepts_any_mapping() -> None:
    chat: Any = MappingProxyType({"id": -1001234567890, "type": "supergroup"})
    update = MappingProxyType({"update_id": 7, "message": MappingProxyType({"chat": chat})})
    assert classify(update) == ("message", "-1001234567890")
    member = MappingProxyType({"user": MappingProxyType({"id": 123456789}), "status": "left"})
    update = MappingProxyType(
        {"update_id": 8, "chat_member": MappingProxyType({"old_chat_member": member})}
    )
    assert classify(update) == ("chat_member", str(123456789 + 6 * 2**33))


@pytest.mark.parametrize(
    "body",
    [
        '{"update_id": 1, "\\u0000": {"chat": {"id": 5}}}',
        '{"update_id": 1, "Message": {"chat": {"id": 5}}}',
        '{"update_id": 1, "MESSAGE": {"chat": {"id": 5}}}',
        '{"update_id": 1, "editedMessage": {"chat": {"id": 5}}}',
        '{"update_id": 1, "edited-message": {"chat": {"id": 5}}}',
        '{"update_id": 1, "message ": {"chat": {"id": 5}}}',
        '{"update_id": 1, "_message": {"chat": {"id": 5}}}',
        '{"update_id": 1, "1message": {"chat": {"id": 5}}}',
        '{"update_id": 1, "": {"chat": {"id": 5}}}',
        '{"update_id": 1, "m\\u00e9ssage": {"chat": {"id": 5}}}',
        '{"update_id": 1, "' + "x" * 65 + '": {}}',
    ],
    ids=[
        "nul",
        "capitalised",
        "upper-case",
        "camel-case",
        "dash",
        "trailing-space",
        "leading-underscore",
        "leading-digit",
        "empty",
        "non-ascii",
        "too-long",
    ],
)
def test_classify_keeps_an_odd_type_name_out_of_the_columns(body: str) -> None:
    assert classify(json.loads(body)) == (None, None)


def test_a_type_name_of_64_characters_is_kept() -> None:
    name = "x" * 64
    assert classify({"update_id": 1, name: {}}) == (name, None)
