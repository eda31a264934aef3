"""Settings: bots from a TOML file or the environment, clear errors, secrets kept secret."""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from app.config import Settings, describe

TOML = """
database_url = "postgresql://app@db/intake"
max_body_bytes = 65536
allowed_sources = ["telegram"]

[[bots]]
name = "shop"
secret_token = "shop-secret"
downstream_url = "http://shop:8000/telegram"
mode = "fenced"
max_attempts = 3

[[bots]]
name = "news"
secret_token = "news_secret"
"""


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("INTAKE_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no ./intake.toml unless a test writes one


def test_bots_come_from_the_toml_file(tmp_path: Path) -> None:
    (tmp_path / "intake.toml").write_text(TOML)
    settings = Settings()
    assert [bot.name for bot in settings.bots] == ["shop", "news"]
    shop = settings.bot("shop")
    assert shop is not None
    assert (shop.mode, shop.max_attempts, str(shop.downstream_url)) == (
        "fenced",
        3,
        "http://shop:8000/telegram",
    )
    assert settings.database_url == "postgresql+psycopg://app@db/intake"
    assert settings.max_body_bytes == 65536
    assert ipaddress.ip_network("149.154.160.0/20") in settings.allowed_sources


def test_intake_config_names_another_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "elsewhere.toml").write_text(TOML)
    monkeypatch.setenv("INTAKE_CONFIG", str(tmp_path / "elsewhere.toml"))
    assert [bot.name for bot in Settings().bots] == ["shop", "news"]
    monkeypatch.setenv("INTAKE_CONFIG", str(tmp_path / "missing.toml"))
    with pytest.raises(FileNotFoundError, match=r"missing\.toml"):
        Settings()


def test_the_environment_overrides_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "intake.toml").write_text(TOML)
    monkeypatch.setenv("INTAKE_MAX_BODY_BYTES", "2048")
    assert Settings().max_body_bytes == 2048


def test_without_a_file_the_environment_makes_bot_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INTAKE_SECRET_TOKEN", "env-secret")
    monkeypatch.setenv("INTAKE_DOWNSTREAM_URL", "http://127.0.0.1:9000/hook")
    monkeypatch.setenv("INTAKE_MODE", "plain")
    monkeypatch.setenv("INTAKE_TRUSTED_PROXIES", "10.0.0.0/8, 192.168.1.1")
    settings = Settings()
    (bot,) = settings.bots
    assert (bot.name, bot.mode, bot.secret_token.get_secret_value()) == (
        "default",
        "plain",
        "env-secret",
    )
    assert settings.trusted_proxies == (
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("192.168.1.1/32"),
    )


def test_no_secret_means_no_bot() -> None:
    assert Settings().bots == ()


@pytest.mark.parametrize(
    ("toml", "field"),
    [
        ('[[bots]]\nname = "Shop"\nsecret_token = "x"\n', "bots.0.name"),
        ('[[bots]]\nname = "shop"\nsecret_token = "has space"\n', "bots.0.secret_token"),
        ('[[bots]]\nname = "shop"\n', "bots.0.secret_token"),
        ('[[bots]]\nname = "shop"\nsecret_token = "x"\nmode = "loose"\n', "bots.0.mode"),
        ('[[bots]]\nname = "shop"\nsecret_token = "x"\nmax_attempts = 0\n', "bots.0.max_attempts"),
        ('[[bots]]\nname = "shop"\nsecret_token = "x"\ncolour = "red"\n', "bots.0.colour"),
        (
            '[[bots]]\nname = "a"\nsecret_token = "x"\n[[bots]]\nname = "a"\nsecret_token = "y"\n',
            "appear more than once",
        ),
        ('database_url = "mysql://x/y"\n', "database_url"),
        ('table = "Bad Table"\n', "table"),
        ('allowed_sources = ["300.1.1.1"]\n', "allowed_sources"),
        ('allowed_source = ["telegram"]\n', "allowed_source: Extra inputs"),  # a typo
    ],
)
def test_invalid_configuration_names_the_field(tmp_path: Path, toml: str, field: str) -> None:
    (tmp_path / "intake.toml").write_text(toml)
    with pytest.raises(ValidationError) as raised:
        Settings()
    assert field in describe(raised.value)


