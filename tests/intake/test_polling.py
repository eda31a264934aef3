"""Long polling (docs/contract.md section 11) against a fake Bot API (app/fake_bot_api.py), with
real processes: getUpdates to the downstream on both backends, each batch recorded before the next
offset confirms it; Telegram's 409, 429, 5xx and 401 as the poller meets them; the switch
from a webhook to polling by `delete-webhook`; and two worker processes configured to poll one
bot, one poller at a time, no 409 storm."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from app.fake_bot_api import TOKEN, FakeBotApi
from app.store.engine import create_sync_engine
from tests.conftest import Storage, serve_asgi, table_rows
from tests.downstream import FakeDownstream, Received, eventually
from tests.processes import SECRET, Process, environment, free_port, processes

pytestmark = pytest.mark.slow  # real processes long polling

KEY = "polling-operator.key-0123456789"


def updates(first: int, count: int, chats: int) -> list[dict[str, Any]]:
    """Telegram's messages, update_id from `first`, over `chats` chats in turn."""
    return [
        {
            "update_id": n,
            "message": {
                "message_id": n,
                "date": 0,
                "chat": {"id": 500 + n % chats, "type": "private"},
                "text": f"polled {n}",
            },
        }
        for n in range(first, first + count)
    ]


def polling_env(
    url: str, downstream: FakeDownstream, bot_api: str, **options: object
) -> dict[str, str]:
    return environment(
        url,
        f"{downstream.url}/hook",
        source="polling",
        bot_token=TOKEN,
        bot_api_url=bot_api,
        poll_timeout_seconds=1,
        log_format="json",
        # A killed process's attempts hold their chats until their leases lapse: short ones.
        lease_seconds=2,
        **options,
    )


def delivered(downstream: FakeDownstream) -> int:
    """How many distinct updates have arrived (a redelivery counts once)."""
    return len({r.update_id for r in downstream.received})


def assert_none_lost_in_chat_order(received: list[Received], expected: list[int]) -> None:
    """Where a process was killed mid-attempt, its attempts are delivered again once their
    leases lapse (at least once, by design): every update arrived, and each chat's first
    arrivals are in order."""
    seen: set[int] = set()
    first = []
    for arrival in received:
        if arrival.update_id not in seen:
            seen.add(arrival.update_id)
            first.append(arrival)
    assert_each_once_in_chat_order(first, expected)


def assert_each_once_in_chat_order(received: list[Received], expected: list[int]) -> None:
    delivered = [r.update_id for r in received]
    assert sorted(set(delivered)) == expected
    assert len(delivered) == len(expected), "an update was delivered twice"
    chats: dict[int, list[int]] = {}
    for arrival in received:
        chat = json.loads(arrival.body)["message"]["chat"]["id"]
        chats.setdefault(chat, []).append(arrival.update_id)
    for chat, order in chats.items():
        assert order == sorted(order), f"chat {chat} out of order: {order}"


async def test_polled_updates_reach_the_downstream_each_once_in_chat_order(
    storage: Storage, downstream: FakeDownstream, tmp_path: Path
) -> None:
    fake = FakeBotApi()
    fake.produce(*updates(1, 300, chats=10))
    port = free_port()
    async with serve_asgi(fake.app()) as bot_api:
        env = polling_env(storage.url(), downstream, bot_api, port=port, api_keys=KEY)
        with processes(tmp_path) as start:
            run = start("run", env, "run")
            await eventually(lambda: delivered(downstream) >= 300, within=60)
            fake.produce(*updates(301, 20, chats=10))  # arriving while it polls
            await eventually(lambda: delivered(downstream) >= 320, within=30)
            await eventually(lambda: fake.pending == [], within=10)  # every batch confirmed
            async with httpx.AsyncClient() as client:
                ready = await client.get(f"http://127.0.0.1:{port}/readyz")
                metrics = await client.get(
                    f"http://127.0.0.1:{port}/metrics", headers={"authorization": f"Bearer {KEY}"}
                )
        logs = run.stdout + run.stderr
    assert_each_once_in_chat_order(downstream.received, list(range(1, 321)))
    assert ready.status_code == 200
    assert 'telegram_intake_polled_updates_total{bot="default"} 320.0' in metrics.text
    assert 'telegram_intake_poll_offset{bot="default"} 321.0' in metrics.text
    assert fake.conflicts == 0
    assert TOKEN not in logs
    assert TOKEN.split(":")[1] not in metrics.text


