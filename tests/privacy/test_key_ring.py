"""The key ring as an operator gives it: settings, files, one clear line when it is wrong, and
what each command does without one."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from app.config import Settings, describe
from app.privacy.keyfiles import key_files
from app.store import open_store
from app.store.codec import Codec, key_of
from tests.cli.test_service import until_line
from tests.conftest import table_rows
from tests.privacy.rings import INDEX_KEY_TEXT, key_text
from tests.processes import ROOT, free_port

KEYS = f"k1:{key_text('k1')},k0:{key_text('k0')}"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("INTAKE_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def problem(**environment: str) -> str:
    """The start-up line these INTAKE_* settings give."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in environment.items():
            patch.setenv(f"INTAKE_{name.upper()}", value)
        with pytest.raises(ValidationError) as raised:
            Settings()
    return describe(raised.value)


def test_the_ring_comes_from_the_environment_first_key_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("INTAKE_ENCRYPTION_KEYS", KEYS)
    monkeypatch.setenv("INTAKE_INDEX_KEY", INDEX_KEY_TEXT)
    ring = Settings().key_ring

    assert ring is not None
    assert ring.ids == ("k1", "k0")
    assert ring.current == "k1"


def test_the_ring_comes_from_files_as_platforms_mount_secrets(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "keys").write_text(KEYS.replace(",", "\n") + "\n")
    (tmp_path / "index").write_text(INDEX_KEY_TEXT + "\n")
    monkeypatch.setenv("INTAKE_ENCRYPTION_KEYS_FILE", str(tmp_path / "keys"))
    monkeypatch.setenv("INTAKE_INDEX_KEY_FILE", str(tmp_path / "index"))

    ring = Settings().key_ring
    assert ring is not None
    assert ring.ids == ("k1", "k0")


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({"encryption_keys": "k1"}, "encryption_keys: entry 1 is not id:base64"),
        ({"encryption_keys": "k1:not base64!"}, "encryption_keys: key 'k1' is not base64"),
        ({"encryption_keys": "k1:c2hvcnQ="}, "encryption_keys: key 'k1' is 5 bytes, not 32"),
        ({"encryption_keys": "bad id:" + key_text("x")}, "entry 1 is not id:base64"),
        ({"encryption_keys": KEYS}, "index_key: required with encryption_keys"),
        ({"index_key": INDEX_KEY_TEXT}, "index_key: set without encryption_keys"),
        (
            {"encryption_keys": f"k1:{key_text('a')},k1:{key_text('b')}", "index_key": "x"},
            "index_key is not base64",
        ),
        (
            {"encryption_keys": KEYS, "index_key": INDEX_KEY_TEXT, "index_key_file": "/x"},
            "index_key: set it or index_key_file, not both",
        ),
        (
            {"encryption_keys_file": "/no/such/file", "index_key": INDEX_KEY_TEXT},
            "encryption_keys_file: cannot read /no/such/file: No such file or directory",
        ),
    ],
)
def test_a_ring_that_cannot_be_used_stops_start_up_in_one_line_without_its_keys(
    environment: dict[str, str], expected: str
) -> None:
    shown = problem(**environment)

    assert expected in shown
    assert "\n" not in shown
    for value in environment.values():
        for part in value.split(","):
            secret = part.partition(":")[2]
            assert not secret or len(secret) < 40 or secret not in shown


def test_repeated_key_ids_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    shown = problem(
        encryption_keys=f"k1:{key_text('a')},k1:{key_text('b')}", index_key=INDEX_KEY_TEXT
    )
    assert "key ids ['k1'] repeat" in shown


def command(tmp_path: Path, *args: str, **environment: str) -> subprocess.CompletedProcess[str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("INTAKE_")}
    env |= {f"INTAKE_{name.upper()}": value for name, value in environment.items()}
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        cwd=tmp_path,
        env=env | {"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.slow
def test_serve_without_a_ring_warns_naming_the_terms_and_require_refuses(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'intake.db'}"
    refused = command(
        tmp_path, "serve", database_url=url, secret_token="s", require_encryption="true"
    )
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "require_encryption: personal data is stored unencrypted: Telegram's Bot Developer "
        "Terms (4.4(a)) want it encrypted at rest; set INTAKE_ENCRYPTION_KEYS and "
        "INTAKE_INDEX_KEY (docs/privacy.md)"
    ]
    env = {name: value for name, value in os.environ.items() if not name.startswith("INTAKE_")}
    env |= {
        "INTAKE_DATABASE_URL": url,
        "INTAKE_SECRET_TOKEN": "s",
        "INTAKE_LOG_FORMAT": "text",
        "INTAKE_PORT": str(free_port()),
    }
    serve = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve"],
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert serve.stderr is not None
    try:
        line = until_line(serve.stderr, "personal data is stored unencrypted")
        assert "Bot Developer Terms (4.4(a))" in line
        until_line(serve.stderr, "Application startup complete")
    finally:
        serve.terminate()
        serve.wait(timeout=15)
        serve.stderr.close()
    assert not key_files(tmp_path / "intake.db")[0].exists(), "serve made a ring"


@pytest.mark.slow
def test_run_on_sqlite_makes_a_ring_of_its_own_beside_the_file_and_every_command_reads_it(
    tmp_path: Path,
) -> None:
    database = tmp_path / "var" / "intake.db"
    url = f"sqlite:///{database}"
    env = {name: value for name, value in os.environ.items() if not name.startswith("INTAKE_")}
    env |= {"INTAKE_DATABASE_URL": url, "INTAKE_LOG_FORMAT": "text", "PYTHONUNBUFFERED": "1"}
    run = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "run", "--demo", "--port", "0"],
        cwd=tmp_path,
        env=env | {"INTAKE_REQUIRE_ENCRYPTION": "true"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert run.stderr is not None
    assert run.stdout is not None
    keys, index = key_files(database)
    try:
        line = until_line(run.stderr, "this SQLite file's key ring is")
        assert str(keys) in line
        until_line(run.stderr, "Application startup complete")
        curl = until_line(run.stdout, "curl")
        assert "/telegram/default" in curl
    finally:
        run.terminate()
        run.wait(timeout=15)
        run.stderr.close()
        run.stdout.close()
    for path in (keys, index):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        assert path.read_text().strip()
        assert path.parent == database.parent

    # Every later command on that file finds the same ring: a row sealed under it is found
    # by the CLI's body search, which opens it.
    ring = Settings(database_url=url).key_ring
    assert ring is not None
    assert ring.ids == ("k1",)

    async def record() -> None:
        store = await open_store(url, codec=Codec(ring))
        try:
            chat = {"id": 5150, "type": "private"}
            body = {"update_id": 7, "message": {"chat": chat, "text": "Wombat-marker"}}
            await store.add("default", 7, json.dumps(body), 1, queue_key="5150")
        finally:
            await store.close()

    asyncio.run(record())
    ((stored,),) = table_rows(url, "body")
    assert key_of(stored) == "k1"
    env = {"database_url": url, "secret_token": "s"}
    shown = command(tmp_path, "updates", "--chat", "5150", "--contains", "Wombat", "--json", **env)
    assert shown.returncode == 0, shown.stderr
    assert [item["update_id"] for item in json.loads(shown.stdout)] == [7]