def test_secrets_never_show_in_validation_errors(tmp_path: Path) -> None:
    (tmp_path / "intake.toml").write_text(
        'database_url = "postgresql://app:db-Pa55word@db/intake"\n'
        '[[bots]]\nname = "shop"\nsecret_token = "hunter2 secret"\n'
    )
    with pytest.raises(ValidationError) as raised:
        Settings()
    shown = str(raised.value) + describe(raised.value)
    assert "secret_token" in shown
    assert "hunter2" not in shown
    (tmp_path / "intake.toml").write_text('database_url = "mysql://app:db-Pa55word@db/x"\n')
    with pytest.raises(ValidationError) as raised:
        Settings()
    assert "Pa55word" not in str(raised.value)


def test_the_database_password_stays_out_of_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INTAKE_DATABASE_URL", "postgresql://app:db-Pa55word@db/intake")
    assert "Pa55word" not in repr(Settings())


def test_secrets_never_show_in_repr_or_errors(tmp_path: Path) -> None:
    (tmp_path / "intake.toml").write_text(
        '[[bots]]\nname = "shop"\nsecret_token = "hunter2-secret"\nbot_token = "123:ABC-token"\n'
        "max_attempts = -1\n"
    )
    with pytest.raises(ValidationError) as raised:
        Settings()
    message = describe(raised.value)
    assert "hunter2" not in message
    assert "123:ABC" not in message
    (tmp_path / "intake.toml").write_text(
        '[[bots]]\nname = "shop"\nsecret_token = "hunter2-secret"\nbot_token = "123:ABC-token"\n'
    )
    shown = repr(Settings()) + str(Settings().model_dump())
    assert "hunter2" not in shown
    assert "123:ABC" not in shown


def test_worker_settings_have_the_documented_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INTAKE_SECRET_TOKEN", "s")
    (bot,) = Settings().bots
    assert (bot.retry_base_seconds, bot.retry_cap_seconds, bot.max_attempts) == (2, 600, 8)
    assert (bot.ordering, bot.lease_seconds, bot.mode) == ("chat", 60, "durable")
    assert bot.deadlines == {
        "inline_query": 30,
        "callback_query": 150,
        "shipping_query": 10,
        "pre_checkout_query": 10,
    }
    assert bot.deadline_ms("callback_query") == 150_000
    assert bot.deadline_ms("message") is None
    assert bot.deadline_ms(None) is None


def test_deadlines_merge_over_the_defaults_and_zero_turns_one_off(tmp_path: Path) -> None:
    (tmp_path / "intake.toml").write_text(
        '[[bots]]\nname = "shop"\nsecret_token = "s"\n'
        "[bots.deadlines]\ninline_query = 5\ncallback_query = 0\nmessage = 3600\n"
    )
    (bot,) = Settings().bots
    assert bot.deadlines == {
        "inline_query": 5,
        "callback_query": 0,
        "shipping_query": 10,
        "pre_checkout_query": 10,
        "message": 3600,
    }
    assert bot.deadline_ms("callback_query") is None


def test_a_deadline_turned_off_in_the_environment_stays_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("INTAKE_SECRET_TOKEN", "s")
    monkeypatch.setenv("INTAKE_DEADLINES", '{"callback_query": 0}')
    assert Settings().bots[0].deadline_ms("callback_query") is None


def test_a_plain_bot_delivers_without_chat_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INTAKE_SECRET_TOKEN", "s")
    monkeypatch.setenv("INTAKE_MODE", "plain")
    assert Settings().bots[0].ordering == "none"
    monkeypatch.setenv("INTAKE_ORDERING", "chat")
    with pytest.raises(ValidationError, match="needs mode fenced or durable"):
        Settings()


def test_deadlines_from_the_environment_are_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INTAKE_SECRET_TOKEN", "s")
    monkeypatch.setenv("INTAKE_DEADLINES", '{"inline_query": 12}')
    assert Settings().bots[0].deadline_ms("inline_query") == 12_000


