"""Long polling's intake rate beside the webhook's, in the same run (issue 18): updates per second
from the fake Bot API into the store by getUpdates, against updates per second POSTed to the
webhook intake.

Both on one fresh PostgreSQL schema, bot `default` paused (so that nothing is delivered: this
measures recording only). The webhook: a `serve` process, 20,000 updates POSTed over 64
connections at once (aiohttp), timed from the first post to the last 200. Polling: a `worker`
process whose bot takes its updates by getUpdates (Telegram's limit, 100 a call) from the fake
Bot API (`app.fake_bot_api`, in this process), 20,000 updates handed to it at once, timed until
the table holds every one (each batch recorded with its offset, confirmed by the next call).
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Callable

import aiohttp
import uvicorn
from sqlalchemy import func, select

from app.fake_bot_api import TOKEN, FakeBotApi
from app.store import SqlUpdateStore, open_store
from app.store.migrate import upgrade
from bench.fixtures import SECRET, body, fresh_schema, serve, worker, worker_env

PORT = 18_478
FAKE_PORT = 18_479
CONNECTIONS = 64


async def main(*, quick: bool = False) -> str:
    count = 2_000 if quick else 20_000
    async with fresh_schema() as (url, _):
        upgrade(url)
        store = await open_store(url)
        try:
            await store.pause("default", at=int(time.time() * 1000), by="bench")
            webhook = await _webhook(url, count)
            polled = await _polled(url, store, count)
        finally:
            await store.close()
    lines = [
        f"{count:,} updates recorded on PostgreSQL, bot paused (recording only), one process:",
        "",
        "| source | seconds | updates/s | x webhook |",
        "| --- | --- | --- | --- |",
        f"| webhook: `serve`, POSTs over {CONNECTIONS} connections | {webhook:.2f} | "
        f"{count / webhook:,.0f} | 1.00 |",
        f"| getUpdates: `worker`, 100 a call from the fake Bot API | {polled:.2f} | "
        f"{count / polled:,.0f} | {webhook / polled:.2f} |",
    ]
    return "\n".join(lines)


async def _webhook(url: str, count: int) -> float:
    print(f"bench polling: POSTing {count:,} updates to the webhook", file=sys.stderr)
    env = worker_env(url, "http://127.0.0.1:9", INTAKE_PORT=str(PORT), INTAKE_LOG_LEVEL="warning")
    headers = {"X-Telegram-Bot-Api-Secret-Token": SECRET, "Content-Type": "application/json"}
    # aiohttp: httpx's own client tops out near 400 requests/s at this concurrency
    # (PERFORMANCE.md), which would measure the client, not the intake.
    connector = aiohttp.TCPConnector(limit=CONNECTIONS)
    async with serve(env), aiohttp.ClientSession(connector=connector) as session:
        queue = iter(range(1, count + 1))
        target = f"http://127.0.0.1:{PORT}/telegram/default"

        async def poster() -> None:
            for update_id in queue:
                async with session.post(target, data=body(update_id), headers=headers) as answer:
                    assert answer.status == 200, await answer.text()

        began = time.perf_counter()
        await asyncio.gather(*(poster() for _ in range(CONNECTIONS)))
        return time.perf_counter() - began


async def _polled(url: str, store: SqlUpdateStore, count: int) -> float:
    print(f"bench polling: polling {count:,} updates", file=sys.stderr)
    fake = FakeBotApi()
    server = uvicorn.Server(
        uvicorn.Config(fake.app(), host="127.0.0.1", port=FAKE_PORT, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    await _until(lambda: server.started)
    env = worker_env(
        url,
        "http://127.0.0.1:9",
        INTAKE_SOURCE="polling",
        INTAKE_BOT_TOKEN=TOKEN,
        INTAKE_BOT_API_URL=f"http://127.0.0.1:{FAKE_PORT}",
        INTAKE_POLL_TIMEOUT_SECONDS="1",
    )
    first = count + 1
    try:
        async with worker(env):
            began = time.perf_counter()
            fake.produce(*(_update(n) for n in range(first, first + count)))
            while True:  # the table is the witness: every update recorded
                if await _rows(store) >= 2 * count:
                    return time.perf_counter() - began
                await asyncio.sleep(0.02)
    finally:
        server.should_exit = True
        await asyncio.to_thread(thread.join, 10)


def _update(update_id: int) -> dict[str, object]:
    parsed: dict[str, object] = json.loads(body(update_id))
    return parsed


async def _rows(store: SqlUpdateStore) -> int:
    counted = select(func.count()).select_from(store.table)
    async with store.engine.connect() as connection:
        return int((await connection.execute(counted)).scalar_one())


async def _until(check: Callable[[], bool]) -> None:
    for _ in range(1_500):  # 15 s
        if check():
            return
        await asyncio.sleep(0.01)
    raise RuntimeError("the fake Bot API did not start")
