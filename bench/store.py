"""The store's hot path with a million settled rows retained, beside the same on an empty table.

For each backend and retention (0 and 1,000,000 completed rows, plus a backlog of pending rows
in 500 chats) it times: `claim_owned` of one key, `claim_next_owned` of 64 rows with chat
ordering and without, `due(limit=100)`, and a drain that claims batches of 64 (chat ordering)
and settles each row with `settle_owned`. The ratio column is 1M retained over 0 retained:
near 1.0 means retention costs nothing.
"""

from __future__ import annotations

import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import psycopg

from app.store import Completed, SqlUpdateStore, open_store
from app.store.migrate import upgrade
from tests.conftest import POSTGRES_URL
from tests.store.big_table import NOW, Shape, fill

LEASE = 60_000


async def fresh_storage(backend: str, directory: Path) -> tuple[str, Callable[[], None]]:
    name = f"bench_{uuid.uuid4().hex[:12]}"
    if backend == "sqlite":
        url = f"sqlite+aiosqlite:///{directory / name}.db"
        upgrade(url)
        return url, lambda: None
    admin = psycopg.connect(POSTGRES_URL, autocommit=True)
    admin.execute(f"CREATE SCHEMA {name}")
    url = f"{POSTGRES_URL.replace('postgresql://', 'postgresql+psycopg://')}?options=-csearch_path%3D{name}"
    upgrade(url)

    def drop() -> None:
        admin.execute(f"DROP SCHEMA {name} CASCADE")
        admin.close()

    return url, drop


async def _times(call: Callable[[], Awaitable[object]], count: int) -> list[float]:
    spent = []
    for _ in range(count):
        started = time.perf_counter()
        await call()
        spent.append((time.perf_counter() - started) * 1000)
    return spent


def _p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


async def _measure(store: SqlUpdateStore, shape: Shape, samples: int) -> dict[str, list[float]]:
    first_pending = shape.retained + 1
    keys = iter(range(first_pending, first_pending + shape.pending))
    now = NOW

    async def claim_one() -> None:
        bot = "shop"
        update_id = next(keys)
        if update_id % 2:
            bot = "news"
        await store.claim_owned(bot, update_id, now=now, lease_until=now + LEASE, max_attempts=8)

    async def claim_batch(ordering: str) -> None:
        await store.claim_next_owned(
            now=now,
            lease_until=now + LEASE,
            max_attempts=8,
            limit=64,
            ordering=ordering,  # type: ignore[arg-type]
        )

    results = {
        "claim_owned": await _times(claim_one, samples),
        "due(100)": await _times(lambda: store.due(now=now, pending_before=now, limit=100), 50),
        "claim_next_owned chat 64": await _times(lambda: claim_batch("chat"), 20),
        "claim_next_owned none 64": await _times(lambda: claim_batch("none"), 20),
    }
    # Drain: claim 64 with chat ordering, settle each; the rate is updates settled per second.
    now += LEASE + 1  # every lease taken above has lapsed: those rows come back
    drained = 0
    started = time.perf_counter()
    while drained < samples * 4:
        batch = await store.claim_next_owned(
            now=now, lease_until=now + LEASE, max_attempts=8, limit=64, ordering="chat"
        )
        if not batch:
            break
        for claimed in batch:
            await store.settle_owned(claimed.identity, Completed(now))
        drained += len(batch)
    results["drain"] = [drained / (time.perf_counter() - started)]
    return results


async def main(*, quick: bool = False) -> str:
    retained_sizes = (0, 10_000 if quick else 1_000_000)
    samples = 50 if quick else 500
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        for backend in ("postgresql", "sqlite"):
            measured = {}
            for retained in retained_sizes:
                url, drop = await fresh_storage(backend, Path(directory))
                store = await open_store(url)
                try:
                    shape = Shape(
                        retained=retained,
                        pending=20_000,
                        chats=500,
                        failed=0,
                        lapsed=0,
                        exhausted=0,
                    )
                    await fill(store.engine, shape)
                    measured[retained] = await _measure(store, shape, samples)
                finally:
                    await store.close()
                    drop()
            small, large = (measured[size] for size in retained_sizes)
            for name in small:
                if name == "drain":
                    a, b = small[name][0], large[name][0]
                    rows.append(
                        f"| {backend} | drain: claim 64 (chat) + settle_owned each, updates/s "
                        f"| {a:,.0f} | {b:,.0f} | {b / a:.2f} |"
                    )
                    continue
                a50, b50 = _p(small[name], 50), _p(large[name], 50)
                rows.append(
                    f"| {backend} | {name}, ms p50 / p99 | {a50:.2f} / {_p(small[name], 99):.2f} "
                    f"| {b50:.2f} / {_p(large[name], 99):.2f} | {b50 / a50:.2f} |"
                )
    head = (
        f"| backend | measure | 0 retained | {retained_sizes[1]:,} retained | ratio |\n"
        "| --- | --- | --- | --- | --- |"
    )
    return head + "\n" + "\n".join(rows)
