"""set-webhook and webhook-info against a fake Bot API on an ephemeral port, as real
processes; the bot token never appears in what they print."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from app.cli.telegram import describe_webhook
from app.fake_bot_api import TOKEN, FakeBotApi
from tests.conftest import serve_asgi

pytestmark = pytest.mark.slow  # each test runs the command line as real processes

SECRET = "webhook-secret_token"


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def environment(bot_api: str, token: str = TOKEN) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("INTAKE_")},
        "INTAKE_SECRET_TOKEN": SECRET,
        "INTAKE_BOT_TOKEN": token,
        "INTAKE_BOT_API_URL": bot_api,
        "INTAKE_ALLOWED_UPDATES": '["message", "callback_query"]',
    }


async def test_set_webhook_registers_the_secret_and_confirms_with_get_webhook_info() -> None:
    fake = FakeBotApi()
    async with serve_asgi(fake.app()) as bot_api:
        url = "https://intake.example.com/telegram/default"
        done = cli(
            "set-webhook", "default", "--url", url, "--max-connections", "80",
            env=environment(bot_api),
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (name, params), (confirm, _) = fake.calls
    assert (name, confirm) == ("setWebhook", "getWebhookInfo")
    assert params == {
        "url": url,
        "secret_token": SECRET,
        "allowed_updates": ["message", "callback_query"],
        "max_connections": 80,
    }
    assert f"bot default: webhook {url}" in done.stdout
    assert "pending updates: 3" in done.stdout
    assert "(2 minutes ago): Wrong response from the webhook: 503" in done.stdout
    assert "allowed updates: message, callback_query" in done.stdout
    assert TOKEN not in done.stdout + done.stderr


async def test_webhook_info_says_what_telegram_knows_in_plain_words() -> None:
    fake = FakeBotApi()
    async with serve_asgi(fake.app()) as bot_api:
        done = cli("webhook-info", "default", env=environment(bot_api))
        as_json = cli("webhook-info", "default", "--json", env=environment(bot_api))
    assert done.returncode == 0, done.stderr
    assert "no webhook set (getUpdates mode)" in done.stdout
    assert "last error: none" in done.stdout
    assert json.loads(as_json.stdout) == {"url": "", "pending_update_count": 0}


@pytest.mark.parametrize("problem", ["refused", "unreachable"])
async def test_a_failure_is_one_clear_line_and_never_shows_the_token(problem: str) -> None:
    fake = FakeBotApi()
    async with serve_asgi(fake.app()) as bot_api:
        if problem == "refused":
            env = environment(bot_api, token="999:wrong-secret-token")
        else:
            env = environment("http://127.0.0.1:9")
        done = cli("webhook-info", "default", env=env)
    assert done.returncode == 1
    expected = "Telegram refused: 401 Unauthorized" if problem == "refused" else "could not be"
    assert expected in done.stderr
    assert "Traceback" not in done.stderr
    assert "secret-token" not in done.stdout + done.stderr
    assert "wrong-secret" not in done.stdout + done.stderr


def test_a_bot_without_a_token_is_told_which_setting_to_set() -> None:
    env = environment("http://127.0.0.1:9")
    del env["INTAKE_BOT_TOKEN"]
    done = cli("webhook-info", "default", env=env)
    assert done.returncode == 1
    assert "has no bot_token (INTAKE_BOT_TOKEN or bot_token)" in done.stderr


def test_describe_webhook_counts_the_time_since_the_last_error() -> None:
    info = {"url": "https://x/telegram/a", "last_error_date": 1_000, "last_error_message": "boom"}
    text = describe_webhook("a", info, now=1_000 + 3 * 3600 + 5)
    assert "1970-01-01 00:16:40 UTC (3 hours ago): boom" in text
