"""Operator control (SPEC section 9) as an operator meets it: real `telegram-intake worker`
and `serve` processes on one PostgreSQL database (and a `run` process on SQLite), a real
downstream recording every arrival with its time and X-Intake-Attempt, and the database's own
record of each attempt (`telegram_updates_attempts.started_at`) as the witness of when an
attempt started.

- a pause through the API binds both worker processes: no attempt starts later than 1 s after
  the pause returned (attempts in flight finish), the intake keeps answering 200 and recording,
  resume wakes the workers at once (their poll is far longer), and per-chat order holds;
- a redrive of 10,000 exhaustions paced at 500/s delivers every one once, in chat order, its
  attempt numbers continuing, never ahead of the pacing;
- a rate limit holds across 1, 2 and 4 worker processes, measured over a steady window, and a
  throttled update spends no attempt.

Each test starts its processes with an explicit environment, logs each one's output to files
under tmp_path (printed when a check fails), and kills whatever is still running at the end.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import Response

from app.intake.updates import classify
from app.store import Failed, NewUpdate, open_store
from tests.conftest import Storage, table_rows
from tests.downstream import FakeDownstream, Received, eventually, message, ok
from tests.processes import SECRET, Process, environment, free_port, processes

pytestmark = pytest.mark.slow

STARTUP = 30.0  # a cold interpreter importing the app, on a loaded machine
KEY = "control-operator.key-0123456789"  # full access: the operator scope included
AUTH = {"Authorization": f"Bearer {KEY}"}
WEBHOOK = {"X-Telegram-Bot-Api-Secret-Token": SECRET, "Content-Type": "application/json"}
ATTEMPTS = "telegram_updates_attempts"


# -- helpers ----------------------------------------------------------------------------------


def now_ms() -> int:
    """Epoch ms by this host's clock: the database's too (the server runs on this host), and
    so every process's `DatabaseClock` to within a round trip."""
    return time.time_ns() // 1_000_000


def interleaved(chats: int, rounds: range, first_chat: int = 1000) -> list[tuple[int, int]]:
    """`(update_id, chat)` as Telegram numbers them: chat c's k-th update is k*chats + c + 1."""
    return [(k * chats + c + 1, first_chat + c) for k in rounds for c in range(chats)]


async def add_messages(url: str, updates: Sequence[tuple[int, int]]) -> None:
    """Record `(update_id, chat)` messages of bot `default`, keyed as the intake keys them."""
    rows = []
    for update_id, chat in updates:
        body = message(update_id, chat=chat)
        update_type, queue_key = classify(json.loads(body))
        rows.append(NewUpdate("default", update_id, body, now_ms(), update_type, queue_key))
    store = await open_store(url)
    try:
        for start in range(0, len(rows), 2_000):
            await store.add_many(rows[start : start + 2_000])
    finally:
        await store.close()


async def exhaust_all(url: str) -> None:
    """Make every recorded update of bot `default` an open exhaustion after one failed attempt,
    a thousand at a time: a claim (budget 1) takes a batch, a settle fails it due at once, and
    the next claim, meeting it spent, ends it as a durable exhaustion (three statements per
    batch instead of a transaction per update)."""
    store = await open_store(url)
    try:
        for _ in range(100):
            now = now_ms()
            claimed = await store.claim_next_owned(
                now=now,
                lease_until=now + 60_000,
                max_attempts=1,
                limit=1_000,
                ordering="none",
                bots=["default"],
                durable_exhaustion=True,
            )
            if claimed:
                failed = Failed(at=now, retry_at=now, error="downstream down", status=503)
                settled = await store.settle_many_owned([(c.identity, failed) for c in claimed])
                assert all(settled)
            elif {state for (state,) in table_rows(url, "state")} == {"abandoned"}:
                return
        raise AssertionError("the exhaustions were not made within 100 claims")
    finally:
        await store.close()


