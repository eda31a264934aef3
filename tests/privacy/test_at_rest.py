"""Personal data at rest, proven where it rests: the database's own files, and the logs
(docs/privacy.md).

Real `serve` and `worker` processes record updates that carry marker text, a name, a phone
number and chat and user ids, and deliver them to a downstream that echoes a marker of its own
in its answers (some complete, some retry first, some end as exhaustions, each with an
operational event). An operator searches and acknowledges by chat and error text. Then the
test reads the bytes of the SQLite database and its WAL, or a PostgreSQL cluster's data
directory and WAL that it started itself: with a key ring, none of those strings is there; the
control without one finds each of them, so the search could fail.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psycopg
import pytest
from starlette.requests import Request
from starlette.responses import Response

from app.store import SqlUpdateStore, migrate, open_store
from app.store.codec import PLAIN, Codec
from tests.downstream import SIGNING_SECRET, FakeDownstream, Received
from tests.postgres_server import required_binaries, running_cluster
from tests.privacy.rings import INDEX_KEY_TEXT, key_text, test_ring
from tests.processes import (
    environment,
    free_port,
    post_update,
    processes,
    until_serving,
)

pytestmark = pytest.mark.slow  # real processes; a cluster of its own on PostgreSQL

TEXT = "Quokka-marker-7731"
NAME = "Zelphinia"
PHONE = "+15550001234"
ANSWER = "Echo-marker-4410"  # what the downstream says back: it may quote its user
CHAT = 730_000_000_100
USER = 610_000_000_100
UPDATES = 12  # every third ends as an exhaustion, every third retries once first
API_KEY = "privacy-operator-key"


def update(update_id: int) -> str:
    chat, user = CHAT + update_id, USER + update_id
    person = {"id": user, "is_bot": False, "first_name": NAME}
    message = {
        "message_id": update_id,
        "date": 1_700_000_000,
        "chat": {"id": chat, "type": "private", "first_name": NAME},
        "from": person,
        "text": f"hello {TEXT}",
        "contact": {"phone_number": PHONE, "first_name": NAME, "user_id": user},
    }
    return json.dumps({"update_id": update_id, "message": message})


def secrets_of(update_id: int) -> list[str]:
    """What must not be found at rest, from update `update_id`."""
    return [TEXT, NAME, PHONE, ANSWER, str(CHAT + update_id), str(USER + update_id)]


async def answer(received: Received, _request: Request) -> Response:
    """Every third: refused for good (an exhaustion); every third: one 500 first."""
    if received.update_id % 3 == 0:
        return Response(json.dumps({"description": f"no such user {ANSWER}"}), 400)
    if received.update_id % 3 == 2 and received.attempt == 1:
        return Response(json.dumps({"description": f"busy {ANSWER}"}), 500)
    return Response(json.dumps({"ok": True, "echo": ANSWER}), 200)


def found_in(files: list[Path], needles: list[str]) -> set[str]:
    """The needles whose UTF-8 bytes appear in any of the files."""
    contents = [path.read_bytes() for path in files if path.is_file()]
    return {needle for needle in needles if any(needle.encode() in data for data in contents)}


@contextmanager
def database(backend: str, tmp_path: Path) -> Iterator[tuple[str, Callable[[], list[Path]]]]:
    """(URL, the files to read once the processes stopped: after a checkpoint)."""
    if backend == "sqlite":
        path = tmp_path / "intake.db"

        def sqlite_files() -> list[Path]:
            # First as the processes left them (the WAL holds the latest pages), then with the
            # WAL checkpointed into the database: both are read.
            before = [Path(f"{path}{suffix}") for suffix in ("", "-wal", "-shm")]
            copies = []
            for index, file in enumerate(before):
                if file.is_file():
                    copy = tmp_path / f"before-checkpoint-{index}"
                    copy.write_bytes(file.read_bytes())
                    copies.append(copy)
            with sqlite3.connect(path) as connection:
                connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            return copies + before

        yield f"sqlite:///{path}", sqlite_files
        return
    with running_cluster(required_binaries()) as cluster:
        url = cluster.url()

        def postgres_files() -> list[Path]:
            with psycopg.connect(url, autocommit=True) as connection:
                connection.execute("CHECKPOINT")
            return [p for p in cluster.data_directory.rglob("*") if p.is_file()]

        yield url, postgres_files


async def settled(store: SqlUpdateStore, within: float = 60) -> None:
    """Until every update is delivered or exhausted."""
    for _ in range(int(within / 0.1)):
        stats = await store.stats()
        states = stats[0].states if stats else {}
        if sum(states.values()) == UPDATES and set(states) <= {"completed", "abandoned"}:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"not settled within {within} s: {states}")


@pytest.mark.parametrize("encrypted", [True, False], ids=["keys", "control"])
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_nothing_a_user_sent_rests_in_the_database_files(
    backend: str,
    encrypted: bool,
    downstream: FakeDownstream,
    tmp_path: Path,
) -> None:
    echoing = downstream
    echoing.answer = answer
    with database(backend, tmp_path) as (url, files_at_rest), processes(tmp_path) as start:
        migrate.upgrade(url)
        keys = {"encryption_keys": f"t1:{key_text('t1')}", "index_key": INDEX_KEY_TEXT}
        port = free_port()
        env = environment(
            url,
            f"{echoing.url}/hook",
            api_keys=API_KEY,
            operations_url=f"{echoing.url}/operations",
            operations_signing_secret=SIGNING_SECRET,
            log_level="debug",  # every line, a dependency's included
            **(keys if encrypted else {}),
        )
        serve = start("serve", env, "serve", "--port", str(port))
        worker = start("worker", env, "worker")
        store = await open_store(url, codec=Codec(test_ring()) if encrypted else PLAIN)
        headers = {"Authorization": f"Bearer {API_KEY}"}
        try:
            async with httpx.AsyncClient(timeout=10) as client:
                await until_serving(client, port, serve)
                for update_id in range(1, UPDATES + 1):
                    await post_update(client, port, update(update_id))
                await settled(store)

                # The operator's reads and acts work on sealed rows as on plain ones.
                base = f"http://127.0.0.1:{port}/v1"
                found = await client.get(
                    f"{base}/updates",
                    params={"bot": "default", "chat": str(CHAT + 4), "contains": TEXT},
                    headers=headers,
                )
                assert [item["update_id"] for item in found.json()["items"]] == [4], found.text
                named = await client.get(
                    f"{base}/updates", params={"user": str(USER + 5)}, headers=headers
                )
                assert [item["update_id"] for item in named.json()["items"]] == [5], named.text
                shown = await client.get(f"{base}/updates/default/5/attempts", headers=headers)
                assert ANSWER in shown.json()["items"][0]["error"], shown.text
                chosen = {"bot": "default", "chat": str(CHAT + 3), "error_contains": ANSWER}
                acknowledged = await client.post(
                    f"{base}/exhaustions/acknowledge", json={"filter": chosen}, headers=headers
                )
                assert acknowledged.json()["acknowledged"] == 1, acknowledged.text
                for _ in range(300):  # the exhaustions' events reach operations_url
                    if len({r.body for r in echoing.operations}) >= UPDATES // 3:
                        break
                    await asyncio.sleep(0.1)
                told = [json.loads(r.body) for r in echoing.operations]
                assert any(ANSWER in (e["data"].get("error") or "") for e in told), told
        finally:
            await store.close()
        for process in (serve, worker):
            process.signal(signal.SIGTERM)
            process.popen.wait(timeout=30)
        assert (echoing.received[0].body.decode()) == update(1)  # forwarded as it was posted

        secrets = sorted({s for update_id in range(1, UPDATES + 1) for s in secrets_of(update_id)})
        at_rest = found_in(files_at_rest(), secrets)
        # With keys or without, no log line names what a user sent or a downstream answered.
        for process in (serve, worker):
            logged = process.stdout + process.stderr
            assert "DEBUG" in logged, "the processes logged at debug: the check is blind"
            assert [s for s in secrets if s in logged] == [], process.name
    if encrypted:
        assert at_rest == set(), f"found at rest with a key ring: {sorted(at_rest)}"
    else:  # the control: each kind of secret is there to be found without one
        assert {TEXT, NAME, PHONE, ANSWER, str(CHAT + 1), str(USER + 1)} <= at_rest
