"""Operator control from the command line (docs/contract.md section 9): bots, pause, resume,
rate-limit, updates, attempts, park, audit and `exhaustions redrive|ack`, as an operator runs them:
real processes over a database seeded through the store, on each backend, with two bots configured
in ./intake.toml (each test's working directory). Every action is recorded under the CLI's
`cli:USER@HOST`."""

from __future__ import annotations

import concurrent.futures
import contextlib
import getpass
import io
import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from app.cli import main
from app.store import ClaimIdentity, Completed, Failed, NewUpdate, SqlUpdateStore, open_store
from app.store.types import Route
from tests.conftest import Storage
from tests.downstream import message, now_ms


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the command line as `python -m app.cli` would, but in this process (on a thread of
    its own, for its own event loop): the same `main`, settings from the same environment
    and ./intake.toml, its output and exit code. About a hundred runs here; a process each
    cost minutes of the suite. tests/cli/test_operations.py and the `--help` test below run
    real processes."""
    saved = {name: os.environ.get(name) for name in ("INTAKE_DATABASE_URL", "INTAKE_SECRET_TOKEN")}
    os.environ.update(INTAKE_DATABASE_URL=url, INTAKE_SECRET_TOKEN="operator-secret")
    out, err = io.StringIO(), io.StringIO()

    def run() -> int:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                return main(list(args))
            except SystemExit as exit:  # argparse's refusals
                return exit.code if isinstance(exit.code, int) else 2

    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            code = pool.submit(run).result(timeout=60)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


ACTOR = f"cli:{getpass.getuser()}@{socket.gethostname()}"
CONFIG = """
[[bots]]
name = "shop"
secret_token = "shop-secret"

