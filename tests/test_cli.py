"""The command line as an operator uses it: real processes, real ports."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.store.migrate import current_revision
from tests.conftest import Storage, table_rows

ROOT = Path(__file__).resolve().parents[1]


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "app.cli", *args]


def _environment(url: str) -> dict[str, str]:
    return {**os.environ, "INTAKE_DATABASE_URL": url}


@pytest.fixture
def running(sqlite_storage: Storage) -> Iterator[tuple[str, str, str]]:
    """`telegram-intake run --demo` on an ephemeral port over a fresh SQLite file;
    (base URL, database URL, the demo's secret token)."""
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
    deadline = time.monotonic() + 30
    base = None
    while base is None and time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line and process.poll() is not None:
            break
        found = re.search(r"running on (http://\S+)", line)
        base = found.group(1) if found else None
    try:
        assert base is not None, f"the service did not start (exit {process.poll()})"
        yield base, url, announced.group(1)
    finally:
        process.terminate()
        process.wait(timeout=15)
        process.stderr.close()
        process.stdout.close()


def test_run_demo_migrates_a_fresh_sqlite_file_and_records_updates(
    running: tuple[str, str, str],
) -> None:
    base, url, secret = running
    assert httpx.get(f"{base}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{base}/readyz").json() == {"status": "ready", "capability": "durable"}
    assert current_revision(url) == "0002"
    update = '{"update_id": 77, "message": {"chat": {"id": 5, "type": "private"}, "text": "hi"}}'
    headers = {"X-Telegram-Bot-Api-Secret-Token": secret, "Content-Type": "application/json"}
    response = httpx.post(f"{base}/telegram/default", content=update, headers=headers)
    assert response.status_code == 200
    assert table_rows(url, "bot", "update_id", "body", "queue_key") == [
        ("default", 77, update, "5")
    ]


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
    assert "revision 0002" in done.stdout
    assert current_revision(url) == "0002"


@pytest.mark.parametrize("command", [[], ["run"], ["migrate"]])
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