def attempt_starts(url: str) -> list[tuple[int, int, int, int | None, str | None]]:
    """Every attempt the database recorded: (update_id, attempt, started_at, ended_at,
    outcome)."""
    rows = table_rows(
        url, "update_id", "attempt", "started_at", "ended_at", "outcome", table=ATTEMPTS
    )
    return [(int(u), int(a), int(s), e, o) for u, a, s, e, o in rows]


def assert_chat_order(received: Sequence[Received], chat_of: dict[int, int]) -> None:
    """Each chat's arrivals in update_id order (a retry may repeat the update it retries)."""
    per_chat: dict[int, list[int]] = defaultdict(list)
    for arrival in received:
        order = per_chat[chat_of[arrival.update_id]]
        if not order or order[-1] != arrival.update_id:
            order.append(arrival.update_id)
    for chat, order in per_chat.items():
        assert order == sorted(set(order)), f"chat {chat} delivered out of order: {order}"


def assert_each_once(received: Sequence[Received], url: str, expected: set[int]) -> None:
    """Every expected update arrived, each once per attempt number, and the attempts it took
    are the attempts its row counts (a retry would be a legitimate second arrival)."""
    by_update: dict[int, list[int]] = defaultdict(list)
    for arrival in received:
        by_update[arrival.update_id].append(arrival.attempt)
    assert set(by_update) == expected
    attempts = {int(u): int(a) for u, a in table_rows(url, "update_id", "attempts")}
    for update_id, numbers in by_update.items():
        assert len(numbers) == len(set(numbers)), f"{update_id}: an attempt arrived twice"
        assert max(numbers) == attempts[update_id], (update_id, numbers)


def assert_clean(*children: Process) -> None:
    for child in children:
        log = child.stderr
        assert child.poll() is None, child.report()
        assert "Traceback" not in log, child.report()
        assert '"level": "ERROR"' not in log, child.report()
        assert '"level": "INFO"' in log, "no JSON log lines: the check is blind"


async def healthy(client: httpx.AsyncClient, child: Process, base: str) -> None:
    async def answers() -> bool:
        assert child.poll() is None, child.report()
        try:
            return (await client.get(f"{base}/healthz")).status_code == 200
        except httpx.TransportError:
            return False

    await eventually(answers, within=STARTUP)


async def post_updates(
    client: httpx.AsyncClient, base: str, updates: Sequence[tuple[int, int]]
) -> list[int]:
    """POST each update to the intake in turn, as Telegram does; the status codes."""
    codes = []
    for update_id, chat in updates:
        response = await client.post(
            f"{base}/telegram/default", content=message(update_id, chat=chat), headers=WEBHOOK
        )
        codes.append(response.status_code)
    return codes


def slow(seconds: float):  # type: ignore[no-untyped-def]
    """A downstream that takes `seconds` to answer 200: attempts are in flight for a while."""

    async def answer(received: Received, request: Request) -> Response:
        await asyncio.sleep(seconds)
        return await ok(received, request)

    return answer


# -- pause and resume -------------------------------------------------------------------------