[[bots]]
name = "news"
secret_token = "news-secret"
"""


@pytest.fixture(autouse=True)
def _two_bots(tmp_path: Path) -> None:
    """Bots shop and news, from ./intake.toml: the working directory of the test and of the
    commands it runs."""
    assert Path.cwd() == tmp_path
    (tmp_path / "intake.toml").write_text(CONFIG)


@asynccontextmanager
async def opened(url: str) -> AsyncIterator[SqlUpdateStore]:
    store = await open_store(url)
    try:
        yield store
    finally:
        await store.close()


async def claimed(store: SqlUpdateStore, bot: str, update_id: int) -> ClaimIdentity:
    now = now_ms()
    identity = await store.claim_owned(
        bot, update_id, now=now, lease_until=now + 60_000, max_attempts=8, durable_exhaustion=True
    )
    assert identity is not None, (bot, update_id)
    return identity


async def seeded(url: str) -> dict[tuple[str, int], ClaimIdentity]:
    """Open exhaustions of shop (1-3: HTTP 500 in chats 42 and 43; 4: an HTTP 400 callback
    query in chat 44), news:1 pending, news:2 leased, news:3 completed; returns the
    exhaustions' and news:2's identities."""
    made = {}
    base = now_ms() - 600_000
    async with opened(url) as store:
        for update_id, kind, chat, error in [
            (1, "message", "42", "HTTP 500: boom 1"),
            (2, "message", "42", "HTTP 500: boom 2"),
            (3, "message", "43", "HTTP 500: boom 3"),
            (4, "callback_query", "44", "HTTP 400: bad request"),
        ]:
            body = message(update_id, chat=int(chat), text=f"order {update_id}")
            received = base + update_id * 1000
            assert await store.add(
                "shop", update_id, body, received, update_type=kind, queue_key=chat
            )
            identity = await claimed(store, "shop", update_id)
            assert await store.exhaust(identity, now_ms(), error, status=int(error[5:8]))
            made[("shop", update_id)] = identity
        for update_id in (1, 2, 3):
            body = message(update_id, chat=7, text=f"news {update_id}")
            received = base + (10 + update_id) * 1000
            assert await store.add(
                "news",
                update_id,
                body,
                received,
                update_type="message",
                queue_key=str(90 + update_id),
            )
        made[("news", 2)] = await claimed(store, "news", 2)
        done = await claimed(store, "news", 3)
        assert await store.settle_owned(done, Completed(now_ms(), status=200))
    return made


async def row(url: str, bot: str, update_id: int) -> Any:
    async with opened(url) as store:
        found = await store.get_update(bot, update_id)
    assert found is not None
    return found


async def open_exhaustions(url: str) -> list[tuple[str, int]]:
    async with opened(url) as store:
        found = await store.due_exhaustions(limit=100)
    return [(e.identity.bot, e.identity.update_id) for e in found]


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, (result.args, result.stdout, result.stderr)
    return result


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(ok(result).stdout)


def refused(result: subprocess.CompletedProcess[str], code: int, says: str) -> None:
    assert result.returncode == code, (result.args, result.returncode, result.stdout)
    assert says in result.stderr, (result.args, result.stderr)


# -- bots, pause, resume, rate-limit ------------------------------------------------------------


async def test_bots_shows_every_configured_bot_as_a_table_and_as_json(storage: Storage) -> None:
    url = storage.url()
    await seeded(url)
    table = ok(cli(url, "bots")).stdout.splitlines()
    assert table[0].split()[:3] == ["BOT", "STATUS", "RATE/S"]
    assert "PENDING" in table[0]
    assert "OPEN EXH." in table[0]
    assert "OLDEST" in table[0]
    rows = {line.split()[0]: line.split() for line in table[1:]}
    assert set(rows) == {"shop", "news"}
    assert rows["shop"][1:3] == ["running", "-"]
    # shop: four abandoned rows, all open exhaustions; news: 1 pending, 1 processing, 1 done.
    # pending, processing, completed, failed, abandoned, unrouted; open exhaustions
    assert rows["shop"][3:10] == ["0", "0", "0", "0", "4", "0", "4"]
    assert rows["news"][3:10] == ["1", "1", "1", "0", "0", "0", "0"]
    assert rows["shop"][10] == "-"
    assert rows["news"][10].endswith("m")
    listed = {item["bot"]: item for item in as_json(cli(url, "bots", "--json"))}
    assert set(listed) == {"shop", "news"}
    assert listed["shop"]["counts"] == {"abandoned": 4}
    assert listed["shop"]["open_exhaustions"] == 4
    assert listed["shop"]["oldest_undelivered_age_ms"] is None
    assert listed["news"]["counts"] == {"pending": 1, "processing": 1, "completed": 1}
    assert 580_000 <= listed["news"]["oldest_undelivered_age_ms"] <= 1_200_000
    for item in listed.values():
        assert (item["paused"], item["paused_by"], item["rate_limit_per_second"]) == (
            False,
            None,
            None,
        )
    ok(cli(url, "pause", "news", "--reason", "deploy"))
    ok(cli(url, "rate-limit", "shop", "2.5"))
    listed = {item["bot"]: item for item in as_json(cli(url, "bots", "--json"))}
    assert (listed["news"]["paused"], listed["news"]["paused_by"]) == (True, ACTOR)
    assert listed["news"]["paused_reason"] == "deploy"
    assert listed["shop"]["rate_limit_per_second"] == 2.5
    table = ok(cli(url, "bots")).stdout
    assert f"paused by {ACTOR}" in table
    assert "2.5" in table


async def test_pause_and_resume_bind_every_claim_and_are_audited(storage: Storage) -> None:
    url = storage.url()
    await seeded(url)
    first = ok(cli(url, "pause", "news", "--reason", "downstream maintenance"))
    assert "paused news" in first.stdout
    assert "news was paused already" in ok(cli(url, "pause", "news")).stdout
    async with opened(url) as store:
        (control,) = await store.bot_controls(["news"])
        assert (control.paused, control.paused_by) == (True, ACTOR)
        assert control.paused_reason == "downstream maintenance"
        now = now_ms()
        held = await store.claim_next_owned(
            now=now, lease_until=now + 60_000, max_attempts=8, limit=10, bots=["news"]
        )
        assert held == []
    assert "resumed news" in ok(cli(url, "resume", "news")).stdout
    assert "news was not paused" in ok(cli(url, "resume", "news")).stdout
    async with opened(url) as store:
        now = now_ms()
        taken = await store.claim_next_owned(
            now=now, lease_until=now + 60_000, max_attempts=8, limit=10, bots=["news"]
        )
        assert [c.identity.update_id for c in taken] == [1]
    audit = as_json(cli(url, "audit", "--json"))
    assert [(e["key_name"], e["action"], e["target"]) for e in audit] == [
        (ACTOR, "resume", "news"),
        (ACTOR, "pause", "news"),
    ]
    assert audit[1]["detail"] == {"reason": "downstream maintenance"}
    assert audit[0]["detail"] is None
    # A bot that is not configured, or not a bot name at all.
    for command in ("pause", "resume"):
        refused(cli(url, command, "ghost"), 2, "no bot 'ghost' is configured")
        refused(cli(url, command, "Shop"), 2, "Shop")
    assert len(as_json(cli(url, "audit", "--json"))) == 2


async def test_rate_limit_sets_and_lifts_a_limit_and_refuses_a_bad_rate(storage: Storage) -> None:
    url = storage.url()
    done = ok(cli(url, "rate-limit", "shop", "2.5"))
    assert "shop: at most 2.5 attempts/s, across every worker process" in done.stdout
    async with opened(url) as store:
        assert (await store.bot_controls(["shop"]))[0].rate_per_second == 2.5
    for bad, says in [
        ("0", "is not in"),
        ("-1", "is not in"),  # argparse takes it for an option: refused all the same
        ("0.0001", "is not in"),
        ("2000000", "is not in"),
        ("ten", "'ten' is not a number or 'off'"),
        ("nan", "is not in"),
    ]:
        result = cli(url, "rate-limit", "shop", bad)
        assert result.returncode == 2, (bad, result.stderr)
        assert says in result.stderr or bad == "-1", (bad, result.stderr)
    refused(cli(url, "rate-limit", "ghost", "5"), 2, "no bot 'ghost' is configured")
    async with opened(url) as store:
        assert (await store.bot_controls(["shop"]))[0].rate_per_second == 2.5
    lifted = ok(cli(url, "rate-limit", "shop", "off"))
    assert "shop: no limit" in lifted.stdout
    async with opened(url) as store:
        assert (await store.bot_controls(["shop"]))[0].rate_per_second is None
    audit = as_json(cli(url, "audit", "--json"))
    assert [(e["key_name"], e["action"], e["detail"]) for e in audit] == [
        (ACTOR, "rate_limit", {"per_second": None}),
        (ACTOR, "rate_limit", {"per_second": 2.5}),
    ]


# -- updates, attempts, park ---------------------------------------------------------------------


def update_keys(items: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(item["bot"], item["update_id"]) for item in items]


async def test_updates_searches_by_every_filter(storage: Storage) -> None:
    url = storage.url()
    await seeded(url)
    table = ok(cli(url, "updates")).stdout.splitlines()
    assert table[0].split()[:6] == ["BOT", "UPDATE_ID", "STATE", "ATTEMPTS", "TYPE", "CHAT"]
    # Newest first: news (received later), then shop.
    assert [line.split()[:2] for line in table[1:]] == [
        ["news", "3"],
        ["news", "2"],
        ["news", "1"],
        ["shop", "4"],
        ["shop", "3"],
        ["shop", "2"],
        ["shop", "1"],
    ]
    assert "HTTP 400: bad request" in table[4]
    received = (await row(url, "shop", 3)).received_at
    cases: list[tuple[list[str], list[tuple[str, int]]]] = [
        (["--bot", "news"], [("news", 3), ("news", 2), ("news", 1)]),
        (["--state", "abandoned"], [("shop", 4), ("shop", 3), ("shop", 2), ("shop", 1)]),
        (["--bot", "news", "--state", "processing"], [("news", 2)]),
        (["--chat", "42"], [("shop", 2), ("shop", 1)]),
        (["--type", "callback_query"], [("shop", 4)]),
        (["--contains", "order 3"], [("shop", 3)]),
        (["--received-after", str(received), "--bot", "shop"], [("shop", 4), ("shop", 3)]),
        (["--received-before", str(received)], [("shop", 2), ("shop", 1)]),
        (["--limit", "2"], [("news", 3), ("news", 2)]),
        (["--contains", "nowhere"], []),
    ]
    for arguments, expected in cases:
        items = as_json(cli(url, "updates", *arguments, "--json"))
        assert update_keys(items) == expected, arguments
    (item,) = as_json(cli(url, "updates", "--bot", "shop", "--chat", "43", "--json"))
    assert (item["state"], item["update_type"], item["queue_key"]) == ("abandoned", "message", "43")
    assert (item["error"], item["received_at"]) == ("HTTP 500: boom 3", received)
    # An ISO 8601 time, UTC unless it says otherwise.
    iso = datetime.fromtimestamp(received / 1000, UTC).isoformat()
    late = as_json(cli(url, "updates", "--bot", "shop", "--received-after", iso, "--json"))
    assert update_keys(late) == [("shop", 4), ("shop", 3)]
    assert ok(cli(url, "updates", "--chat", "nobody")).stdout.strip() == "no update matches"
    refused(cli(url, "updates", "--bot", "ghost"), 2, "no bot 'ghost' is configured")
    refused(cli(url, "updates", "--state", "lost"), 2, "invalid choice")
    refused(cli(url, "updates", "--received-after", "yesterday"), 2, "neither epoch")


async def test_attempts_lists_every_attempt_of_an_update(storage: Storage) -> None:
    url = storage.url()
    made = await seeded(url)
    async with opened(url) as store:
        assert await store.add("shop", 9, message(9), now_ms())
        first = await claimed(store, "shop", 9)
        failed_at = now_ms()
        assert await store.settle_owned(
            first, Failed(failed_at, failed_at, "HTTP 502: bad gateway", status=502)
        )
        now = failed_at + 1
        second = await store.claim_owned(
            "shop", 9, now=now, lease_until=now + 60_000, max_attempts=8
        )
        assert second is not None
        worker = store.worker
    table = ok(cli(url, "attempts", "shop", "9")).stdout.splitlines()
    assert table[0].split()[:4] == ["ATTEMPT", "OUTCOME", "STATUS", "STARTED"]
    assert table[1].split()[:3] == ["1", "failed", "502"]
    assert table[2].split()[:3] == ["2", "running", "-"]
    assert first.claim_id in table[1]
    assert second.claim_id in table[2]
    one, two = as_json(cli(url, "attempts", "shop", "9", "--json"))
    assert (one["attempt"], one["claim_id"], one["outcome"], one["status_code"]) == (
        1,
        first.claim_id,
        "failed",
        502,
    )
    assert (one["error"], one["ended_at"], one["worker"]) == (
        "HTTP 502: bad gateway",
        failed_at,
        worker,
    )
    assert one["duration_ms"] == failed_at - one["started_at"]
    assert (two["outcome"], two["ended_at"], two["duration_ms"]) == ("running", None, None)
    (exhausted,) = as_json(cli(url, "attempts", "shop", "4", "--json"))
    assert (exhausted["outcome"], exhausted["status_code"]) == ("exhausted", 400)
    assert exhausted["claim_id"] == made[("shop", 4)].claim_id
    assert ok(cli(url, "attempts", "news", "1")).stdout.strip() == "no attempt yet"
    refused(cli(url, "attempts", "shop", "99"), 1, "no update 99 of bot 'shop' is recorded")


async def test_park_ends_the_current_attempt_as_an_exhaustion(storage: Storage) -> None:
    url = storage.url()
    made = await seeded(url)
    live = made[("news", 2)]
    refused(cli(url, "park", "news", "2"), 2, "--reason")
    parked = ok(cli(url, "park", "news", "2", "--reason", "crashes the handler"))
    assert f"parked news:2 attempt {live.attempt} as an exhaustion" in parked.stdout
    found = await row(url, "news", 2)
    assert (found.state, found.error, found.acknowledged_at) == (
        "abandoned",
        "parked: crashes the handler",
        None,
    )
    assert found.exhausted_at is not None
    assert ("news", 2) in await open_exhaustions(url)
    (attempt,) = as_json(cli(url, "attempts", "news", "2", "--json"))
    assert (attempt["outcome"], attempt["error"]) == ("parked", "crashes the handler")
    # Nothing to park: a pending update, a terminal one, one not recorded.
    refused(cli(url, "park", "news", "1", "--reason", "x"), 1, "has no attempt to park (pending)")
    refused(cli(url, "park", "news", "2", "--reason", "x"), 1, "(abandoned)")
    refused(cli(url, "park", "news", "99", "--reason", "x"), 1, "(not recorded)")
    (entry,) = as_json(cli(url, "audit", "--json"))
    assert (entry["key_name"], entry["action"], entry["target"]) == (ACTOR, "park", "news/2")
    assert entry["detail"] == {"attempt": live.attempt, "reason": "crashes the handler"}


async def test_a_destination_is_paused_resumed_limited_and_parked_on_its_own(
    storage: Storage, tmp_path: Path
) -> None:
    """`--destination` (docs/destinations.md): the action is on that destination's controls
    or delivery alone, audited as bot/destination."""
    (tmp_path / "intake.toml").write_text(
        CONFIG.replace(
            'name = "shop"\nsecret_token = "shop-secret"\n',
            'name = "shop"\nsecret_token = "shop-secret"\ndownstream_url = "http://127.0.0.1:9/"\n'
            '[[bots.destinations]]\nname = "payments"\nurl = "http://127.0.0.1:9/"\n',
        )
    )
    url = storage.url()
    async with opened(url) as store:
        routes = (Route("default"), Route("payments"))
        await store.add_many([NewUpdate("shop", 1, message(1), now_ms(), routes=routes)])
        now = now_ms()
        claim = {"now": now, "lease_until": now + 60_000, "max_attempts": 8, "limit": 1}
        (paying,) = await store.claim_next_owned(**claim, destination="payments")
    paused = ok(cli(url, "pause", "shop", "--destination", "payments", "--reason", "refunds"))
    assert "paused shop/payments" in paused.stdout
    ok(cli(url, "rate-limit", "shop", "3", "--destination", "payments"))
    async with opened(url) as store:
        (own,) = await store.bot_controls(["shop"], destinations=True)
        (bot,) = await store.bot_controls(["shop"])
    assert (own.destination, own.paused_reason, own.rate_per_second) == ("payments", "refunds", 3)
    assert (bot.paused, bot.rate_per_second) == (False, None)  # the bot's own: untouched
    assert (
        "resumed shop/payments"
        in ok(cli(url, "resume", "shop", "--destination", "payments")).stdout
    )
    refused(cli(url, "pause", "shop", "--destination", "Pay Ments"), 2, "not a destination name")
    refused(cli(url, "park", "shop", "1", "--reason", "x"), 1, "(pending)")  # default's row
    parked = ok(cli(url, "park", "shop", "1", "--destination", "payments", "--reason", "by hand"))
    assert f"parked shop:1 attempt {paying.identity.attempt}" in parked.stdout
    async with opened(url) as store:
        found = await store.get_update("shop", 1)
    assert found is not None
    assert [(d.destination, d.state) for d in found.deliveries] == [("payments", "abandoned")]
    targets = [entry["target"] for entry in as_json(cli(url, "audit", "--json"))]
    assert targets == ["shop/payments/1", "shop/payments", "shop/payments", "shop/payments"]


async def test_replay_delivers_a_range_to_a_destination_added_later(
    storage: Storage, tmp_path: Path
) -> None:
    """`replay` (docs/destinations.md): a dry run counts, the act adds each missing delivery
    and is audited; a destination the bot lacks, or a range backwards, is refused."""
    (tmp_path / "intake.toml").write_text(
        CONFIG.replace(
            'name = "shop"\nsecret_token = "shop-secret"\n',
            'name = "shop"\nsecret_token = "shop-secret"\ndownstream_url = "http://127.0.0.1:9/"\n'
            '[[bots.destinations]]\nname = "payments"\nurl = "http://127.0.0.1:9/"\n',
        )
    )
    url = storage.url()
    async with opened(url) as store:
        at = now_ms()
        await store.add_many(
            [
                NewUpdate("shop", 1, message(1), at),  # before payments was added
                NewUpdate("shop", 2, message(2), at, routes=(Route("payments"),)),
            ]
        )
    span = ("--from", "1", "--to", "2")
    dry = ok(cli(url, "replay", "shop", "--destination", "payments", *span, "--dry-run"))
    assert dry.stdout.strip() == (
        "would replay 1 updates 1-2 of shop to payments (dry run: nothing changed)"
    )
    done = ok(cli(url, "replay", "shop", "--destination", "payments", *span))
    assert done.stdout.strip() == "replayed 1 updates 1-2 of shop to payments: each due now"
    back = ok(cli(url, "replay", "shop", "--destination", "default", *span))
    assert back.stdout.startswith("replayed 1 updates")  # 2 was unrouted
    async with opened(url) as store:
        found = [await store.get_update("shop", n) for n in (1, 2)]
    assert [(u.state, [d.destination for d in u.deliveries or ()]) for u in found if u] == [
        ("pending", ["payments"]),
        ("pending", ["payments"]),
    ]
    seen = as_json(cli(url, "updates", "--bot", "shop", "--destination", "payments", "--json"))
    assert [(u["update_id"], u["destination"], u["state"]) for u in seen] == [
        (2, "payments", "pending"),
        (1, "payments", "pending"),
    ]
    refused(cli(url, "replay", "shop", "--destination", "refunds", *span), 2, "no destination")
    refused(cli(url, "replay", "shop", "--destination", "payments", "--from", "3", "--to", "1"),
            1, "is empty")  # fmt: skip
    targets = [(e["action"], e["target"]) for e in as_json(cli(url, "audit", "--json"))]
    assert targets == [("replay", "shop/default"), ("replay", "shop/payments")]


# -- exhaustions redrive and ack -----------------------------------------------------------------


async def test_exhaustions_redrive_by_filter_dry_run_then_paced(storage: Storage) -> None:
    url = storage.url()
    made = await seeded(url)
    refused(cli(url, "exhaustions", "redrive"), 2, "or pass --all")
    before = [await row(url, "shop", n) for n in (1, 2, 3, 4)]
    dry = ok(cli(url, "exhaustions", "redrive", "--bot", "shop", "--error-contains", "HTTP 500",
                 "--dry-run"))  # fmt: skip
    lines = dry.stdout.splitlines()
    assert lines[0] == "dry run: 3 open exhaustions would be redriven"
    assert [line.split()[0] for line in lines[1:]] == ["shop:1", "shop:2", "shop:3"]
    assert "HTTP 500: boom 1" in lines[1]
    assert [await row(url, "shop", n) for n in (1, 2, 3, 4)] == before
    as_dry = as_json(cli(url, "exhaustions", "redrive", "--chat", "42", "--dry-run", "--json"))
    assert (as_dry["matched"], as_dry["redriven"]) == (2, 0)
    assert as_dry["sample"][0] == {
        "bot": "shop",
        "update_id": 1,
        "attempt": made[("shop", 1)].attempt,
        "claim_id": made[("shop", 1)].claim_id,
        "destination": "default",
    }
    refused(cli(url, "exhaustions", "redrive", "--bot", "shop", "--rate", "0"), 2, "is not in")
    refused(cli(url, "exhaustions", "redrive", "--bot", "shop", "--rate", "x"), 2, "not a number")
    assert await open_exhaustions(url) == [("shop", 1), ("shop", 2), ("shop", 3), ("shop", 4)]

    real = ok(cli(url, "exhaustions", "redrive", "--bot", "shop", "--error-contains", "HTTP 500",
                  "--rate", "10"))  # fmt: skip
    assert "redriven 3 of 3 open exhaustions" in real.stdout
    assert "... 3 so far" in real.stderr  # progress, on standard error
    redriven = [await row(url, "shop", n) for n in (1, 2, 3)]
    assert [r.state for r in redriven] == ["failed"] * 3
    assert [r.due_at - redriven[0].due_at for r in redriven] == [0, 100, 200]
    assert await open_exhaustions(url) == [("shop", 4)]
    # Its attempt numbers go on: the old identity matches nothing any more.
    async with opened(url) as store:
        assert not await store.acknowledge_exhaustion(made[("shop", 1)], now_ms())
    every = ok(cli(url, "exhaustions", "redrive", "--all"))
    assert "redriven 1 of 1 open exhaustions" in every.stdout
    assert await open_exhaustions(url) == []
    audit = as_json(cli(url, "audit", "--json"))
    assert [(e["key_name"], e["action"], e["matched"]) for e in audit] == [
        (ACTOR, "redrive", 1),
        (ACTOR, "redrive", 3),
    ]
    assert audit[1]["detail"] == {
        "filter": {"bots": ["shop"], "error_contains": "HTTP 500"},
        "rate_per_second": 10.0,
    }


async def test_exhaustions_ack_by_filter_and_by_exact_identity(storage: Storage) -> None:
    url = storage.url()
    made = await seeded(url)
    refused(cli(url, "exhaustions", "ack"), 2, "or pass --all")
    dry = ok(cli(url, "exhaustions", "ack", "--bot", "shop", "--type", "callback_query",
                 "--dry-run"))  # fmt: skip
    assert dry.stdout.splitlines()[0] == "dry run: 1 open exhaustions would be acknowledged"
    assert len(await open_exhaustions(url)) == 4
    real = as_json(cli(url, "exhaustions", "ack", "--bot", "shop", "--type", "callback_query",
                       "--json"))  # fmt: skip
    assert (real["matched"], real["acknowledged"]) == (1, 1)
    assert (await row(url, "shop", 4)).acknowledged_at is not None
    # The positional form: one exact identity.
    one = made[("shop", 1)]
    fields = ["shop", "1", str(one.attempt)]
    refused(cli(url, "exhaustions", "ack", *fields, "another-claim"), 1,
            "no open exhaustion has exactly this identity")  # fmt: skip
    refused(cli(url, "exhaustions", "ack", "shop", "1"), 2, "BOT UPDATE_ID ATTEMPT CLAIM_ID")
    refused(cli(url, "exhaustions", "ack", "shop", "one", "1", "c"), 2, "not an identity")
    done = ok(cli(url, "exhaustions", "ack", *fields, one.claim_id))
    assert f"acknowledged shop:1 attempt {one.attempt}" in done.stdout
    assert await open_exhaustions(url) == [("shop", 2), ("shop", 3)]
    every = ok(cli(url, "exhaustions", "ack", "--all"))
    assert "acknowledged 2 of 2 open exhaustions" in every.stdout
    assert await open_exhaustions(url) == []
    audit = as_json(cli(url, "audit", "--json", "--limit", "2"))
    assert [(e["action"], e["target"], e["matched"]) for e in audit] == [
        ("acknowledge", "exhaustions", 2),
        ("acknowledge", "shop", 1),
    ]
    assert audit[1]["detail"] == {"identities": [f"shop/1/{one.attempt}"]}
    # The attempt with a wrong claim_id is recorded too, as matching nothing.
    older = as_json(cli(url, "audit", "--json", "--after", str(audit[-1]["id"])))
    assert [(e["action"], e["detail"], e["matched"]) for e in older] == [
        ("acknowledge", {"identities": [f"shop/1/{one.attempt}"]}, 0),
        ("acknowledge", {"filter": {"bots": ["shop"], "update_type": "callback_query"}}, 1),
    ]


async def test_audit_prints_a_table_and_says_when_empty(storage: Storage) -> None:
    url = storage.url()
    assert ok(cli(url, "audit")).stdout.strip() == "no operator action recorded"
    ok(cli(url, "pause", "shop", "--reason", "deploy"))
    table = ok(cli(url, "audit")).stdout.splitlines()
    assert table[0].split() == ["ID", "AT", "(UTC)", "KEY", "ACTION", "TARGET", "MATCHED", "DETAIL"]
    assert ACTOR in table[1]
    assert "pause" in table[1]
    assert "shop" in table[1]
    assert '{"reason": "deploy"}' in table[1]


# -- --help ------------------------------------------------------------------------------------

COMMANDS = [
    ["bots"],
    ["pause"],
    ["resume"],
    ["rate-limit"],
    ["updates"],
    ["attempts"],
    ["park"],
    ["audit"],
    ["exhaustions", "redrive"],
    ["exhaustions", "ack"],
]


def test_every_control_command_explains_itself_with_an_example(tmp_path: Path) -> None:
    # --help needs no configuration, nor a database: the commands run side by side.
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTAKE_")}
    running = [
        (
            command,
            subprocess.Popen(
                [sys.executable, "-m", "app.cli", *command, "--help"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
        )
        for command in COMMANDS
    ]
    for command, process in running:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, (command, err)
        assert "Example" in out, command
        assert f"telegram-intake {' '.join(command)}" in out, command
