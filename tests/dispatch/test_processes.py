"""Workers as an operator runs them: real `telegram-intake worker` (and `serve`) processes
sharing one PostgreSQL database, killed, stopped and restarted under load.

Each test starts its processes with an explicit environment (the autouse fixture clears the
shell's INTAKE_*), logs each one's output to files under tmp_path (printed when a check
fails), and kills whatever is still running in a `finally` block.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections import defaultdict
from pathlib import Path

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import Response

from app.intake.updates import classify
from app.store import NewUpdate, open_store
from tests.conftest import Storage, table_rows
from tests.downstream import (
    FakeDownstream,
    Received,
    by_attempt,
    eventually,
    hang,
    message,
    ok,
)
from tests.processes import SECRET, Process, environment, free_port, processes

pytestmark = pytest.mark.slow

STARTUP = 30.0  # a cold interpreter importing the app, on a loaded machine


async def add_messages(url: str, updates: list[tuple[int, int]]) -> None:
    """Record `(update_id, chat)` messages for bot `default`, keyed as the intake keys them, in
    one commit (`add_many`, the batched `add` of the intake's group commit)."""
    rows = []
    for update_id, chat in updates:
        body = message(update_id, chat=chat)
        update_type, queue_key = classify(json.loads(body))
        received_at = time.time_ns() // 1_000_000
        rows.append(NewUpdate("default", update_id, body, received_at, update_type, queue_key))
    store = await open_store(url)
    try:
        added = await store.add_many(rows)
    finally:
        await store.close()
    assert added == {("default", update_id) for update_id, _ in updates}


def assert_clean(*workers: Process) -> None:
    for worker in workers:
        log = worker.stderr
        assert "Traceback" not in log, worker.report()
        # Text or JSON lines (a child's standard error is not a terminal: JSON by default).
        assert " ERROR " not in log, worker.report()
        assert '"level": "ERROR"' not in log, worker.report()
        assert '"level": "INFO"' in log, "the worker logged no JSON lines: the check is blind"


async def test_two_worker_processes_deliver_every_update_once_in_chat_order(
    postgres_storage: Storage, downstream: FakeDownstream, tmp_path: Path
) -> None:
    chats, per_chat = 20, 50
    url = postgres_storage.url()
    # Update ids interleave the chats, as Telegram's do: chat c's k-th update is k*20 + c + 1.
    updates = [(k * chats + c + 1, 1000 + c) for k in range(per_chat) for c in range(chats)]
    await add_messages(url, updates)
    chat_of = dict(updates)

    # Which process delivered what: each worker has its own query string on the hook URL.
    delivered_by: dict[str, list[int]] = defaultdict(list)

    async def answer(received: Received, request: Request) -> Response:
        delivered_by[request.query_params["worker"]].append(received.update_id)
        return await ok(received, request)

    downstream.answer = answer
    with processes(tmp_path) as start:
        # At most 8 requests in flight per process and 8 attempts settling: neither can hold all
        # 20 chats, so both work.
        workers = [
            start(
                f"worker-{name}",
                environment(
                    url,
                    f"{downstream.url}/hook?worker={name}",
                    ordering="chat",
                    worker_concurrency=8,
                ),
                "worker",
            )
            for name in ("a", "b")
        ]
        await eventually(lambda: len(downstream.received) >= len(updates), within=60)
        await eventually(
            lambda: {state for (state,) in table_rows(url, "state")} == {"completed"}, within=15
        )
        await asyncio.sleep(0.5)  # a duplicate would arrive now, if at all
        received = downstream.received

        ids = [r.update_id for r in received]
        assert len(ids) == len(updates), "some update was delivered more than once"
        assert sorted(ids) == sorted(chat_of)
        assert {r.attempt for r in received} == {1}
        per_chat_order: dict[int, list[int]] = defaultdict(list)
        for update_id in ids:
            per_chat_order[chat_of[update_id]].append(update_id)
        assert len(per_chat_order) == chats
        for chat, order in per_chat_order.items():
            assert order == sorted(order), f"chat {chat} delivered out of order: {order}"
        rows = table_rows(url, "state", "attempts", "claim_id")
        assert all(state == "completed" and attempts == 1 for state, attempts, _ in rows)
        assert len({claim_id for *_, claim_id in rows}) == len(updates)
        assert {r.headers["x-intake-claim-id"] for r in received} == {c for *_, c in rows}
        assert set(delivered_by) == {"a", "b"}, {k: len(v) for k, v in delivered_by.items()}
        assert all(delivered_by[name] for name in ("a", "b"))
        for worker in workers:
            assert worker.poll() is None, worker.report()
        assert_clean(*workers)


async def test_a_killed_worker_s_update_is_redelivered_after_its_lease_lapses(
    postgres_storage: Storage, downstream: FakeDownstream, tmp_path: Path
) -> None:
    url = postgres_storage.url()
    lease_ms = 2000
    await add_messages(url, [(7, 42)])
    downstream.answer = by_attempt(hang, ok)
    env = environment(url, f"{downstream.url}/hook", lease_seconds=lease_ms / 1000)
    with processes(tmp_path) as start:
        a = start("worker-a", env, "worker")
        await eventually(lambda: downstream.received, within=STARTUP)
        a.signal(signal.SIGKILL)
        assert a.popen.wait(timeout=10) == -signal.SIGKILL
        first = downstream.received[0]
        assert first.attempt == 1
        # The dead process's socket is closed by the kernel: the downstream sees it go.
        await eventually(lambda: first.disconnected, within=10)
        assert table_rows(url, "state", "attempts") == [("processing", 1)]

        b = start("worker-b", env, "worker")
        await eventually(
            lambda: table_rows(url, "state", "attempts") == [("completed", 2)],
            within=STARTUP + lease_ms / 1000,
        )
        received = downstream.received
        assert [(r.update_id, r.attempt) for r in received] == [(7, 1), (7, 2)]
        second = received[1]
        assert second.headers["x-intake-claim-id"] != first.headers["x-intake-claim-id"]
        (claim_id,) = table_rows(url, "claim_id")[0]
        assert second.headers["x-intake-claim-id"] == claim_id
        # By the database's clock: B claimed (its lease's start) only after A's lease lapsed.
        first_lease = int(first.headers["x-intake-lease-expires-at"])
        second_claimed_at = int(second.headers["x-intake-lease-expires-at"]) - lease_ms
        assert second_claimed_at > first_lease
        assert second.body == first.body
        assert b.poll() is None, b.report()
        assert_clean(b)


async def test_sigterm_hands_an_in_flight_attempt_back_for_another_worker_at_once(
    postgres_storage: Storage, downstream: FakeDownstream, tmp_path: Path
) -> None:
    url = postgres_storage.url()
    await add_messages(url, [(9, 42)])
    downstream.answer = by_attempt(hang, ok)
    env = environment(url, f"{downstream.url}/hook", lease_seconds=30, shutdown_grace_seconds=0.5)
    with processes(tmp_path) as start:
        a = start("worker-a", env, "worker")
        await eventually(lambda: downstream.received, within=STARTUP)
        first = downstream.received[0]
        assert first.attempt == 1
        a.signal(signal.SIGTERM)
        await eventually(lambda: a.poll() is not None, within=5)
        assert a.poll() == 0, a.report()
        assert "worker stopping" in a.stderr, a.report()
        assert_clean(a)
        await eventually(lambda: first.disconnected, within=5)

        ((state, attempts, uncounted, error, due_at),) = table_rows(
            url, "state", "attempts", "uncounted", "error", "due_at"
        )
        # Handed back: no error (none happened), and the attempt spent none of the budget.
        assert (state, attempts, uncounted, error) == ("failed", 1, 1, None)
        first_lease = int(first.headers["x-intake-lease-expires-at"])
        assert due_at < first_lease - 20_000  # due at once, not when the 30 s lease would end

        b = start("worker-b", env, "worker")
        # Its start is the interpreter's (up to STARTUP on a loaded machine); from then on:
        await eventually(b.started, within=STARTUP)
        started_at = time.monotonic()
        await eventually(
            lambda: table_rows(url, "state", "attempts") == [("completed", 2)], within=10
        )
        assert time.monotonic() - started_at < 10  # far less than the 30 s lease
        received = downstream.received
        assert [(r.update_id, r.attempt) for r in received] == [(9, 1), (9, 2)]
        second = received[1]
        assert second.headers["x-intake-claim-id"] != first.headers["x-intake-claim-id"]
        # By the database's clock, B claimed it long before A's lease would have lapsed.
        assert int(second.headers["x-intake-lease-expires-at"]) - 30_000 < first_lease
        assert b.poll() is None, b.report()
        assert_clean(b)


async def test_serve_wakes_a_worker_process_through_notify(
    postgres_storage: Storage, downstream: FakeDownstream, tmp_path: Path
) -> None:
    url = postgres_storage.url()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with processes(tmp_path) as start:
        # A 60 s poll: only a NOTIFY from the intake's commit can bring the update over sooner.
        worker = start(
            "worker",
            environment(url, f"{downstream.url}/hook", poll_interval_seconds=60),
            "worker",
        )
        serve = start("serve", environment(url, None, port=port), "serve")

        async with httpx.AsyncClient(timeout=5) as client:

            async def healthy() -> bool:
                assert serve.poll() is None, serve.report()
                try:
                    return (await client.get(f"{base}/healthz")).status_code == 200
                except httpx.TransportError:
                    return False

            await eventually(healthy, within=STARTUP)
            await eventually(worker.started, within=STARTUP)
            # The worker's first claim has found nothing and its listener has had time to LISTEN.
            await asyncio.sleep(1.0)
            assert downstream.received == []

            body = message(501, chat=77)
            headers = {"X-Telegram-Bot-Api-Secret-Token": SECRET}
            headers["Content-Type"] = "application/json"
            posted = time.monotonic()
            response = await client.post(f"{base}/telegram/default", content=body, headers=headers)
            assert response.status_code == 200, response.text

        await eventually(lambda: downstream.received, within=10)
        assert time.monotonic() - posted < 10
        (delivered,) = downstream.received
        assert delivered.body == body.encode()
        assert delivered.update_id == 501
        assert delivered.attempt == 1
        assert delivered.headers["x-intake-bot"] == "default"
        await eventually(
            lambda: table_rows(url, "state", "attempts") == [("completed", 1)], within=10
        )
        assert worker.poll() is None, worker.report()
        assert serve.poll() is None, serve.report()
        assert_clean(worker, serve)


async def test_a_durable_worker_refuses_a_revision_0001_table(
    postgres_storage: Storage, downstream: FakeDownstream, tmp_path: Path
) -> None:
    url = postgres_storage.url(revision="0001")
    with processes(tmp_path) as start:
        worker = start("worker", environment(url, f"{downstream.url}/hook"), "worker")
        code = await asyncio.to_thread(worker.popen.wait, STARTUP)
        assert code == 2, worker.report()
        assert "alembic upgrade head" in worker.stderr, worker.report()
        assert "Traceback" not in worker.stderr, worker.report()  # one clear line
        assert downstream.received == []


async def test_a_plain_worker_delivers_from_a_revision_0001_table(
    postgres_storage: Storage, downstream: FakeDownstream, tmp_path: Path
) -> None:
    url = postgres_storage.url(revision="0001")
    await add_messages(url, [(11, 42)])
    with processes(tmp_path) as start:
        worker = start("worker", environment(url, f"{downstream.url}/hook", mode="plain"), "worker")
        await eventually(
            lambda: table_rows(url, "state", "attempts") == [("completed", 1)],
            within=STARTUP,
        )
        (delivered,) = downstream.received
        assert delivered.update_id == 11
        assert delivered.body == message(11, chat=42).encode()
        assert not [name for name in delivered.headers if name.startswith("x-intake-")]
        assert worker.poll() is None, worker.report()
        assert_clean(worker)


async def test_a_worker_serves_health_and_its_own_metrics_on_its_port(
    postgres_storage: Storage, downstream: FakeDownstream, tmp_path: Path
) -> None:
    url = postgres_storage.url()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    key = "worker-metrics.key-0123"
    await add_messages(url, [(601, 1)])
    env = environment(url, f"{downstream.url}/hook", worker_port=port, api_keys=key)
    with processes(tmp_path) as start:
        worker = start("worker", env, "worker")
        await eventually(worker.started, within=STARTUP)
        await eventually(lambda: table_rows(url, "state") == [("completed",)], within=10)
        async with httpx.AsyncClient(base_url=base, timeout=5) as client:
            assert (await client.get("/healthz")).json() == {"status": "ok"}
            # As on `serve`: ready or not to anyone, the schema's capability to a viewer key.
            assert (await client.get("/readyz")).json() == {"status": "ready"}
            viewed = await client.get("/readyz", headers={"Authorization": f"Bearer {key}"})
            assert viewed.json() == {"status": "ready", "capability": "durable"}
            wrong = await client.get("/readyz", headers={"Authorization": "Bearer wrong-key.0123"})
            assert wrong.status_code == 401
            assert (await client.get("/metrics")).status_code == 401
            scraped = await client.get("/metrics", headers={"Authorization": f"Bearer {key}"})
            assert (await client.get("/telegram/default")).status_code == 404  # no intake here
        assert scraped.status_code == 200
        counted = (
            'telegram_intake_attempts_total{bot="default",destination="default",'
            'outcome="completed"} 1.0'
        )
        assert counted in scraped.text
        worker.signal(signal.SIGTERM)
        assert worker.popen.wait(timeout=30) == 0, worker.report()
        assert_clean(worker)
