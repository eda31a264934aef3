"""A bot's destinations as the settings read them: every `[[bots.destinations]]` table checked
whole at start-up (its name, URL, filter queries, delivery options), each option defaulting to
the bot's, `default` made from downstream_url; and, until deliveries per destination exist,
every table refused after its check rather than accepted and not delivered."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import AnyHttpUrl, ValidationError

from app.bot_settings import BotSettings
from app.config import Settings
from app.destinations.routing import Router, needed_updates, unreachable
from app.destinations.settings import (
    DEFAULT,
    DeliveryOptions,
    Destination,
    DestinationSettings,
    resolve,
)
from app.store.types import TO_DEFAULT

BOT_URL = AnyHttpUrl("http://bot:8000/telegram")
TABLES = [
    {"name": "payments", "url": "http://payments/", "max_attempts": 20,
     "filter": ["pre_checkout_query", "message:successful_payment"],
     "deadlines": {"callback_query": 0}},
    {"name": "moderation", "url": "http://moderation/", "filter": ["chat_member",
                                                                  "message_reaction"]},
    {"name": "analytics", "url": "http://analytics/", "ordered": False,
     "except": ["message:new_chat_members:me"]},
]  # fmt: skip


def _resolved(tables: list[dict[str, object]], **options: object) -> tuple[Destination, ...]:
    given = tuple(DestinationSettings.model_validate(table) for table in tables)
    bot = DeliveryOptions.model_validate({"max_attempts": 5, **options})
    return resolve("shop", BOT_URL, bot, given, bot_id=12345)


def test_each_option_defaults_to_the_bots_and_default_comes_first() -> None:
    found = {target.name: target for target in _resolved(TABLES, lease_seconds=7)}
    assert list(found) == [DEFAULT, "payments", "moderation", "analytics"]
    assert str(found[DEFAULT].url) == str(BOT_URL)
    assert found[DEFAULT].filter.everything
    assert found["payments"].options.max_attempts == 20
    assert found["moderation"].options.max_attempts == 5  # the bot's
    assert {t.options.lease_seconds for t in found.values()} == {7}
    # deadlines merge over the bot's, which merge over the defaults
    assert found["payments"].options.deadlines["callback_query"] == 0
    assert found["payments"].options.deadlines["pre_checkout_query"] == 10
    assert found["moderation"].options.deadlines["callback_query"] == 150
    assert (found["analytics"].ordered, found["payments"].ordered) == (False, True)


def test_a_default_table_gives_default_a_filter_and_takes_the_url_once() -> None:
    table = {"name": DEFAULT, "filter": [":text"], "concurrency": 3}
    (only,) = _resolved([table])
    assert (only.name, str(only.url), only.options.concurrency) == (DEFAULT, str(BOT_URL), 3)
    assert only.filter.include == (":text",)
    with pytest.raises(ValueError, match="set its url here or as downstream_url, not both"):
        _resolved([{**table, "url": "http://elsewhere/"}])


@pytest.mark.parametrize(
    ("table", "words"),
    [
        ({"name": "Payments", "url": "http://p/"}, "is not a destination name"),
        ({"name": "a" * 33, "url": "http://p/"}, "is not a destination name"),
        ({"name": "p", "url": "http://p/", "filter": ["pre_chekout_query"]},
         "the closest known query is 'pre_checkout_query'"),
        ({"name": "p", "url": "http://p/", "except": ["message:txt"]},
         "the closest known query is 'message:text'"),
        ({"name": "p", "url": "http://p/", "filter": []}, "an empty list matches nothing"),
        ({"name": "p", "url": "http://p/", "max_attempts": 0}, "greater than or equal to 1"),
        ({"name": "p", "url": "http://p/", "signing_secret": "whsec_short"}, "whsec_"),
        ({"name": "p", "url": "http://p/", "colour": "red"}, "Extra inputs"),
        ({"name": "p", "url": "ftp://p/"}, "URL scheme"),
    ],
)  # fmt: skip
def test_a_bad_table_is_refused_naming_what(table: dict[str, object], words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        DestinationSettings.model_validate(table)


def test_a_name_twice_or_a_missing_url_or_me_without_a_token_is_refused() -> None:
    with pytest.raises(ValueError, match=r"destinations \['p'\] are named more than once"):
        _resolved([{"name": "p", "url": "http://p/"}, {"name": "p", "url": "http://q/"}])
    with pytest.raises(ValueError, match=r"destinations.0 \('p'\): url is required"):
        _resolved([{"name": "p"}])
    given = (DestinationSettings.model_validate(TABLES[2]),)
    with pytest.raises(ValueError, match="set bot_token"):
        resolve("shop", BOT_URL, DeliveryOptions(), given, bot_id=None)


def _routed(router: Router, update_type: str, payload: dict[str, object]) -> list[str]:
    return [route.destination for route in router.routes(update_type, {update_type: payload})]


def test_an_update_goes_to_every_destination_whose_filter_it_passes() -> None:
    targets = _resolved(TABLES)
    router = Router(targets)
    payment = {"message_id": 1, "date": 1, "chat": {"id": 1, "type": "private"},
               "successful_payment": {"currency": "XTR", "total_amount": 5}}  # fmt: skip
    assert _routed(router, "message", payment) == [DEFAULT, "payments", "analytics"]
    assert _routed(router, "pre_checkout_query", {"id": "1"}) == [
        DEFAULT, "payments", "analytics"]  # fmt: skip
    member = {"chat": {"id": -1}, "from": {"id": 2, "is_bot": False}}
    assert _routed(router, "chat_member", member) == [DEFAULT, "moderation", "analytics"]
    joined = {"message_id": 2, "date": 1, "chat": {"id": -1, "type": "group"},
              "new_chat_members": [{"id": 12345, "is_bot": True}]}  # fmt: skip
    assert _routed(router, "message", joined) == [DEFAULT]  # analytics excepts the bot itself
    assert _routed(Router(targets[1:2]), "callback_query", {"id": "1"}) == []  # matches none
    routes = router.routes("message", {"message": payment})
    assert {route.destination: route.ordered for route in routes} == {
        DEFAULT: True, "payments": True, "analytics": False}  # fmt: skip


def test_a_bot_with_one_destination_taking_everything_routes_to_its_row_unfiltered() -> None:
    alone = _resolved([])
    assert [target.name for target in alone] == [DEFAULT]
    assert Router(alone).routes("message", {"message": {}}) is TO_DEFAULT
    assert Router(()).routes(None, {}) is TO_DEFAULT  # no destination yet: as before


def test_allowed_updates_are_what_the_filters_need() -> None:
    targets = _resolved(TABLES)
    needed = needed_updates(targets)
    assert needed is not None
    # a catch-all destination needs Telegram's default, and the opt-ins a filter names
    assert {"chat_member", "message_reaction", "message", "callback_query"} <= set(needed)
    assert "message_reaction_count" not in needed
    assert needed_updates(targets[:1]) is None  # default alone: Telegram's default applies
    narrow = needed_updates(targets[1:3])
    assert narrow == ("message", "pre_checkout_query", "chat_member", "message_reaction")
    assert unreachable(targets, ("message", "pre_checkout_query")) == [
        "destination 'moderation''s filter query 'chat_member' needs chat_member, which "
        "allowed_updates leaves out",
        "destination 'moderation''s filter query 'message_reaction' needs message_reaction, "
        "which allowed_updates leaves out",
    ]
    assert unreachable(targets, narrow) == []


def test_a_destinations_table_is_checked_whole_as_the_settings_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The settings take the table (the service refuses it as it starts, in this release:
    tests/cli/test_service.py); a query not in the vocabulary is refused here."""
    for name in [n for n in os.environ if n.startswith("INTAKE_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "intake.toml").write_text(
        '[[bots]]\nname = "shop"\nsecret_token = "shop-secret"\n'
        'downstream_url = "http://shop/"\n\n'
        '[[bots.destinations]]\nname = "payments"\nurl = "http://payments/"\n'
        'filter = ["pre_checkout_query"]\n'
    )
    loaded = Settings().bot("shop")
    assert loaded is not None
    assert [t.name for t in loaded.targets] == [DEFAULT, "payments"]
    (tmp_path / "intake.toml").write_text(
        (tmp_path / "intake.toml").read_text().replace("pre_checkout_query", "pre_checkout")
    )
    with pytest.raises(ValidationError, match="closest known query is 'pre_checkout_query'"):
        Settings()
    # without tables, the bot's one destination is default, from downstream_url
    bot = BotSettings(name="shop", secret_token="shop-secret", downstream_url=BOT_URL)
    assert [(t.name, t.configured, t.filter.everything) for t in bot.targets] == [
        (DEFAULT, False, True)
    ]