async def test_telegram_s_refusals_are_met_as_its_documentation_says(
    sqlite_storage: Storage, downstream: FakeDownstream, tmp_path: Path
) -> None:
    """409 while a webhook is set (named in the log and the metric), then `delete-webhook`
    lets polling go on; 429 waits its retry_after; a 500 and a dropped connection back off;
    nothing is lost or doubled through any of it."""
    fake = FakeBotApi()
    fake.set_webhook_state(url="https://intake.example.com/telegram/default")
    fake.produce(*updates(1, 30, chats=3))
    port = free_port()
    async with serve_asgi(fake.app()) as bot_api:
        env = polling_env(sqlite_storage.url(), downstream, bot_api, port=port, api_keys=KEY)
        with processes(tmp_path) as start:
            run = start("run", env, "run")
            await eventually(lambda: "409 Conflict: a webhook is set" in run.stderr, within=30)
            assert downstream.received == []
            deleted = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "app.cli", "delete-webhook", "default"],
                env=env, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert deleted.returncode == 0, deleted.stderr
            assert "no webhook set (getUpdates mode)" in deleted.stdout
            await eventually(lambda: delivered(downstream) >= 30, within=30)
            fake.faults = [(429, 1.0), (500, None), (0, None)]
            fake.produce(*updates(31, 10, chats=3))
            await eventually(lambda: delivered(downstream) >= 40, within=30)
            async with httpx.AsyncClient() as client:
                metrics = await client.get(
                    f"http://127.0.0.1:{port}/metrics", headers={"authorization": f"Bearer {KEY}"}
                )
        logs = run.stdout + run.stderr
    assert_each_once_in_chat_order(downstream.received, list(range(1, 41)))
    text = metrics.text
    assert 'telegram_intake_poll_requests_total{bot="default",result="conflict"}' in text
    assert 'result="conflict"} 0.0' not in text
    assert 'telegram_intake_poll_requests_total{bot="default",result="rate_limited"} 1.0' in text
    assert "getUpdates rate-limited; waiting 1 s" in logs
    last_error = 'telegram_intake_poll_last_error_timestamp_seconds{bot="default"} '
    assert float(text.split(last_error)[1].split()[0]) > 1.7e9
    assert TOKEN not in logs


async def test_a_token_telegram_refuses_stops_that_bot_s_poller_and_readyz_says_so(
    sqlite_storage: Storage, downstream: FakeDownstream, tmp_path: Path
) -> None:
    fake = FakeBotApi()
    port = free_port()
    async with serve_asgi(fake.app()) as bot_api:
        env = polling_env(sqlite_storage.url(), downstream, bot_api, port=port, api_keys=KEY)
        env["INTAKE_BOT_TOKEN"] = "999:revoked-token-of-the-bot"
        with processes(tmp_path) as start:
            run = start("run", env, "run")
            base = f"http://127.0.0.1:{port}"

            async def unready() -> httpx.Response | None:
                async with httpx.AsyncClient() as client:
                    try:
                        answer = await client.get(f"{base}/readyz")
                    except httpx.TransportError:
                        return None
                return answer if answer.status_code == 503 else None

            public = await eventually(unready, within=30)
            async with httpx.AsyncClient() as client:
                answer = await client.get(
                    f"{base}/readyz", headers={"authorization": f"Bearer {KEY}"}
                )
                healthy = await client.get(f"{base}/healthz")
        logs = run.stdout + run.stderr
    assert public.json() == {"status": "unavailable"}  # why is for a viewer key only
    assert answer.status_code == 503
    assert "Telegram refuses bot 'default'" in answer.json()["error"]
    assert healthy.status_code == 200  # not a dead loop: restarting would not help
    assert "polling stopped: Telegram refuses its token" in logs
    assert "revoked-token" not in logs
    assert "revoked-token" not in answer.text


