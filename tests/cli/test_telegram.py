"""set-webhook and webhook-info against a fake Bot API on an ephemeral port, as real
processes; the bot token never appears in what they print."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.cli.telegram import describe_webhook
from app.fake_bot_api import TOKEN, FakeBotApi
from tests.conftest import serve_asgi

# Each test runs the command line as real processes; none is timed, so they run beside the
# timed ones rather than in their serial group.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cli-processes")]

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


# set-webhook's checks (the rules of Telegram's Bot API server, app/cli/webhook_checks.py). The
# fake on http://127.0.0.1 is a local Bot API server by the rule (any bot_api_url but
# api.telegram.org); the official server's rules are tested with bot_api_url
# https://api.telegram.org and every proxy variable pointing at `Trap`, a socket that accepts
# nothing: a refusal must come before any request, and the trap shows that none was tried.

OFFICIAL = "https://api.telegram.org"
HOOK = "https://intake.example.com/telegram/default"


class Trap:
    """A listening socket that never accepts: a connection to it waits in its backlog, where
    `reached` finds it after the command has ended."""

    def __init__(self) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"

    def reached(self) -> bool:
        self.socket.setblocking(False)
        try:
            connection, _ = self.socket.accept()
        except BlockingIOError:
            return False
        connection.close()
        return True


@pytest.fixture
def trap() -> Iterator[Trap]:
    trap = Trap()
    yield trap
    trap.socket.close()


def official(trap: Trap) -> dict[str, str]:
    """The environment of a bot on Telegram's own Bot API server, every request of it sent
    (through the proxy variables httpx obeys) to `trap` instead."""
    env = environment(OFFICIAL)
    for name in ("NO_PROXY", "no_proxy"):
        env.pop(name, None)
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"):
        env[name] = env[name.lower()] = trap.url
    return env


def refused(done: subprocess.CompletedProcess[str], *words: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "set-webhook refused, nothing sent:" in done.stderr
    for word in words:
        assert word in done.stderr
    assert "Traceback" not in done.stderr
    assert TOKEN not in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("allowed", "words"),
    [
        (
            "message,mesage,chat_membr,Poll",
            [
                "'mesage' (did you mean 'message'?)",
                "'chat_membr' (did you mean 'chat_member'?)",
                "'Poll' (did you mean 'poll'?)",
            ],
        ),
        ("message,no_such_update", ["'no_such_update'", "the update types are message, "]),
        (" , ", ["--allowed-updates names no update type", "leave the option out"]),
    ],
)
async def test_allowed_updates_that_are_not_update_types_are_refused_and_nothing_sent(
    allowed: str, words: list[str]
) -> None:
    fake = FakeBotApi()
    async with serve_asgi(fake.app()) as bot_api:
        done = cli(
            "set-webhook", "default", "--url", HOOK, "--allowed-updates", allowed,
            env=environment(bot_api),
        )  # fmt: skip
    refused(done, *words)
    assert fake.calls == []


@pytest.mark.parametrize(
    ("allowed", "notice"),
    [
        (None, "notice: Telegram's default allowed_updates apply, which leave out chat_member, "
         "message_reaction, message_reaction_count"),
        ("message,chat_member", "notice: allowed_updates leave out message_reaction, "
         "message_reaction_count: Telegram sends these only to a bot that names them. To "
         "receive them, name them too: --allowed-updates "
         "message,chat_member,message_reaction,message_reaction_count"),
        ("message,chat_member,message_reaction,message_reaction_count", None),
    ],
)  # fmt: skip
async def test_a_notice_names_the_opt_in_updates_telegram_will_not_send(
    allowed: str | None, notice: str | None
) -> None:
    fake = FakeBotApi()
    env = environment("")
    del env["INTAKE_ALLOWED_UPDATES"]
    option = [] if allowed is None else ["--allowed-updates", allowed]
    async with serve_asgi(fake.app()) as bot_api:
        env["INTAKE_BOT_API_URL"] = bot_api
        done = cli("set-webhook", "default", "--url", HOOK, *option, env=env)
    assert done.returncode == 0, done.stderr
    (name, params), _ = fake.calls
    assert name == "setWebhook"
    if allowed is None:
        assert "allowed_updates" not in params  # Telegram keeps what it has: its default here
    else:
        assert params["allowed_updates"] == allowed.split(",")
    if notice is None:
        assert "notice" not in done.stderr
    else:
        assert notice in done.stderr


def pem(size: int = 0) -> bytes:
    """A certificate-shaped PEM file (Telegram checks only its size), CRLF line ends; `size`:
    padded with more base64 lines up to it."""
    body = base64.encodebytes(os.urandom(900)).replace(b"\n", b"\r\n")
    text = b"-----BEGIN CERTIFICATE-----\r\n" + body + b"-----END CERTIFICATE-----\r\n"
    return text + b"A" * max(size - len(text), 0)


async def test_a_certificate_is_uploaded_as_multipart_with_its_exact_bytes(tmp_path: Path) -> None:
    certificate = pem()
    (tmp_path / "public.pem").write_bytes(certificate)
    fake = FakeBotApi()
    async with serve_asgi(fake.app()) as bot_api:
        done = cli(
            "set-webhook", "default", "--url", HOOK, "--max-connections", "80",
            "--certificate", str(tmp_path / "public.pem"), "--drop-pending-updates",
            env=environment(bot_api),
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (name, params), _ = fake.calls
    assert name == "setWebhook"
    assert fake.certificate == certificate
    # Every other parameter a form field, as Telegram reads a multipart call.
    assert params == {
        "url": HOOK,
        "secret_token": SECRET,
        "allowed_updates": '["message", "callback_query"]',
        "max_connections": "80",
        "drop_pending_updates": "true",
        "certificate": certificate,
    }
    assert fake.webhook["has_custom_certificate"] is True
    assert fake.webhook["allowed_updates"] == ["message", "callback_query"]
    assert "trusts the certificate uploaded with setWebhook" in done.stdout
    assert TOKEN not in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("size", "words"),
    [
        ((3 << 20) + 1, ["3145729 bytes, over the 3145728 bytes (3 MiB) Telegram takes"]),
        (None, ["missing.pem: cannot be read (No such file or directory)"]),
    ],
)
async def test_a_certificate_over_3_mib_or_unreadable_is_refused_and_nothing_sent(
    tmp_path: Path, size: int | None, words: list[str]
) -> None:
    path = tmp_path / "missing.pem"
    if size is not None:
        path = tmp_path / "big.pem"
        path.write_bytes(pem(size))
        assert path.stat().st_size == size
    fake = FakeBotApi()
    async with serve_asgi(fake.app()) as bot_api:
        done = cli(
            "set-webhook", "default", "--url", HOOK, "--certificate", str(path),
            env=environment(bot_api),
        )  # fmt: skip
    refused(done, *words)
    assert fake.calls == []


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [
        ("--ip-address", "2001:db8::10", ["Bot API server takes IPv4 only", "IPv6-only"]),
        ("--ip-address", "192.168.1.10", ["192.168.1.10 is in 192.168.0.0/16", "is reserved"]),
        ("--ip-address", "100.64.0.1", ["100.64.0.1 is in 100.64.0.0/10"]),
        ("--ip-address", "127.0.0.1", ["127.0.0.1 is in 127.0.0.0/8"]),
        # Not an address at all: refused by either server.
        ("--ip-address", "intake.example.com", ["'intake.example.com' is not an IP address"]),
        ("--max-connections", "101", ["101 is not 1-100, what Telegram's Bot API server"]),
        ("--max-connections", "0", ["--max-connections 0 is not 1-100"]),
        ("--url", "http://intake.example.com/telegram/default",
         ["Telegram's Bot API server (https://api.telegram.org) takes a URL that starts with "
          "https://; http:// only with a local Bot API server"]),
        ("--url", "https://intake.example.com:8080/telegram/default",
         ["ports 443, 80, 88 or 8443 only, not 8080"]),
        ("--url", "intake.example.com/telegram/default", ["starts with https://"]),
    ],
)  # fmt: skip
def test_what_telegrams_own_server_refuses_is_refused_before_any_request(
    trap: Trap, option: str, value: str, words: list[str]
) -> None:
    url = value if option == "--url" else HOOK
    extra = [] if option == "--url" else [option, value]
    done = cli("set-webhook", "default", "--url", url, *extra, env=official(trap))
    refused(done, *words)
    assert not trap.reached()


def test_the_trap_sees_a_request_to_telegrams_own_server(trap: Trap) -> None:
    """The check of the test above: a request that is made reaches the trap."""
    env = official(trap)
    env["INTAKE_BOT_API_URL"] = OFFICIAL
    code = (
        "import httpx\n"
        "try:\n"
        "    httpx.get('https://api.telegram.org', timeout=0.5)\n"
        "except httpx.HTTPError:\n"
        "    pass\n"
    )
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=30)
    assert trap.reached()


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--ip-address", "2001:db8::10"),
        ("--ip-address", "192.168.1.10"),
        ("--max-connections", "5000"),
        ("--max-connections", "100000"),
        ("--url", "http://intake.internal/telegram/default"),
        ("--url", "https://intake.example.com:8080/telegram/default"),
    ],
)
async def test_a_local_bot_api_server_takes_what_telegrams_own_refuses(
    option: str, value: str
) -> None:
    fake = FakeBotApi()
    url = value if option == "--url" else HOOK
    extra = [] if option == "--url" else [option, value]
    async with serve_asgi(fake.app()) as bot_api:
        done = cli("set-webhook", "default", "--url", url, *extra, env=environment(bot_api))
    assert done.returncode == 0, done.stderr
    (name, params), _ = fake.calls
    assert name == "setWebhook"
    assert params["url"] == url
    if option == "--ip-address":
        assert params["ip_address"] == value
        assert fake.webhook["ip_address"] == value
        assert f"delivers to IP address {value}" in done.stdout
    if option == "--max-connections":
        assert params["max_connections"] == int(value)
        assert f"max connections: {value}" in done.stdout


async def test_a_local_bot_api_server_takes_no_more_than_100000_connections() -> None:
    fake = FakeBotApi()
    async with serve_asgi(fake.app()) as bot_api:
        done = cli(
            "set-webhook", "default", "--url", HOOK, "--max-connections", "100001",
            env=environment(bot_api),
        )  # fmt: skip
    refused(done, "--max-connections 100001 is not 1-100000, what a local Bot API server takes")
    assert fake.calls == []
