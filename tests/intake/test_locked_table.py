"""A `serve` process while another session holds the table locked: every request answers
within its own budget, and memory stays bounded and is given back (issue 14, items 1 and 2).

The experiment of docs/reliability.md: 800 posts of 100 KB, 40 a second, during a 20-second
lock, with `INTAKE_COMMIT_TIMEOUT_MS=2000`.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.conftest import Storage, table_locked
from tests.hostile.campaign import API_KEY, WEBHOOK, start_target
from tests.intake.conftest import commit_waits_within

pytestmark = pytest.mark.slow  # a 20-second lock, a real process

POSTS = 800
RATE = 40  # posts a second: the lock spans all of them
BODY_TEXT = 100_000
LOCK_SECONDS = 20.0
BUDGET_MS = 2000


def _body(update_id: int) -> str:
    return json.dumps({"update_id": update_id, "message": {"text": "x" * BODY_TEXT}})


RESENT: list[int] = []  # posts whose connection was reset unanswered, sent again


async def _post_all(base: str) -> list[tuple[int, float]]:
    """Every post at its time; each answer's status and how long after its own send."""
    # A fresh connection for each post, as Telegram's own: a kept-alive connection that the
    # server closes after its idle time while the client reuses it is a race of the client's,
    # not an answer of the server's.
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:

        async def one(update_id: int) -> tuple[int, float]:
            await asyncio.sleep(update_id / RATE)
            for attempt in range(3):
                began = time.monotonic()
                try:
                    response = await client.post(
                        f"{base}/telegram/default", content=_body(update_id), headers=dict(WEBHOOK)
                    )
                except httpx.ReadError:
                    # A connection an overloaded machine reset before any answer: Telegram
                    # sends the update again, and so does this client (at most twice).
                    if attempt == 2:
                        raise
                    RESENT.append(update_id)
                    continue
                return response.status_code, time.monotonic() - began
            raise AssertionError("unreachable")

        return await asyncio.gather(*(one(n) for n in range(POSTS)))


async def test_a_locked_table_costs_each_request_its_budget_and_bounded_memory(
    postgres_storage: Storage, postgres_admin: psycopg.Connection, tmp_path: Path
) -> None:
    url = postgres_storage.url()
    target = start_target(tmp_path, url, commit_timeout_ms=BUDGET_MS)
    try:
        before = target.rss_kib()
        peak = before
        stop = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not stop.wait(0.05):
                try:
                    peak = max(peak, target.rss_kib())
                except (FileNotFoundError, StopIteration):
                    return  # the process ended: the test says why

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        async with table_locked(postgres_admin, url):
            try:
                answers = await _post_all(target.base)
            except httpx.TransportError as error:
                raise AssertionError(f"{error!r}\n{target.process.report()}") from error
            await asyncio.sleep(max(0.0, LOCK_SECONDS - POSTS / RATE))
        await asyncio.sleep(3)  # the hung insert ends; what it held is released
        stop.set()
        sampler.join()
        after = target.rss_kib()
        async with httpx.AsyncClient(timeout=30) as client:
            fine = await client.post(
                f"{target.base}/telegram/default", content=_body(10**6), headers=dict(WEBHOOK)
            )
            exposition = await client.get(
                f"{target.base}/metrics", headers={"authorization": f"Bearer {API_KEY}"}
            )
    finally:
        stop.set()
        target.process.kill()
    within = commit_waits_within(exposition.text, "default")
    print(  # the figures of docs/reliability.md
        f"\nRSS MiB before {before / 1024:.0f}, peak {peak / 1024:.0f}, after {after / 1024:.0f};"
        f" slowest answer seen by the client {max(took for _, took in answers):.2f} s;"
        f" commits answered within 1, 2.5, 5 s of arrival: {within[1]}, {within[2.5]}, {within[5]};"
        f" posts sent again after a reset connection: {len(RESENT)}"
    )
    assert {status for status, _ in answers} == {503}
    # The 2 s budget, each from its own arrival: every commit wait the server saw (a resent
    # post's first may have arrived too) ended within 2.5 s.
    assert within[2.5] == within[float("inf")] >= POSTS + 1, (within, RESENT)
    # RESENT is not bounded: how many connections a loaded machine resets before the server
    # reads them is the machine's (one run beside the suite: 39, another 628), and each was
    # sent again and answered 503 within its budget like the rest.
    assert (peak - before) / 1024 <= 64
    # What stays is within the same bound (before, 210 MiB stayed): Python's allocator keeps
    # the arenas it used, 20 to 35 MiB here, and does not grow them on the next lock.
    assert (after - before) / 1024 <= 64
    assert fine.status_code == 200
