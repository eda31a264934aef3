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
from tests.conftest import Storage

ROOT = Path(__file__).resolve().parents[1]


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "app.cli", *args]


def _environment(url: str) -> dict[str, str]:
    return {**os.environ, "INTAKE_DATABASE_URL": url}


@pytest.fixture
def running(sqlite_storage: Storage) -> Iterator[tuple[str, str]]:
    """`telegram-intake run` on an ephemeral port over a fresh SQLite file; (base URL, db URL)."""
    url = sqlite_storage.url(revision=None)
    process = subprocess.Popen(
        _command("run", "--port", "0"),
        cwd=ROOT,
        env=_environment(url),
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
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
        yield base, url
    finally:
        process.terminate()
        process.wait(timeout=15)
        process.stderr.close()


def test_run_migrates_a_fresh_sqlite_file_and_serves(running: tuple[str, str]) -> None:
    base, url = running
    assert httpx.get(f"{base}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{base}/readyz").json() == {"status": "ready", "capability": "durable"}
    assert current_revision(url) == "0002"


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
