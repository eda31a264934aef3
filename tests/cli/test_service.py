"""The command line as an operator uses it: real processes, real ports."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import httpx
import pytest

from app.config import Settings
from app.store.codec import Codec
from app.store.migrate import current_revision
from app.store.schema import HEAD
from tests.conftest import Storage, table_rows
from tests.processes import free_port

pytestmark = pytest.mark.slow  # each test runs the command line as real processes

ROOT = Path(__file__).resolve().parents[2]


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "app.cli", *args]


def _environment(url: str) -> dict[str, str]:
    return {**os.environ, "INTAKE_DATABASE_URL": url}


Running = tuple[str, str, str, "subprocess.Popen[str]"]


@pytest.fixture
def running(sqlite_storage: Storage) -> Iterator[Running]:
    """`telegram-intake run --demo` on an ephemeral port over a fresh SQLite file;
    (base URL, database URL, the demo's secret token, the process)."""
    url = sqlite_storage.url(revision=None)
    process = subprocess.Popen(
        _command("run", "--demo", "--port", "0"),
        cwd=ROOT,
        env=_environment(url),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    assert process.stdout is not None
    announced = re.search(r"secret token (\S+)", process.stdout.readline())
    assert announced is not None, "the demo did not print its secret"
    curl = re.search(r"(http://\S+)/telegram/default", process.stdout.readline())
    assert curl is not None, "the demo did not print its curl line"
    base = curl.group(1)
    try:
        until_line(process.stderr, "Application startup complete")
    except AssertionError:
        process.kill()
        raise
    try:
        yield base, url, announced.group(1), process
    finally:
        process.terminate()
        process.wait(timeout=15)
        process.stderr.close()
        process.stdout.close()


def until_line(stream: IO[str], pattern: str, within: float = 30) -> str:
    """Read `stream` until a line matches `pattern`; that line."""
    deadline = time.monotonic() + within
    seen = []
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        seen.append(line)
        if re.search(pattern, line):
            return line
    raise AssertionError(f"no line matching {pattern!r} in:\n{''.join(seen)}")


def test_run_demo_migrates_a_fresh_sqlite_file_and_records_updates(running: Running) -> None:
    base, url, secret, _ = running
    assert httpx.get(f"{base}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{base}/readyz").json() == {"status": "ready"}  # no key: no more
    assert current_revision(url) == HEAD
    update = '{"update_id": 77, "message": {"chat": {"id": 5, "type": "private"}, "text": "hi"}}'
    headers = {"X-Telegram-Bot-Api-Secret-Token": secret, "Content-Type": "application/json"}
    response = httpx.post(f"{base}/telegram/default", content=update, headers=headers)
    assert response.status_code == 200
    # Recorded sealed under the ring `run` made for its file, and read back through it.
    ((bot, update_id, body, queue_key),) = table_rows(url, "bot", "update_id", "body", "queue_key")
    assert (bot, update_id) == ("default", 77)
    assert body.startswith("enc1:k1:")
    assert queue_key.startswith("h1:")
    ring = Settings(database_url=url).key_ring
    assert ring is not None
    assert Codec(ring).open(body, "body:default:77") == update
    assert Codec(ring).digest("5") == queue_key


def test_run_without_a_bot_says_how_to_configure_one(sqlite_storage: Storage) -> None:
    env = {
        k: v for k, v in _environment(sqlite_storage.url()).items() if k != "INTAKE_SECRET_TOKEN"
    }
    done = subprocess.run(_command("run"), cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 2
    assert "INTAKE_SECRET_TOKEN" in done.stderr


def test_invalid_configuration_stops_with_the_field_named(sqlite_storage: Storage) -> None:
    env = {**_environment(sqlite_storage.url()), "INTAKE_SECRET_TOKEN": "has spaces"}
    done = subprocess.run(_command("run"), cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 2
    assert "secret_token" in done.stderr
    assert "has spaces" not in done.stderr + done.stdout


def test_migrate_brings_postgres_to_head(postgres_storage: Storage) -> None:
    url = postgres_storage.url(revision=None)
    done = subprocess.run(
        _command("migrate"), cwd=ROOT, env=_environment(url), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert f"revision {HEAD}" in done.stdout
    assert current_revision(url) == HEAD


@pytest.mark.parametrize(
    "command", [[], ["run"], ["serve"], ["worker"], ["migrate"], ["demo-downstream"]]
)
def test_every_command_has_help(command: list[str]) -> None:
    done = subprocess.run(_command(*command, "--help"), capture_output=True, text=True)
    assert done.returncode == 0
    assert "usage: telegram-intake" in done.stdout


def test_help_needs_no_valid_configuration(sqlite_storage: Storage) -> None:
    env = {**_environment(sqlite_storage.url()), "INTAKE_MAX_BODY_BYTES": "1"}
    done = subprocess.run(_command("run", "--help"), env=env, capture_output=True, text=True)
    assert done.returncode == 0
    assert "--demo" in done.stdout


@pytest.mark.parametrize(
    ("setup", "message"),
    [("missing", "missing.toml"), ("broken", "invalid configuration")],
)
def test_a_bad_configuration_file_is_one_message_not_a_traceback(
    sqlite_storage: Storage, tmp_path: Path, setup: str, message: str
) -> None:
    config = tmp_path / f"{setup}.toml"
    if setup == "broken":
        config.write_text("[[bots]\nname = ")
    env = {**_environment(sqlite_storage.url()), "INTAKE_CONFIG": str(config)}
    done = subprocess.run(_command("run"), cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_run_demo_delivers_to_its_demo_downstream_which_checks_ownership(
    running: Running,
) -> None:
    base, url, secret, process = running
    update = '{"update_id": 78, "message": {"chat": {"id": 5, "type": "private"}, "text": "hi"}}'
    headers = {"X-Telegram-Bot-Api-Secret-Token": secret, "Content-Type": "application/json"}
    assert httpx.post(f"{base}/telegram/default", content=update, headers=headers).is_success
    assert process.stderr is not None
    # Standard error is not a terminal: one JSON object per line, the identity as fields.
    line = json.loads(until_line(process.stderr, r"demo downstream: handled"))
    assert (line["level"], line["logger"]) == ("INFO", "app.demo")
    assert (line["bot"], line["update_id"], line["attempt"]) == ("default", 78, 1)
    assert re.fullmatch(r"[0-9a-f-]{36}", line["claim_id"])
    assert line["message"].startswith(f"default:78 attempt 1 (claim {line['claim_id']}): demo")
    assert line["message"].endswith('message in chat 5: "hi"')
    deadline = time.monotonic() + 10
    while table_rows(url, "state") != [("completed",)] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert table_rows(url, "update_id", "state", "attempts") == [(78, "completed", 1)]


def test_demo_downstream_serves_a_bot_of_a_separate_service(
    sqlite_storage: Storage, tmp_path: Path
) -> None:
    url = sqlite_storage.url()
    service_port, demo_port = free_port(), free_port()
    env = {
        **_environment(url),
        "INTAKE_SECRET_TOKEN": "demo-secret",
        "INTAKE_PORT": str(service_port),
        "INTAKE_DOWNSTREAM_URL": f"http://127.0.0.1:{demo_port}/",
        "INTAKE_SIGNING_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "INTAKE_API_KEYS": "demo-downstream.key-0123",
    }
    demo_command = _command(
        "demo-downstream",
        "--port",
        str(demo_port),
        "--intake-url",
        f"http://127.0.0.1:{service_port}",
    )
    with (
        subprocess.Popen(
            _command("run"), cwd=tmp_path, env=env, stderr=subprocess.DEVNULL
        ) as service,
        subprocess.Popen(
            demo_command, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True
        ) as demo,
    ):
        try:
            assert demo.stderr is not None
            until_line(demo.stderr, r"Uvicorn running on")
            base = f"http://127.0.0.1:{service_port}"
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    httpx.get(f"{base}/healthz")
                    break
                except httpx.TransportError:
                    time.sleep(0.1)
            update = '{"update_id": 9, "message": {"chat": {"id": 3, "type": "private"}}}'
            headers = {"X-Telegram-Bot-Api-Secret-Token": "demo-secret"}
            assert httpx.post(
                f"{base}/telegram/default", content=update, headers=headers
            ).is_success
            handled = until_line(demo.stderr, r"demo downstream: handled")
            assert "default:9 attempt 1 (claim " in handled
        finally:
            service.terminate()
            demo.terminate()


def test_demo_downstream_refuses_to_start_without_a_way_to_verify(
    sqlite_storage: Storage,
) -> None:
    env = {**_environment(sqlite_storage.url()), "INTAKE_SECRET_TOKEN": "demo-secret"}
    done = subprocess.run(
        _command("demo-downstream"), env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "neither signing_secret nor downstream_secret_token" in done.stderr


def test_the_demo_s_send_line_delivers_the_sample_update_and_the_log_shows_its_journey(
    running: Running,
) -> None:
    _, url, secret, process = running
    assert process.stdout is not None
    assert process.stderr is not None
    hint = process.stdout.readline()
    command = re.search(
        r"demo: or\s+INTAKE_SECRET_TOKEN=(\S+) \S+ send default (\S+) --url (\S+)", hint
    )
    assert command is not None, hint
    assert command.group(1) == secret
    env = {**_environment(url), "INTAKE_SECRET_TOKEN": secret}
    sent = subprocess.run(
        _command("send", "default", command.group(2), "--url", command.group(3)),
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert sent.returncode == 0, sent.stderr
    assert "update 100000001: recorded" in sent.stdout
    journey = []
    for step in ("recorded", "claimed", "demo downstream: handled", "forwarded", "settled"):
        line = json.loads(until_line(process.stderr, re.escape(step)))
        assert "100000001" in line["message"], line
        journey.append(line["message"])
    assert journey[-1].endswith("settled: completed")
    console = re.search(r"demo: console\s+(\S+/console)\s+\(sign in with .*key: (\S+)\)",
                        process.stdout.readline())  # fmt: skip
    assert console is not None
    with httpx.Client(base_url=console.group(1).removesuffix("/console")) as browser:
        signed = browser.post("/console/sign-in", data={"key": console.group(2)})
        assert signed.status_code == 303
        overview = browser.get("/console")
    assert overview.status_code == 200
    assert 'id="bot-default"' in overview.text
    scrape = re.search(r"demo: metrics\s+curl -s -H '(Authorization: Bearer \S+)' (\S+)",
                       process.stdout.readline())  # fmt: skip
    assert scrape is not None
    name, _, value = scrape.group(1).partition(": ")
    metrics = httpx.get(scrape.group(2), headers={name: value}).text
    assert (
        'telegram_intake_attempts_total{bot="default",destination="default",'
        'outcome="completed"} 1.0' in metrics
    )
    assert 'telegram_intake_webhook_requests_total{bot="default",result="accepted"} 1.0' in metrics
