"""A `serve` process on SQLite killed (SIGKILL) while updates pour in from 32 clients at once:
every update it answered 200 is in the file afterwards, and nothing that was never sent is.

The intake's hot path on SQLite is its own (issue 21): the group commit takes at most half the
requests waiting, and the writer's thread runs each batch's INSERT as one autocommit statement.
This proves the order those keep, a 200 only after the commit. The kill comes while the test
holds SQLite's write lock, so that requests wait behind it, read and parsed and not committed:
an intake that answered before its commit would have answered them, and they would be missing.
(A killed process leaves the operating system's buffers behind, so it cannot prove the fsync:
`synchronous=FULL` on both of the store's connections is checked in
tests/store/test_sqlstore.py.)
"""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import make_url

from tests.conftest import Storage
from tests.hostile.campaign import WEBHOOK, start_target

pytestmark = pytest.mark.slow  # a real process

CLIENTS = 32
BEFORE_THE_KILL = 1_000  # updates answered 200 before the process is killed


async def test_every_update_answered_200_survives_a_sigkill_mid_stream(
    sqlite_storage: Storage, tmp_path: Path
) -> None:
    url = sqlite_storage.url()
    path = make_url(url).database
    assert path is not None
    target = start_target(tmp_path, url)
    sent: set[int] = set()
    accepted: set[int] = set()
    killed = asyncio.Event()
    limits = httpx.Limits(max_connections=CLIENTS)
    async with httpx.AsyncClient(timeout=10, limits=limits) as client:

        async def lane(number: int) -> None:
            update_id = number * 10**6
            while not killed.is_set():
                update_id += 1
                chat = {"id": number, "type": "private"}
                body = {"update_id": update_id, "message": {"chat": chat, "text": "order"}}
                sent.add(update_id)
                try:
                    answer = await client.post(
                        f"{target.base}/telegram/default",
                        content=json.dumps(body),
                        headers=dict(WEBHOOK),
                    )
                except httpx.TransportError:
                    return  # the process is gone
                if answer.status_code == 200:
                    accepted.add(update_id)

        lanes = [asyncio.create_task(lane(number)) for number in range(1, CLIENTS + 1)]
        try:
            deadline = time.monotonic() + 120  # a loaded CI machine: the speed is not the point
            while len(accepted) < BEFORE_THE_KILL:
                assert time.monotonic() < deadline, (len(accepted), target.process.report())
                assert not any(task.done() for task in lanes), target.process.report()
                await asyncio.sleep(0.01)
            locker = sqlite3.connect(path, isolation_level=None)
            try:
                locker.execute("BEGIN IMMEDIATE")
                answered = len(accepted)
                await asyncio.sleep(0.5)  # well within the busy timeout and the commit budget
                waited = len(sent) - len(accepted)
                target.process.signal(signal.SIGKILL)
                assert target.process.popen.wait(timeout=10) == -signal.SIGKILL
                locker.execute("ROLLBACK")
            finally:
                locker.close()
        finally:
            # Whatever happened, no lane outlives its client (a failure here must not leave
            # requests of a closed client to later tests of this worker).
            killed.set()
            for task in lanes:
                task.cancel()
            await asyncio.gather(*lanes, return_exceptions=True)
            target.process.kill()  # and the process is reaped, killed above or not

    with sqlite3.connect(path) as connection:
        stored = {row[0] for row in connection.execute("SELECT update_id FROM telegram_updates")}
    assert accepted <= stored, f"answered 200, not in the file: {sorted(accepted - stored)[:10]}"
    assert stored <= sent
    assert len(stored) >= BEFORE_THE_KILL
    assert waited >= CLIENTS // 2  # requests were behind the lock when the process died
    assert len(accepted) - answered < CLIENTS  # and none of them was answered
