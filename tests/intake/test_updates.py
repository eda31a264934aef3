"""classify(): the update type and delivery queue of every Bot API update, and of bad shapes.

Each update is a JSON string as Telegram sends it, parsed with json.loads, so the key order is
the real one.
"""

from __future__ import annotations

import json
from types import MappingProxyType
from typing import Any

import pytest

from app.intake.updates import CHAT_KEYED, SENDER_KEYED, classify

# A user, their private chat (same id), a supergroup, a basic group and a channel.
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
        """{"update_id": 915300006, "business_message": {"message_id": 9001, "from": $USER,
        "chat": $PRIVATE, "date": 1718000040, "business_connection_id": "AbCdEfGh1234",
        "text": "Is the shop open today?"}}""",
        ("business_message", "123456789"),
        id="business_message",
    ),
    pytest.param(
        """{"update_id": 915300007, "edited_business_message": {"message_id": 9001,
        "from": $USER, "chat": $PRIVATE, "date": 1718000040, "edit_date": 1718000050,
        "business_connection_id": "AbCdEfGh1234", "text": "Is the shop open tomorrow?"}}""",
        ("edited_business_message", "123456789"),
        id="edited_business_message",
    ),
    pytest.param(
        """{"update_id": 915300008, "deleted_business_messages": {
        "business_connection_id": "AbCdEfGh1234", "chat": $PRIVATE,
        "message_ids": [9001, 9002]}}""",
        ("deleted_business_messages", "123456789"),
        id="deleted_business_messages",
    ),
    pytest.param(
        """{"update_id": 915300009, "message_reaction": {"chat": $SUPERGROUP,
        "message_id": 1044, "user": $ADMIN, "date": 1718000060, "old_reaction": [],
        "new_reaction": [{"type": "emoji", "emoji": "\\ud83d\\udc4d"}]}}""",
        ("message_reaction", "-1001234567890"),
        id="message_reaction",
    ),
    pytest.param(
        """{"update_id": 915300010, "message_reaction_count": {"chat": $CHANNEL,
        "message_id": 310, "date": 1718000070, "reactions": [
        {"type": {"type": "emoji", "emoji": "\\ud83d\\udd25"}, "total_count": 12},
        {"type": {"type": "custom_emoji", "custom_emoji_id": "5368324170671202286"},
        "total_count": 3}]}}""",
        ("message_reaction_count", "-1009876543210"),
        id="message_reaction_count",
    ),
    pytest.param(
        """{"update_id": 915300011, "chat_member": {"chat": $SUPERGROUP, "from": $ADMIN,
        "date": 1718000090, "old_chat_member": {"user": $USER, "status": "left"},
        "new_chat_member": {"user": $USER, "status": "member"}}}""",
        ("chat_member", "-1001234567890"),
        id="chat_member",
    ),
    pytest.param(
        """{"update_id": 915300012, "my_chat_member": {"chat": $GROUP, "from": $ADMIN,
        "date": 1718000100, "old_chat_member": {"user": $BOT, "status": "left"},
        "new_chat_member": {"user": $BOT, "status": "member"}}}""",
        ("my_chat_member", "-4012345678"),
        id="my_chat_member",
    ),
    pytest.param(
        """{"update_id": 915300013, "my_chat_member": {"chat": $PRIVATE, "from": $USER,
        "date": 1718000110, "old_chat_member": {"user": $BOT, "status": "member"},
        "new_chat_member": {"user": $BOT, "status": "kicked", "until_date": 0}}}""",
        ("my_chat_member", "123456789"),
        id="my_chat_member-user-blocked-bot",
    ),
    pytest.param(
        """{"update_id": 915300014, "chat_join_request": {"chat": $SUPERGROUP, "from": $USER,
        "user_chat_id": 123456789, "date": 1718000120, "bio": "hi",
        "invite_link": {"invite_link": "https://t.me/+AbCdEfGhIjK...", "creator": $ADMIN,
        "creates_join_request": true, "is_primary": false, "is_revoked": false}}}""",
        ("chat_join_request", "-1001234567890"),
        id="chat_join_request",
    ),
    pytest.param(
        """{"update_id": 915300015, "chat_boost": {"chat": $CHANNEL, "boost": {
        "boost_id": "MTIzNDU2Nzg5OjE3MTgwMDAxMzA=", "add_date": 1718000130,
        "expiration_date": 1720592130, "source": {"source": "premium", "user": $USER}}}}""",
        ("chat_boost", "-1009876543210"),
        id="chat_boost",
    ),
    pytest.param(
        """{"update_id": 915300016, "removed_chat_boost": {"chat": $CHANNEL,
        "boost_id": "MTIzNDU2Nzg5OjE3MTgwMDAxMzA=", "remove_date": 1720592130,
        "source": {"source": "premium", "user": $USER}}}""",
        ("removed_chat_boost", "-1009876543210"),
        id="removed_chat_boost",
    ),
    pytest.param(
        # The button's message is in a group; the queue is still the user who pressed it.
        """{"update_id": 915300017, "callback_query": {"id": "530255463125768312",
        "from": $USER, "message": {"message_id": 1050, "from": $BOT, "chat": $SUPERGROUP,
        "date": 1718000140, "text": "Pick a page",
        "reply_markup": {"inline_keyboard": [[{"text": "2", "callback_data": "page:2"}]]}},
        "chat_instance": "-8271682632112498", "data": "page:2"}}""",
        ("callback_query", "123456789"),
        id="callback_query-keyed-by-sender-not-chat",
    ),
    pytest.param(
        """{"update_id": 915300018, "callback_query": {"id": "530255463125768313",
        "from": $USER, "inline_message_id": "AgAAAJwBAAB1UWkHbl5Sl1e5ah0",
        "chat_instance": "4176315212382547180", "data": "vote:yes"}}""",
        ("callback_query", "123456789"),
        id="callback_query-inline-message",
    ),
    pytest.param(
        """{"update_id": 915300019, "inline_query": {"id": "530255463125768400",
        "from": $USER, "chat_type": "sender", "query": "cats", "offset": ""}}""",
        ("inline_query", "123456789"),
        id="inline_query",
    ),
    pytest.param(
        """{"update_id": 915300020, "chosen_inline_result": {"result_id": "cat-7",
        "from": $USER, "query": "cats", "inline_message_id": "AgAAAJwBAAB1UWkHbl5Sl1e5ah1"}}""",
        ("chosen_inline_result", "123456789"),
        id="chosen_inline_result",
    ),
    pytest.param(
        """{"update_id": 915300021, "shipping_query": {"id": "530255463125768500",
        "from": $USER, "invoice_payload": "order-42", "shipping_address": {
        "country_code": "DE", "state": "", "city": "Berlin",
        "street_line1": "Unter den Linden 1", "street_line2": "", "post_code": "10117"}}}""",
        ("shipping_query", "123456789"),
        id="shipping_query",
    ),
    pytest.param(
        """{"update_id": 915300022, "pre_checkout_query": {"id": "530255463125768600",
        "from": $USER, "currency": "EUR", "total_amount": 1500,
        "invoice_payload": "order-42", "shipping_option_id": "dhl"}}""",
        ("pre_checkout_query", "123456789"),
        id="pre_checkout_query",
    ),
    pytest.param(
        """{"update_id": 915300023, "poll_answer": {"poll_id": "5366306404457152513",
        "user": $USER, "option_ids": [1]}}""",
        ("poll_answer", "123456789"),
        id="poll_answer-user",
    ),
    pytest.param(
        # An anonymous chat's vote: `user` is the placeholder @Channel_Bot, the chat decides.
        """{"update_id": 915300024, "poll_answer": {"poll_id": "5366306404457152513",
        "voter_chat": $CHANNEL, "user": {"id": 136817688, "is_bot": true,
        "first_name": "Channel", "username": "Channel_Bot"}, "option_ids": [0]}}""",
        ("poll_answer", "-1009876543210"),
        id="poll_answer-voter_chat-with-placeholder-user",
    ),
    pytest.param(
        """{"update_id": 915300025, "poll_answer": {"poll_id": "5366306404457152513",
        "voter_chat": $SUPERGROUP, "option_ids": []}}""",
        ("poll_answer", "-1001234567890"),
        id="poll_answer-voter_chat-only-retracted",
    ),
    pytest.param(
        """{"update_id": 915300026, "poll": {"id": "5366306404457152513",
        "question": "Lunch?", "options": [{"text": "Pizza", "voter_count": 3},
        {"text": "Sushi", "voter_count": 2}], "total_voter_count": 5, "is_closed": false,
        "is_anonymous": true, "type": "regular", "allows_multiple_answers": false}}""",
        ("poll", None),
        id="poll-no-queue",
    ),
    pytest.param(
        """{"update_id": 915300027, "purchased_paid_media": {"from": $USER,
        "paid_media_payload": "album-3"}}""",
        ("purchased_paid_media", None),
        id="purchased_paid_media-no-queue",
    ),
    pytest.param(
        """{"update_id": 915300028, "business_connection": {"id": "AbCdEfGh1234",
        "user": $USER, "user_chat_id": 123456789, "date": 1718000150,
        "can_reply": true, "is_enabled": true}}""",
        ("business_connection", None),
        id="business_connection-no-queue",
    ),
    pytest.param(
        """{"update_id": 915300029, "some_new_update": {"chat": $SUPERGROUP,
        "from": $USER, "date": 1718000160}}""",
        ("some_new_update", None),
        id="unknown-future-type-no-queue",
    ),
    pytest.param(
        """{"message": {"message_id": 53, "from": $USER, "chat": $PRIVATE,
        "date": 1718000170, "text": "update_id comes last"}, "update_id": 915300030}""",
        ("message", "123456789"),
        id="update_id-not-first",
    ),
    pytest.param(
        '{"update_id": 915300031}',
        (None, None),
        id="only-update_id",
    ),
]