async def test_two_processes_polling_one_bot_take_turns_without_a_409_storm(
    postgres_storage: Storage, downstream: FakeDownstream, tmp_path: Path
) -> None:
    fake = FakeBotApi()
    fake.produce(*updates(1, 200, chats=8))
    async with serve_asgi(fake.app()) as bot_api:
        env = polling_env(postgres_storage.url(), downstream, bot_api)
        with processes(tmp_path) as start:
            first: Process = start("worker-1", env, "worker")
            second: Process = start("worker-2", env, "worker")
            await eventually(lambda: delivered(downstream) >= 200, within=60)
            first.kill()  # the poller may have been either: the other takes over
            fake.produce(*updates(201, 40, chats=8))
            await eventually(lambda: delivered(downstream) >= 240, within=60)
            assert second.poll() is None
    assert_none_lost_in_chat_order(downstream.received, list(range(1, 241)))
    assert fake.conflicts <= 1  # at most the killed poller's open request, ended by the next


@pytest.mark.parametrize("demo", [False, True], ids=["downstream", "demo"])
async def test_run_poll_needs_only_a_token_and_a_downstream(
    sqlite_storage: Storage, downstream: FakeDownstream, tmp_path: Path, demo: bool
) -> None:
    """`telegram-intake run --poll` from a laptop: INTAKE_BOT_TOKEN and where to deliver (or
    `--demo`, which delivers to its own downstream); no webhook secret, no public address."""
    fake = FakeBotApi()
    fake.produce(*updates(1, 5, chats=2))
    async with serve_asgi(fake.app()) as bot_api:
        env = polling_env(sqlite_storage.url(), downstream, bot_api, port=free_port())
        for name in ("INTAKE_SECRET_TOKEN", "INTAKE_SOURCE"):
            del env[name]
        arguments = ("run", "--poll", "--demo") if demo else ("run", "--poll")
        with processes(tmp_path) as start:
            run = start("run", env, *arguments)
            if demo:
                handled = "demo downstream: handled"
                await eventually(lambda: run.stderr.count(handled) >= 5, within=30)
            else:
                await eventually(lambda: delivered(downstream) >= 5, within=30)
            await eventually(lambda: fake.pending == [], within=10)
    if not demo:
        assert_each_once_in_chat_order(downstream.received, [1, 2, 3, 4, 5])
    assert "Traceback" not in run.stderr


async def test_switching_from_webhook_to_polling_and_back_loses_nothing(
    sqlite_storage: Storage, downstream: FakeDownstream, tmp_path: Path
) -> None:
    """A bot on its webhook; `delete-webhook`, and Telegram holds what comes next; a `run
    --poll` takes those; `set-webhook`, and the poller meets 409 and takes nothing more while
    Telegram posts to the webhook again. Every update is delivered, each once."""
    fake = FakeBotApi()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    webhook = {"X-Telegram-Bot-Api-Secret-Token": SECRET, "Content-Type": "application/json"}
    async with serve_asgi(fake.app()) as bot_api, httpx.AsyncClient(timeout=10) as client:
        env = environment(
            sqlite_storage.url(), f"{downstream.url}/hook", port=port, bot_token=TOKEN,
            lease_seconds=2,
            bot_api_url=bot_api, poll_timeout_seconds=1,
        )  # fmt: skip

        async def cli(*arguments: str) -> str:
            done = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-m", "app.cli", *arguments],
                env=env, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            return done.stdout

        async def telegram_posts(batch: list[dict[str, Any]]) -> None:
            for update in batch:
                answer = await client.post(
                    f"{base}/telegram/default", content=json.dumps(update), headers=webhook
                )
                assert answer.status_code == 200

        await cli("set-webhook", "default", "--url", "https://intake.example.com/telegram/default")
        with processes(tmp_path) as start:
            served = start("webhook", env, "run")
            await eventually(lambda: served.answers(f"{base}/healthz"), within=30)
            await telegram_posts(updates(1, 10, chats=3))
            await eventually(lambda: delivered(downstream) >= 10, within=30)
            served.kill()
            assert "no webhook set" in await cli("delete-webhook", "default")
            fake.produce(*updates(11, 10, chats=3))  # held by Telegram meanwhile
            polled = start("polling", env, "run", "--poll")
            await eventually(lambda: delivered(downstream) >= 20, within=30)
            await cli(
                "set-webhook", "default", "--url", "https://intake.example.com/telegram/default"
            )
            fake.produce(*updates(21, 5, chats=3))  # a webhook is set: not for getUpdates
            await eventually(lambda: fake.conflicts >= 1, within=30)
            await telegram_posts(updates(21, 5, chats=3))  # Telegram posts them instead
            await eventually(lambda: delivered(downstream) >= 25, within=30)
            assert "409 Conflict: a webhook is set" in polled.stderr
    assert_none_lost_in_chat_order(downstream.received, list(range(1, 26)))


