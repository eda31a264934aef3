"""The commands of personal data as an operator runs them: erase (a dry run, then for good),
forget-bot, and keys status, as real processes on the database the service uses."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.store import NewUpdate, open_store
from app.store.codec import Codec
from tests.conftest import Storage
from tests.privacy.rings import INDEX_KEY_TEXT, key_text, test_ring
from tests.processes import ROOT

# Real processes that measure no time: beside the serial group (tests/conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("untimed")]

ALICE, BOB = 7_001, 7_002


def command(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("INTAKE_")}
    env |= {
        "INTAKE_DATABASE_URL": url,
        "INTAKE_SECRET_TOKEN": "s",
        "INTAKE_ENCRYPTION_KEYS": f"t1:{key_text('t1')}",
        "INTAKE_INDEX_KEY": INDEX_KEY_TEXT,
    }
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_erase_counts_then_erases_and_forget_bot_takes_the_rest(
    storage: Storage, tmp_path: Path
) -> None:
    url = storage.url()

    async def record() -> None:
        store = await open_store(url, codec=Codec(test_ring()))
        try:
            rows = []
            for update_id, user in ((1, ALICE), (2, ALICE), (3, BOB)):
                chat = {"id": user, "type": "private"}
                body = json.dumps({"update_id": update_id, "message": {"chat": chat}})
                rows.append(NewUpdate("default", update_id, body, 1, subjects=(user,)))
            await store.add_many(rows)
        finally:
            await store.close()

    asyncio.run(record())
    status = command(url, "keys", "status", "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout) == {"none": 0, "t1": 3}

    dry = command(url, "erase", "default", "--user", str(ALICE), "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    counted = json.loads(dry.stdout)
    assert (counted["state"], counted["dry_run"], counted["updates"]) == ("done", True, 2)
    assert str(ALICE) not in dry.stdout

    done = command(url, "erase", "default", "--chat", str(ALICE), "--json")
    assert json.loads(done.stdout)["updates"] == 2, done.stderr
    # Bob's body, and the erasure's audit entry (its detail sealed too; counts, no id).
    assert json.loads(command(url, "keys", "status", "--json").stdout) == {"none": 0, "t1": 2}

    refused = command(url, "forget-bot", "default")
    assert refused.returncode == 2
    assert "add --yes" in refused.stderr
    forgotten = command(url, "forget-bot", "default", "--yes")
    assert forgotten.returncode == 0, forgotten.stderr
    assert "erased 1 updates" in forgotten.stdout
    # Nothing of the bot's left: the two audit entries' details only.
    assert json.loads(command(url, "keys", "status", "--json").stdout) == {"none": 0, "t1": 2}