@pytest.mark.parametrize(
    ("variable", "value", "field"),
    [
        ("INTAKE_SIGNING_SECRET", "whsec_c2hvcnQ=", "signing_secret"),
        ("INTAKE_SIGNING_SECRET", "whsec_not base64!", "signing_secret"),
        ("INTAKE_DEADLINES", '{"inline_query": -1}', "deadlines"),
        ("INTAKE_ORDERING", "fifo", "ordering"),
        ("INTAKE_CONCURRENCY", "0", "concurrency"),
        ("INTAKE_WORKER_CONCURRENCY", "0", "worker_concurrency"),
        ("INTAKE_POLL_INTERVAL_SECONDS", "0", "poll_interval_seconds"),
        ("INTAKE_OPERATIONS_SIGNING_SECRET", "whsec_c2hvcnQ=", "operations_signing_secret"),
        ("INTAKE_OPERATIONS_URL", "not a url", "operations_url"),
        ("INTAKE_STALE_AFTER_SECONDS", "0", "stale_after_seconds"),
        ("INTAKE_WEBHOOK_CHECK_SECONDS", "-1", "webhook_check_seconds"),
    ],
)
def test_invalid_worker_settings_name_the_field(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, field: str
) -> None:
    monkeypatch.setenv("INTAKE_SECRET_TOKEN", "s")
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError) as raised:
        Settings()
    assert describe(raised.value).startswith(f"invalid configuration: {field}")


def test_a_bots_mode_names_the_table_capability_it_needs() -> None:
    from app.bot_settings import BotSettings

    modes = {
        m: BotSettings(name="b", secret_token="s", mode=m).capability
        for m in ("plain", "fenced", "durable")
    }  # type: ignore[arg-type]
    assert modes == {"plain": "base", "fenced": "fenced", "durable": "durable"}