@pytest.mark.parametrize(("raw", "expected"), REALISTIC)
def test_classify_realistic_updates(raw: str, expected: tuple[str | None, str | None]) -> None:
    assert classify(json.loads(_fill(raw))) == expected


def test_every_keyed_type_has_a_realistic_case() -> None:
    covered = {
        next((key for key in json.loads(_fill(case.values[0])) if key != "update_id"), None)
        for case in REALISTIC
    }
    assert CHAT_KEYED | SENDER_KEYED | {"poll_answer"} <= covered


def test_keyed_types_are_the_documented_lists() -> None:
    assert {
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
    } == CHAT_KEYED
    assert {
        "callback_query",
        "inline_query",
        "chosen_inline_result",
        "shipping_query",
        "pre_checkout_query",
    } == SENDER_KEYED


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
        ("message", "-9223372036854775808"),
        id="chat-id-min-int64",
    ),
    pytest.param(
        '{"update_id": 1, "callback_query": {"id": "5", "data": "x"}}',
        ("callback_query", None),
        id="callback_query-without-from",
    ),
    pytest.param(
        '{"update_id": 1, "inline_query": {"id": "5", "from": {"id": false}}}',
        ("inline_query", None),
        id="inline_query-from-id-bool",
    ),
    pytest.param(
        '{"update_id": 1, "poll_answer": {"poll_id": "5", "option_ids": [0]}}',
        ("poll_answer", None),
        id="poll_answer-no-voter",
    ),
    pytest.param(
        '{"update_id": 1, "poll_answer": {"poll_id": "5", "voter_chat": {"title": "x"},'
        ' "user": {"id": 136817688, "is_bot": true, "first_name": "Channel"}}}',
        ("poll_answer", None),
        id="poll_answer-broken-voter_chat-ignores-placeholder-user",
    ),
    pytest.param(
        '{"update_id": 1, "poll_answer": []}', ("poll_answer", None), id="poll_answer-is-a-list"
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


def test_classify_accepts_any_mapping() -> None:
    chat: Any = MappingProxyType({"id": -1001234567890, "type": "supergroup"})
    update = MappingProxyType({"update_id": 7, "message": MappingProxyType({"chat": chat})})
    assert classify(update) == ("message", "-1001234567890")


@pytest.mark.parametrize(
    "body",
    [
        '{"update_id": 1, "\\u0000": {"chat": {"id": 5}}}',
        '{"update_id": 1, "Message": {"chat": {"id": 5}}}',
        '{"update_id": 1, "' + "x" * 65 + '": {}}',
    ],
    ids=["nul", "capitalised", "too-long"],
)
def test_classify_keeps_an_odd_type_name_out_of_the_columns(body: str) -> None:
    assert classify(json.loads(body)) == (None, None)
