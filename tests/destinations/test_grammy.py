"""Our filter queries are grammY's: the same vocabulary and the same matches, read from the real
grammY (the kit's locked version, kit/typescript/package-lock.json) by Node.

grammY exports `matchFilter` alone, so the vocabulary is read from its refusals: an unknown key
at a level makes it list the keys it permits there. Then every query we know, the shortcuts'
forms among them, is matched by both against updates chosen for grammY's corners: falsy
values, empty lists, a property found by an item's `type`, the bot itself (`me`).
"""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

import pytest

from app.destinations.filters import (
    SHORTCUTS_1,
    SHORTCUTS_2,
    VOCABULARY,
    FilterError,
    UpdateFilter,
    expand,
    known_queries,
)
from app.intake.updates import classify
from tests.kit.node import KIT, installed, one_at_a_time, tools

pytestmark = pytest.mark.xdist_group("typescript-kit")

ME = 777000111
USER = {"id": 42, "is_bot": False, "first_name": "Ada"}
BOT = {"id": 43, "is_bot": True, "first_name": "Helper"}
MYSELF = {"id": ME, "is_bot": True, "first_name": "This bot"}
CHAT = {"id": 42, "type": "private", "first_name": "Ada"}
CHANNEL = {"id": -1001, "type": "channel", "title": "News"}


def _message(**fields: Any) -> dict[str, Any]:
    return {"message_id": 1, "date": 1, "chat": CHAT, "from": USER, **fields}


def _member(by: dict[str, Any]) -> dict[str, Any]:
    member = {"status": "member", "user": USER}
    return {"chat": CHAT, "from": by, "date": 1, "old_chat_member": member,
            "new_chat_member": member}  # fmt: skip


# Updates for grammY's corners, each a (type, object) pair; update_id added below.
OBJECTS: list[tuple[str, Any]] = [
    ("message", _message(text="hi")),
    ("message", _message(text="")),  # a key present with a falsy value
    (
        "message",
        _message(text="/start", entities=[{"type": "bot_command", "offset": 0, "length": 6}]),
    ),
    ("message", _message(text="see x", entities=[])),  # an empty list is truthy in JS
    (
        "message",
        _message(
            photo=[{"file_id": "p"}],
            caption="c",
            caption_entities=[{"type": "url", "offset": 0, "length": 1}],
        ),
    ),
    ("message", _message(sticker={"file_id": "s", "is_video": True, "is_animated": False})),
    ("message", _message(sticker={"file_id": "s", "is_video": False})),
    ("message", _message(new_chat_members=[USER, MYSELF])),
    ("message", _message(new_chat_members=[BOT])),
    ("message", _message(left_chat_member=MYSELF)),
    (
        "message",
        _message(
            forward_origin={"type": "hidden_user", "date": 1, "sender_user_name": "x"}, text="f"
        ),
    ),
    ("message", _message(successful_payment={"currency": "XTR", "total_amount": 1})),
    ("message", _message(link_preview_options={"url": "", "show_above_text": True}, text="t")),
    ("message", _message(migrate_to_chat_id=0)),  # zero is falsy, but not null
    ("message", _message(video={"file_id": "v"}, has_media_spoiler=False)),
    ("edited_message", _message(text="edited", edit_date=2)),
    (
        "channel_post",
        {
            "message_id": 1,
            "date": 1,
            "chat": CHANNEL,
            "text": "post",
            "entities": [{"type": "url", "offset": 0, "length": 4}],
        },
    ),
    (
        "edited_channel_post",
        {"message_id": 1, "date": 1, "chat": CHANNEL, "document": {"file_id": "d"}},
    ),
    ("business_message", _message(text="biz", business_connection_id="b1")),
    ("guest_message", _message(text="guest")),
    ("callback_query", {"id": "1", "from": USER, "chat_instance": "1", "data": "buy"}),
    ("callback_query", {"id": "2", "from": USER, "chat_instance": "1", "data": ""}),
    ("callback_query", {"id": "3", "from": USER, "chat_instance": "1", "game_short_name": "g"}),
    ("inline_query", {"id": "1", "from": USER, "query": "q", "offset": ""}),
    (
        "pre_checkout_query",
        {"id": "1", "from": USER, "currency": "XTR", "total_amount": 1, "invoice_payload": "p"},
    ),
    ("chat_member", _member(BOT)),
    ("chat_member", _member(USER)),
    ("my_chat_member", _member(MYSELF)),
    (
        "message_reaction",
        {
            "chat": CHAT,
            "message_id": 1,
            "date": 1,
            "user": USER,
            "old_reaction": [],
            "new_reaction": [{"type": "emoji", "emoji": "👍"}],
        },
    ),
    (
        "message_reaction_count",
        {
            "chat": CHANNEL,
            "message_id": 1,
            "date": 1,
            "reactions": [{"type": {"type": "paid"}, "total_count": 1}],
        },
    ),
    (
        "business_connection",
        {
            "id": "b1",
            "user": USER,
            "user_chat_id": 42,
            "date": 1,
            "can_reply": False,
            "is_enabled": True,
        },
    ),
    ("poll", {"id": "5", "question": "?", "options": [], "total_voter_count": 0}),
    ("purchased_paid_media", {"from": USER, "paid_media_payload": "x"}),
]
UPDATES = [{"update_id": n, kind: payload} for n, (kind, payload) in enumerate(OBJECTS)]