def test_api_keys_from_the_environment_have_full_access(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INTAKE_API_KEYS", " first-key.0123456789 , second-key.0123456789,")
    keys = Settings().api_keys
    assert [key.key.get_secret_value() for key in keys] == [
        "first-key.0123456789",
        "second-key.0123456789",
    ]
    assert all(key.bots is None and key.scopes == ("callback", "operations") for key in keys)
    assert "first-key" not in repr(Settings())


def test_api_keys_in_the_file_may_be_limited_to_bots_and_scopes(tmp_path: Path) -> None:
    (tmp_path / "intake.toml").write_text(
        TOML
        + '[[api_keys]]\nkey = "shop-callback.0123456789"\nbots = ["shop"]\n'
        + 'scopes = ["callback"]\n'
        + '[[api_keys]]\nkey = "operator-key.0123456789"\nscopes = ["operations"]\n'
    )
    shop, operator = Settings().api_keys
    assert (shop.bots, shop.scopes) == (("shop",), ("callback",))
    assert shop.allows("shop")
    assert not shop.allows("news")
    assert (operator.bots, operator.scopes) == (None, ("operations",))
    assert operator.allows("news")


@pytest.mark.parametrize(
    ("keys", "field"),
    [
        ('[[api_keys]]\nkey = "short"\n', "api_keys.0.key"),
        ('[[api_keys]]\nkey = "has space in it 0123456789"\n', "api_keys.0.key"),
        ('[[api_keys]]\nkey = "unknown-bot.0123456789"\nbots = ["ghost"]\n', "not configured"),
        ('[[api_keys]]\nkey = "bad-scope.0123456789"\nscopes = ["admin"]\n', "scopes"),
        (
            '[[api_keys]]\nkey = "twice-over.0123456789"\n'
            '[[api_keys]]\nkey = "twice-over.0123456789"\n',
            "a key appears more than once",
        ),
        (
            '[[api_keys]]\nkey = "first-name.0123456789"\nname = "ops"\n'
            '[[api_keys]]\nkey = "other-name.0123456789"\nname = "ops"\n',
            "a name appears more than once",
        ),
        ('[[api_keys]]\nkey = "bad-name.0123456789"\nname = "a\\nb"\n', "api_keys.0.name"),
    ],
)
def test_invalid_api_keys_name_the_problem_and_never_the_key(
    tmp_path: Path, keys: str, field: str
) -> None:
    (tmp_path / "intake.toml").write_text(TOML + keys)
    with pytest.raises(ValidationError) as raised:
        Settings()
    message = describe(raised.value)
    assert field in message
    assert "0123456789" not in message + str(raised.value)


def test_viewer_and_operator_scopes_and_key_names(tmp_path: Path) -> None:
    (tmp_path / "intake.toml").write_text(
        TOML
        + '[[api_keys]]\nkey = "viewer-key.0123456789"\nname = "dashboards"\n'
        + 'scopes = ["viewer"]\n'
        + '[[api_keys]]\nkey = "operator-key.0123456789"\nscopes = ["operator"]\n'
        + '[[api_keys]]\nkey = "legacy-key.0123456789"\nscopes = ["operations"]\n'
    )
    viewer, operator, legacy = Settings().api_keys
    assert viewer.label == "dashboards"
    assert [viewer.may(s) for s in ("viewer", "operator", "callback")] == [True, False, False]
    # `operator` includes `viewer`; `operations` is its older name.
    for key in (operator, legacy):
        assert [key.may(s) for s in ("viewer", "operator", "callback")] == [True, True, False]
    # Without a name or a console secret, a key is named by its place in the list: nothing
    # of the key itself (a plain hash would let a reader of the audit log test guesses).
    assert (operator.label, legacy.label) == ("key-2", "key-3")


def test_unnamed_keys_are_labelled_by_an_hmac_under_the_console_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "intake.toml").write_text(
        TOML + '[[api_keys]]\nkey = "operator-key.0123456789"\nscopes = ["operator"]\n'
    )
    monkeypatch.setenv("INTAKE_CONSOLE_SECRET", "a-console-secret-0123456789")
    (key,) = Settings().api_keys
    assert re.fullmatch(r"key-[0-9a-f]{12}", key.label)
    # Not the plain hash an offline guesser could compute from a candidate key alone.
    plain = hashlib.sha256(b"operator-key.0123456789").hexdigest()
    assert plain[:8] not in key.label
    assert key.label == Settings().api_keys[0].label  # stable while the secret is
    monkeypatch.setenv("INTAKE_CONSOLE_SECRET", "another-console-secret-0123")
    assert Settings().api_keys[0].label != key.label


def test_operational_events_are_recorded_only_with_a_url_and_its_signing_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings().store_options()["events"] is False
    monkeypatch.setenv("INTAKE_OPERATIONS_URL", "https://alerts.example.com/intake")
    with pytest.raises(ValidationError) as raised:
        Settings()
    assert "set operations_signing_secret" in describe(raised.value)
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    monkeypatch.setenv("INTAKE_OPERATIONS_SIGNING_SECRET", secret)
    settings = Settings()
    assert settings.store_options()["events"] is True
    assert secret not in repr(settings)


def test_the_attempt_history_is_on_unless_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().store_options()["history"] is True
    monkeypatch.setenv("INTAKE_ATTEMPT_HISTORY", "false")
    assert Settings().store_options()["history"] is False


