"""Hosts whose clocks disagree (issue 49): `serve` ten minutes ahead of the database and a
`worker` ten minutes behind it, each under libfaketime (Debian's `faketime`), on PostgreSQL,
whose clock is the one every process reads (`app/dispatch/clock.py`). The downstream runs on
the true clock and verifies each signature with the Standard Webhooks library's default
tolerance (five minutes)."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from email.utils import format_datetime
from pathlib import Path

import httpx
import pytest
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError
from starlette.requests import Request
from starlette.responses import Response

from tests.conftest import Storage
from tests.downstream import SIGNING_SECRET, FakeDownstream, Received, eventually, message, ok
from tests.processes import (
    STARTUP,
    Process,
    environment,
    free_port,
    post_update,
    unavailable,
)

pytestmark = pytest.mark.slow  # real processes

INLINE = {
    "update_id": 2,
    "inline_query": {"id": "q", "from": {"id": 7}, "query": "cats", "offset": ""},
}
KEY = "skewed-clocks-key-0123456789"
RETRY_IN = 3.0  # seconds, as an HTTP date the downstream gives on a message's first attempt


def _skewed(env: dict[str, str], offset: str) -> dict[str, str]:
    """`env` for a process whose clocks are `offset` from the true one: libfaketime preloaded
    into the process itself (the `faketime` command would run it as a child of its own, which
    a kill of the command leaves running, its connections held)."""
    found = sorted(Path("/usr/lib").glob("*/faketime/libfaketimeMT.so.1"))
    if not found:
        unavailable("libfaketime is not installed (apt-get install faketime)")
    return env | {"LD_PRELOAD": str(found[0]), "FAKETIME": offset}


async def test_skewed_hosts_sign_retry_and_keep_deadlines_by_the_database_s_clock(
    postgres_storage: Storage, downstream: FakeDownstream, tmp_path: Path
) -> None:
    signer = Webhook(SIGNING_SECRET)
    refused: list[str] = []

    async def answer(received: Received, request: Request) -> Response:
        try:
            signer.verify(received.body, received.headers)
        except WebhookVerificationError as error:
            refused.append(f"{received.update_id}: {error}")
        if received.update_id == 1 and received.attempt == 1:
            # "Come back in RETRY_IN seconds", by the true clock (the database's here).
            at = datetime.fromtimestamp(time.time() + RETRY_IN, tz=UTC)
            headers = {"retry-after": format_datetime(at, usegmt=True)}
            return Response("{}", 503, headers, media_type="application/json")
        return await ok(received, request)

    downstream.answer = answer
    port = free_port()
    env = environment(
        postgres_storage.url(),
        f"{downstream.url}/hook",
        port=port,
        signing_secret=SIGNING_SECRET,
        retry_after_cap_seconds=30,
        api_keys=KEY,
    )
    serve = Process("serve", tmp_path, _skewed(env, "+10m"), "serve")
    worker = Process("worker", tmp_path, _skewed(env, "-10m"), "worker")
    try:
        await eventually(lambda: serve.answers(f"http://127.0.0.1:{port}/healthz"), within=STARTUP)
        async with httpx.AsyncClient(timeout=30) as client:
            for body in (message(1), json.dumps(INLINE)):
                await post_update(client, port, body)
        try:
            await eventually(lambda: len(downstream.received) >= 3, within=40)
        except AssertionError:
            seen = [(r.update_id, r.attempt) for r in downstream.received]
            raise AssertionError(f"arrived {seen}\n{worker.report()}") from None
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            scraped = await client.get("/metrics", headers={"authorization": f"Bearer {KEY}"})
        await asyncio.sleep(1.0)  # nothing more: no lease taken over early, no retry too many
    finally:
        serve.kill()
        worker.kill()
    arrivals = {(r.update_id, r.attempt): r.at for r in downstream.received}
    assert sorted(arrivals) == [(1, 1), (1, 2), (2, 1)]  # the inline query in time, once
    assert refused == []  # every signature within the receiver's five minutes
    waited = arrivals[(1, 2)] - arrivals[(1, 1)]
    # By the worker's own clock the date was ten minutes away (waited up to the cap, 30 s);
    # by the database's, RETRY_IN seconds.
    assert RETRY_IN - 1 <= waited <= RETRY_IN + 4, waited
    # Each process measured its host's clock and said so once: serve ahead, the worker behind.
    [offset] = [
        float(line.split()[-1])
        for line in scraped.text.splitlines()
        if line.startswith("telegram_intake_clock_offset_seconds ")
    ]
    assert -605 <= offset <= -595, offset
    assert serve.stderr.count("s ahead of the database's") == 1, serve.stderr
    assert worker.stderr.count("s behind the database's") == 1, worker.stderr