async def test_pollers_killed_every_few_seconds_lose_nothing_and_record_nothing_twice(
    postgres_storage: Storage, downstream: FakeDownstream, tmp_path: Path
) -> None:
    """The chaos case of issue 18: two worker processes polling one bot, the one holding the
    poller's lease SIGKILLed every 3 s (and started again), while the fake Bot API produces
    5,000 updates over 20 chats. Every update is recorded once and confirmed (Telegram holds
    none at the end), every one reaches the downstream, each chat in order."""
    total, chats = 5_000, 20
    kills_wanted = 4
    fake = FakeBotApi()
    url = postgres_storage.url()
    async with serve_asgi(fake.app()) as bot_api:
        env = polling_env(url, downstream, bot_api, worker_concurrency=32)
        with processes(tmp_path) as start:
            workers = [start("worker-a", env, "worker"), start("worker-b", env, "worker")]
            produced, kills, ticks = 0, 0, 0
            deadline = time.monotonic() + 120
            while produced < total or fake.pending or kills < kills_wanted:
                assert time.monotonic() < deadline, (produced, len(fake.pending), kills)
                if produced < total:
                    fake.produce(*updates(produced + 1, 250, chats=chats))
                    produced += 250
                await asyncio.sleep(1.0)
                ticks += 1
                holder = poller_pid(url) if ticks % 3 == 0 and kills < kills_wanted else None
                for index, worker in enumerate(workers):
                    if worker.pid == holder:  # the poller, mid-poll: killed, started again
                        worker.kill()
                        workers[index] = start(f"worker-{kills}", env, "worker")
                        kills += 1
            delivered = lambda: len({r.update_id for r in downstream.received}) >= total  # noqa: E731
            await eventually(delivered, within=120)
    rows = table_rows(url, "update_id")
    assert [row[0] for row in rows] == list(range(1, total + 1))  # lost 0, none twice
    assert_none_lost_in_chat_order(downstream.received, list(range(1, total + 1)))


def poller_pid(url: str) -> int | None:
    """The pid of the process holding bot `default`'s poller lease (`host:pid:nonce`)."""
    engine = create_sync_engine(url)
    try:
        with engine.connect() as connection:
            holder = connection.scalar(
                text("SELECT poller FROM telegram_updates_bots WHERE bot = 'default'")
            )
    finally:
        engine.dispose()
    return int(holder.split(":")[1]) if holder else None


async def test_a_trial_polls_the_fake_bot_api_command_with_run_demo_poll(
    sqlite_storage: Storage, tmp_path: Path
) -> None:
    """The trial path of the README: `telegram-intake fake-bot-api`, `run --demo --poll`
    against it, updates handed to the fake by `POST /fake/updates` reach the demo downstream."""
    fake_port = free_port()
    env = environment(sqlite_storage.url(), None, port=free_port())
    del env["INTAKE_SECRET_TOKEN"]
    with processes(tmp_path) as start:
        fake = start("fake-bot-api", env, "fake-bot-api", "--port", str(fake_port))
        await eventually(lambda: "fake: poll it" in fake.stdout, within=30)
        hint = next(line for line in fake.stdout.splitlines() if "fake: poll it" in line)
        assigned = dict(part.split("=", 1) for part in hint.split() if part.startswith("INTAKE_"))
        run = start("run", {**env, **assigned}, "run", "--demo", "--poll")
        async with httpx.AsyncClient() as client:
            handed = await client.post(
                f"http://127.0.0.1:{fake_port}/fake/updates", json=updates(1, 5, chats=2)
            )
        assert handed.json() == {"pending": 5}
        handled = "demo downstream: handled"
        await eventually(lambda: run.stderr.count(handled) >= 5, within=30)
    assert "Traceback" not in run.stderr
