"""exhaustions list|ack, stats and send, as an operator runs them: real processes, over a
database seeded through the store (on each backend), and a running intake for send."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from app.store import ClaimIdentity, open_store
from tests.conftest import Storage, table_rows
from tests.downstream import message, now_ms
from tests.processes import free_port, processes

# Each test runs the command line as real processes; none is timed, so they run beside the
# timed ones rather than in their serial group.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cli-processes")]


def cli(url: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTAKE_")}
    env |= {"INTAKE_DATABASE_URL": url, "INTAKE_SECRET_TOKEN": "operator-secret"}
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def exhausted(url: str, count: int) -> list[ClaimIdentity]:
    """`count` open exhaustions of bot `shop`, plus one pending update of bot `news`."""
    store = await open_store(url)
    try:
        identities = []
        for update_id in range(1, count + 1):
            await store.add("shop", update_id, message(update_id), now_ms() - 60_000)
            now = now_ms()
            identity = await store.claim_owned(
                "shop", update_id, now=now, lease_until=now + 60_000, max_attempts=3
            )
            assert identity is not None
            assert await store.exhaust(identity, now, f"boom {update_id}")
            identities.append(identity)
        await store.add("news", 1, message(1), now_ms() - 90_000)
        return identities
    finally:
        await store.close()


async def test_exhaustions_list_pages_through_every_open_exhaustion(storage: Storage) -> None:
    url = storage.url()
    identities = await exhausted(url, 5)
    first = cli(url, "exhaustions", "list", "--limit", "2")
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    assert lines[0].split() == [
        "BOT",
        "UPDATE_ID",
        "ATTEMPT",
        "CLAIM_ID",
        "EXHAUSTED_AT",
        "(UTC)",
        "ERROR",
    ]
    assert [line.split()[1] for line in lines[1:3]] == ["1", "2"]
    assert identities[0].claim_id in lines[1]
    assert "more may follow: --after shop:2" in first.stdout
    rest = cli(url, "exhaustions", "list", "--after", "shop:2", "--limit", "10")
    assert [line.split()[1] for line in rest.stdout.splitlines()[1:4]] == ["3", "4", "5"]
    every = cli(url, "exhaustions", "list", "--all", "--limit", "2")
    assert every.stdout.count("boom") == 5
    assert "exhaustions so far" in every.stderr  # progress, on standard error
    bad = cli(url, "exhaustions", "list", "--after", "not-a-cursor")
    assert bad.returncode == 2
    assert "not a cursor bot:update_id" in bad.stderr


async def test_exhaustions_ack_takes_the_exact_identity(storage: Storage) -> None:
    url = storage.url()
    (identity,) = await exhausted(url, 1)
    fields = ["shop", "1", str(identity.attempt)]
    wrong = cli(url, "exhaustions", "ack", *fields, "another-claim")
    assert wrong.returncode == 1
    assert "no open exhaustion has exactly this identity" in wrong.stderr
    assert table_rows(url, "acknowledged_at", table="telegram_updates")[0] == (None,)
    done = cli(url, "exhaustions", "ack", *fields, identity.claim_id)
    assert done.returncode == 0, done.stderr
    assert "acknowledged shop:1 attempt" in done.stdout
    assert cli(url, "exhaustions", "list").stdout.strip() == "no open exhaustions"
    assert cli(url, "exhaustions", "ack", *fields, identity.claim_id).returncode == 1


async def test_stats_counts_rows_by_bot_and_state(storage: Storage) -> None:
    url = storage.url()
    await exhausted(url, 3)
    done = cli(url, "stats")
    assert done.returncode == 0, done.stderr
    head, news, shop = (line.split() for line in done.stdout.splitlines())
    assert head[:7] == [
        "BOT", "PENDING", "PROCESSING", "COMPLETED", "FAILED", "ABANDONED", "UNROUTED"
    ]  # fmt: skip
    assert news[:7] == ["news", "1", "0", "0", "0", "0", "0"]
    assert shop[:8] == ["shop", "0", "0", "0", "0", "3", "0", "3"]
    assert news[-1].endswith("m")  # received 90 s ago: "1.5m"
    as_json = json.loads(cli(url, "stats", "--json").stdout)
    assert as_json["shop"]["unacknowledged_exhaustions"] == 3
    assert 85_000 <= as_json["news"]["oldest_undelivered_age_ms"] <= 600_000


def test_send_posts_updates_to_a_running_intake(storage: Storage, tmp_path: Path) -> None:
    url = storage.url()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTAKE_")}
    env |= {
        "INTAKE_DATABASE_URL": url,
        "INTAKE_SECRET_TOKEN": "operator-secret",
        "INTAKE_PORT": str(port),
    }
    updates = tmp_path / "updates.json"
    updates.write_text(json.dumps([json.loads(message(n)) for n in range(10, 13)]))
    with processes(tmp_path) as start:
        start("serve", env, "serve")
        for _ in range(300):
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz")
                break
            except httpx.TransportError:
                time.sleep(0.1)
        one = cli(url, "send", "default", "-", "--url", f"http://127.0.0.1:{port}",
                  stdin=message(9))  # fmt: skip
        assert one.returncode == 0, one.stderr
        assert f"update 9: recorded by http://127.0.0.1:{port} (200)" in one.stdout
        many = cli(url, "send", "default", str(updates), "--url", f"http://127.0.0.1:{port}")
        assert many.returncode == 0, many.stderr
        assert "sent 3/3" in many.stderr
        broken = cli(url, "send", "default", "-", "--url", f"http://127.0.0.1:{port}",
                     stdin="{not json\n")  # fmt: skip
        assert broken.returncode == 2
        assert "line 1: not JSON" in broken.stderr
    assert [row[0] for row in table_rows(url, "update_id")] == [9, 10, 11, 12]