async def test_pause_binds_two_worker_processes_and_resume_wakes_them(
    postgres_storage: Storage, downstream: FakeDownstream, tmp_path: Path
) -> None:
    """A pause through the API binds both worker processes: no attempt starts later than 1 s
    after the pause returned while attempts already in flight finish; the intake answers 200
    and records every update meanwhile; resume wakes both workers at once (their poll is 5 s);
    every update is delivered once, each chat in order across the pause."""
    url = postgres_storage.url()
    chats = 20
    before = interleaved(chats, range(10))  # 200 updates posted before the pause
    during = interleaved(chats, range(10, 20))  # 200 more while paused
    chat_of = dict(before + during)
    downstream.answer = slow(0.15)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with processes(tmp_path) as start:
        serve = start("serve", environment(url, None, port=port, api_keys=KEY), "serve")
        # 6 in flight each: 12 < 20 chats, so both processes always have work.
        workers = [
            start(
                f"worker-{name}",
                environment(
                    url,
                    f"{downstream.url}/hook",
                    worker_concurrency=6,
                    poll_interval_seconds=5,
                ),
                "worker",
            )
            for name in ("a", "b")
        ]
        async with httpx.AsyncClient(timeout=10) as client:
            await healthy(client, serve, base)
            for worker in workers:
                await eventually(worker.started, within=STARTUP)

            assert set(await post_updates(client, base, before)) == {200}
            await eventually(lambda: len(downstream.received) >= 30, within=15)

            response = await client.post(
                f"{base}/v1/bots/default/pause", json={"reason": "maintenance"}, headers=AUTH
            )
            paused_at, paused_mono = now_ms(), time.monotonic()
            assert response.status_code == 200, response.text
            assert response.json() == {"bot": "default", "changed": True}

            # Paused: the intake still answers 200 to every update, and records each.
            assert set(await post_updates(client, base, during)) == {200}
            recorded = {int(u) for (u,) in table_rows(url, "update_id")}
            assert recorded == set(chat_of)
            await asyncio.sleep(max(0.0, paused_mono + 3.0 - time.monotonic()))
            held_at = now_ms()
            states = Counter(state for (state,) in table_rows(url, "state"))
            bots = (await client.get(f"{base}/v1/bots", headers=AUTH)).json()["items"]
            assert (bots[0]["paused"], bots[0]["paused_reason"]) == (True, "maintenance")

            resume_at, resume_mono = now_ms(), time.monotonic()
            response = await client.post(f"{base}/v1/bots/default/resume", headers=AUTH)
            assert response.status_code == 200, response.text
            assert response.json() == {"bot": "default", "changed": True}

        # Resume woke the workers: an arrival long before their 5 s poll.
        await eventually(lambda: any(r.at > resume_mono for r in downstream.received), within=10)
        woke = min(r.at for r in downstream.received if r.at > resume_mono) - resume_mono
        await eventually(lambda: len(downstream.received) >= len(chat_of), within=60)
        await eventually(
            lambda: {s for (s,) in table_rows(url, "state")} == {"completed"}, within=15
        )
        await asyncio.sleep(0.5)  # a duplicate would arrive now, if at all
        received = downstream.received
        history = attempt_starts(url)

        # While paused (from 1 s after the pause returned until resume was asked): no attempt
        # started, by the database's record, and nothing arrived downstream.
        started_paused = [h for h in history if paused_at + 1_000 < h[2] < resume_at]
        assert started_paused == [], started_paused
        arrived_paused = [r for r in received if paused_mono + 1.0 < r.at < resume_mono]
        assert arrived_paused == [], [(r.update_id, r.at - paused_mono) for r in arrived_paused]
        last_start = max(h[2] for h in history if h[2] < resume_at) - paused_at
        # The workers had work all along: the pause, not an empty queue, held them.
        assert states["pending"] >= len(during), states
        assert states["processing"] == 0, states  # attempts in flight at the pause finished
        in_flight = [h for h in history if h[2] <= paused_at and (h[3] or 0) > paused_at]
        assert in_flight, "no attempt was in flight at the pause: the test proves less"
        assert {h[4] for h in in_flight} == {"completed"}
        assert woke < 2.0, f"the first attempt after resume came {woke:.2f} s later"

        assert_each_once(received, url, set(chat_of))
        assert_chat_order(received, chat_of)
        print(
            f"\npause (postgresql, 2 workers): last attempt started {last_start} ms after the "
            f"pause returned; {len(in_flight)} in flight then finished; "
            f"{states['pending']} waiting after {(held_at - paused_at) / 1000:.1f} s paused; "
            f"first arrival {woke * 1000:.0f} ms after resume"
        )
        assert_clean(serve, *workers)
