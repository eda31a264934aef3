"""Erasure on request, as an operator asks it of the running service: real `serve` and `worker`
processes, a downstream that holds one of the user's updates while the erasure runs, and, on
SQLite without a key ring, the database files read after the checkpoint."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import threading
import time
from pathlib import Path

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import Response

from tests.conftest import Storage
from tests.downstream import SIGNING_SECRET, FakeDownstream, Received, ok
from tests.privacy.test_at_rest import found_in
from tests.processes import environment, free_port, post_update, processes, until_serving

pytestmark = pytest.mark.slow  # real processes

ALICE, BOB = 630_000_000_101, 630_000_000_202
ALICE_TEXT, BOB_TEXT = "Aardvark-marker-5511", "Bison-marker-6622"
ALICE_NAME, BOB_NAME = "Alicetta", "Bobrinsky"
API_KEY = "erasure-operator-key"


def update(update_id: int, user: int, text: str, name: str) -> str:
    person = {"id": user, "is_bot": False, "first_name": name}
    message = {
        "message_id": update_id,
        "date": 1_700_000_000,
        "chat": {"id": user, "type": "private", "first_name": name},
        "from": person,
        "text": text,
    }
    return json.dumps({"update_id": update_id, "message": message})


class Holding:
    """The downstream's answer: Alice's first update is held until `release`, then the handler
    asks `owns` before its write, as a downstream fencing its effects does."""

    def __init__(self, intake: str) -> None:
        self.intake = intake
        self.released = threading.Event()
        self.held = threading.Event()
        self.owned: list[bool] = []

    async def __call__(self, received: Received, request: Request) -> Response:
        if received.update_id != 1:
            return await ok(received, request)
        self.held.set()
        await asyncio.to_thread(self.released.wait, 60)  # set from the test's thread
        identity = {
            "bot": received.headers["x-intake-bot"],
            "update_id": received.update_id,
            "attempt": received.attempt,
            "claim_id": received.headers["x-intake-claim-id"],
        }
        async with httpx.AsyncClient() as client:
            answer = await client.post(
                f"{self.intake}/v1/claims/owns",
                json=identity,
                headers={"Authorization": f"Bearer {API_KEY}"},
            )
        self.owned.append(bool(answer.json()["owned"]))
        return await ok(received, request)


async def wait_for(check: object, within: float = 30) -> None:
    deadline = time.monotonic() + within
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"not within {within} s"
        await asyncio.sleep(0.05)


async def test_an_erasure_ends_the_users_deliveries_and_leaves_nothing_of_them(
    storage: Storage, downstream: FakeDownstream, tmp_path: Path
) -> None:
    url = storage.url()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    holding = Holding(base)
    downstream.answer = holding
    env = environment(
        url,
        f"{downstream.url}/hook",
        api_keys=API_KEY,
        lease_seconds=60,
        operations_url=f"{downstream.url}/operations",
        operations_signing_secret=SIGNING_SECRET,
    )
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with processes(tmp_path) as start:
        serve = start("serve", env, "serve", "--port", str(port))
        worker = start("worker", env, "worker")
        async with httpx.AsyncClient(timeout=10) as client:
            await until_serving(client, port, serve)
            for update_id in (1, 2, 3):  # Alice's, in her one chat: 2 and 3 wait behind 1
                await post_update(client, port, update(update_id, ALICE, ALICE_TEXT, ALICE_NAME))
            for update_id in (4, 5):
                await post_update(client, port, update(update_id, BOB, BOB_TEXT, BOB_NAME))
            await wait_for(holding.held.is_set)
            await wait_for(lambda: {4, 5} <= {r.update_id for r in downstream.received})

            refused = await client.post(
                f"{base}/v1/erasures", json={"bot": "default"}, headers=headers
            )
            assert refused.status_code == 422, refused.text
            counted = await client.post(
                f"{base}/v1/erasures",
                json={"bot": "default", "user_id": ALICE, "dry_run": True},
                headers=headers,
            )
            assert counted.status_code == 202, counted.text
            asked = await client.post(
                f"{base}/v1/erasures", json={"bot": "default", "user_id": ALICE}, headers=headers
            )
            assert asked.status_code == 202, asked.text
            job = asked.json()
            assert job["state"] in ("pending", "running", "done")
            assert str(ALICE) not in asked.text

            async def done() -> dict[str, object]:
                shown = await client.get(f"{base}/v1/erasures/{job['id']}", headers=headers)
                return dict(shown.json())

            for _ in range(300):
                if (shown := await done())["state"] == "done":
                    break
                await asyncio.sleep(0.1)
            assert (shown["updates"], shown["dry_run"]) == (3, False), shown
            dry = await client.get(f"{base}/v1/erasures/{counted.json()['id']}", headers=headers)
            assert dry.json()["updates"] == 3, dry.text

            holding.released.set()  # the held attempt asks owns before its write: refused
            await wait_for(lambda: holding.owned)
            assert holding.owned == [False]
            # A later update of Bob's arrives: the workers had their turn at Alice's, if any.
            await post_update(client, port, update(6, BOB, BOB_TEXT, BOB_NAME))
            await wait_for(lambda: 6 in {r.update_id for r in downstream.received})
            alices = [r.update_id for r in downstream.received if r.update_id in (1, 2, 3)]
            assert alices == [1], alices
            for gone in (1, 2, 3):
                shown = await client.get(f"{base}/v1/updates/default/{gone}", headers=headers)
                assert shown.status_code == 404, shown.text
            await wait_for(
                lambda: any(b'"erasure.completed"' in r.body for r in downstream.operations)
            )
            (event,) = [
                json.loads(r.body)
                for r in downstream.operations
                if b'"erasure.completed"' in r.body
            ]
            assert event["data"]["user_id"] == ALICE
            assert event["data"]["updates"] == 3
            audit = await client.get(f"{base}/v1/audit", headers=headers)
            assert "erase" in audit.text
            assert str(ALICE) not in audit.text
            await asyncio.sleep(0.5)  # the event's delivery is marked, forgetting its id
        for process in (serve, worker):
            process.signal(signal.SIGTERM)
            process.popen.wait(timeout=30)

    if storage.backend == "sqlite":  # what is left in the files, after the checkpoint
        path = Path(url.partition("///")[2])
        with sqlite3.connect(path) as connection:
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        files = [Path(f"{path}{suffix}") for suffix in ("", "-wal", "-shm")]
        alice = [ALICE_TEXT, ALICE_NAME, str(ALICE)]
        bob = [BOB_TEXT, BOB_NAME, str(BOB)]
        assert found_in(files, alice) == set()
        assert found_in(files, bob) == set(bob)  # the control: the search finds what is there