# Reads the vocabulary off grammY's refusals, then matches every query against every update.
SCRIPT = r"""
const { matchFilter } = require("grammy");
const input = JSON.parse(require("fs").readFileSync(0, "utf8"));
function refusal(query) {
  try { matchFilter(query); return null; } catch (error) { return String(error.message); }
}
function permitted(query) {
  const why = refusal(query);
  if (why === null) throw new Error(`grammY took ${query}`);
  const list = why.match(/Permitted values are: (.*)\.$/);
  if (list) return [...list[1].matchAll(/'([^']*)'/g)].map((m) => m[1]);
  if (/No further filtering is possible/.test(why)) return [];
  throw new Error(`unexpected refusal of ${query}: ${why}`);
}
const vocabulary = {};
for (const first of input.types) {
  vocabulary[first] = {};
  for (const second of permitted(`${first}:__none__`)) {
    vocabulary[first][second] = permitted(`${first}:${second}:__none__`);
  }
}
const queries = {};
for (const query of input.queries) {
  const why = refusal(query);
  if (why !== null) { queries[query] = null; continue; }
  const match = matchFilter(query);
  queries[query] = input.updates.map((update) => !!match({ update, me: { id: input.me } }));
}
process.stdout.write(JSON.stringify({ vocabulary, queries }));
"""


@pytest.fixture(scope="module")
def grammy() -> Any:
    node, _ = tools()
    with one_at_a_time():
        installed()
    return node


def _ask(node: str, queries: list[str]) -> dict[str, Any]:
    given = {"types": list(VOCABULARY), "queries": queries, "updates": UPDATES, "me": ME}
    done = subprocess.run(
        [node, "-e", SCRIPT], cwd=KIT, input=json.dumps(given), capture_output=True,
        text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


SHORTCUT_QUERIES = (
    [f"{one}:{two}" for one in SHORTCUTS_1 for two in (*SHORTCUTS_2, "text", "new_chat_members")]
    + [f"{one}:{two}:url" for one in SHORTCUTS_1 for two in SHORTCUTS_2]
    + ["msg", "edit", ":"]
)
CORNERS = [
    "message:entities:bot_command", "message:sticker:is_video", "message:new_chat_members:me",
    "message:left_chat_member:is_bot", "message:forward_origin:hidden_user",
    "chat_member:from:is_bot", "my_chat_member:from:me", "message_reaction:new_reaction:emoji",
    "message_reaction_count:reactions", "callback_query:game_short_name",
    "callback_query:data", "message:migrate_to_chat_id",
    "message:link_preview_options:show_above_text", "message:entities", "message:text",
    "::url", "edit:file", "business_connection:can_reply",
]  # fmt: skip
NEWER = ["subscription", "stopped_message_generation"]
REFUSED = ["", "messages", "message:txt", "message:text:bold", "message:entities:link",
           "inline_query:query", "a:b:c:d", "edit:new_chat_members",
           ":file:url", "channel_post:new_chat_members"]  # fmt: skip


def test_the_vocabulary_is_grammys_for_every_update_type(grammy: str) -> None:
    theirs = _ask(grammy, [])["vocabulary"]
    ours = {
        first: {second: sorted(thirds) for second, thirds in keys.items()}
        for first, keys in VOCABULARY.items()
    }
    theirs = {
        first: {second: sorted(thirds) for second, thirds in keys.items()}
        for first, keys in theirs.items()
    }
    assert ours == theirs


def test_every_query_matches_what_grammy_matches(grammy: str) -> None:
    queries = [*known_queries(), *SHORTCUT_QUERIES, *REFUSED]
    theirs = _ask(grammy, [*queries, *NEWER])["queries"]
    for query in NEWER:  # grammY knows update types newer than app.queues' table; we refuse
        assert theirs[query] is not None
        with pytest.raises(FilterError, match="is not an update type"):
            expand(query)
    disagreements = []
    for query in queries:
        try:
            found = UpdateFilter((query,), bot_id=ME)
        except FilterError:
            if theirs[query] is not None:
                disagreements.append(f"{query}: refused here, taken by grammY")
            continue
        if theirs[query] is None:
            disagreements.append(f"{query}: taken here, refused by grammY")
            continue
        for update, expected in zip(UPDATES, theirs[query], strict=True):
            kind, _ = classify(update)
            assert kind is not None
            if found.matches(kind, update[kind]) != expected:
                disagreements.append(f"{query} on update {update['update_id']}: grammY {expected}")
    assert not disagreements, "\n".join(disagreements[:40])
    # The corpus reaches grammY's corners: each of these matches some update and not others.
    for corner in CORNERS:
        assert any(theirs[corner]), corner
        assert not all(theirs[corner]), corner
    assert all(theirs[q] is None or not all(theirs[q]) for q in queries)


def test_a_refusal_names_the_closest_query() -> None:
    with pytest.raises(FilterError, match="closest known query is 'message:successful_payment'"):
        expand("message:successful_paymnt")
    with pytest.raises(FilterError, match="closest known query is 'callback_query:data'"):
        expand("callback:data")
    with pytest.raises(FilterError, match=re.escape("set bot_token")):
        UpdateFilter(("message:new_chat_members:me",))