def test_behind_pgbouncer_the_listen_url_is_normalised_and_kept_out_of_repr(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("INTAKE_DATABASE_URL", "postgresql://app@pgbouncer:6432/intake")
    monkeypatch.setenv("INTAKE_DATABASE_PGBOUNCER", "true")
    monkeypatch.setenv("INTAKE_LISTEN_DATABASE_URL", "postgres://app:hunter2-pw@db/intake")
    settings = Settings()
    assert settings.database_pgbouncer is True
    assert settings.listen_database_url == "postgresql+psycopg://app:hunter2-pw@db/intake"
    assert "hunter2-pw" not in repr(settings)
    monkeypatch.delenv("INTAKE_DATABASE_PGBOUNCER")
    assert Settings().database_pgbouncer is False


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"database_pgbouncer": True}, "database_pgbouncer"),  # the default SQLite file
        ({"listen_database_url": "sqlite:///var/x.db"}, "listen_database_url"),
    ],
)
def test_pgbouncer_settings_need_postgresql(options: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as raised:
        Settings(**options)  # type: ignore[arg-type]
    assert field in describe(raised.value)


def test_allowed_updates_must_be_update_types_of_the_bot_api(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "intake.toml").write_text(
        '[[bots]]\nname = "shop"\nsecret_token = "x"\n'
        'allowed_updates = ["message", "mesage", "chat_member", "no_such_update"]\n'
    )
    with pytest.raises(ValidationError) as raised:
        Settings()
    shown = describe(raised.value)
    assert shown.startswith("invalid configuration: bots.0.allowed_updates: ")
    assert "'mesage' (did you mean 'message'?), 'no_such_update';" in shown
    assert "'chat_member'" not in shown.split(";")[0]
    (tmp_path / "intake.toml").unlink()
    monkeypatch.setenv("INTAKE_SECRET_TOKEN", "s")
    monkeypatch.setenv("INTAKE_ALLOWED_UPDATES", '["callback_querys"]')
    with pytest.raises(ValidationError) as raised:
        Settings()
    assert describe(raised.value).startswith(
        "invalid configuration: allowed_updates: not update types of the Bot API: "
        "'callback_querys' (did you mean 'callback_query'?)"
    )
    monkeypatch.setenv("INTAKE_ALLOWED_UPDATES", '["message", "chat_member", "guest_message"]')
    (bot,) = Settings().bots
    assert bot.allowed_updates == ("message", "chat_member", "guest_message")


@pytest.mark.parametrize(
    ("bot_api_url", "max_connections", "problem"),
    [
        ("https://api.telegram.org", 100, None),
        ("https://api.telegram.org/", 101, "101 is not 1-100, what Telegram's Bot API server"),
        ("https://API.Telegram.org", 101, "101 is not 1-100"),
        ("http://127.0.0.1:8081", 5000, None),
        ("https://bot-api.internal", 100_000, None),
        ("http://127.0.0.1:8081", 100_001, "less than or equal to 100000"),
    ],
)
def test_max_connections_is_up_to_100_with_telegram_and_100000_with_a_local_server(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    bot_api_url: str,
    max_connections: int,
    problem: str | None,
) -> None:
    (tmp_path / "intake.toml").write_text(
        f'bot_api_url = "{bot_api_url}"\n'
        '[[bots]]\nname = "shop"\nsecret_token = "x"\n'
        f'[[bots]]\nname = "news"\nsecret_token = "y"\nmax_connections = {max_connections}\n'
    )
    if problem is None:
        assert Settings().bots[1].max_connections == max_connections
    else:
        with pytest.raises(ValidationError) as raised:
            Settings()
        shown = describe(raised.value)
        assert "bots.1.max_connections" in shown
        assert problem in shown
    # Bot `default`, from the environment, is held to the same limit.
    (tmp_path / "intake.toml").unlink()
    monkeypatch.setenv("INTAKE_SECRET_TOKEN", "s")
    monkeypatch.setenv("INTAKE_BOT_API_URL", bot_api_url)
    monkeypatch.setenv("INTAKE_MAX_CONNECTIONS", str(max_connections))
    if problem is None:
        assert Settings().bots[0].max_connections == max_connections
    else:
        with pytest.raises(ValidationError) as raised:
            Settings()
        assert "max_connections" in describe(raised.value)
        assert problem in describe(raised.value)


@pytest.mark.parametrize(
    ("url", "local"),
    [
        ("https://api.telegram.org", False),
        ("https://api.telegram.org/", False),
        ("http://API.TELEGRAM.ORG:80", False),
        ("http://127.0.0.1:8081", True),
        ("https://telegram-bot-api.internal", True),
        ("https://api.telegram.org.example.com", True),
    ],
)
def test_any_bot_api_url_but_api_telegram_org_is_a_local_server(url: str, local: bool) -> None:
    from pydantic import AnyHttpUrl

    from app.webhook_rules import is_local_bot_api

    assert is_local_bot_api(AnyHttpUrl(url)) is local
    assert is_local_bot_api(Settings(bot_api_url=url).bot_api_url) is local
