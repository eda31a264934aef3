"""The store's hot path with a million settled rows retained, beside the same on an empty table.

For each backend and retention (0 and 1,000,000 completed rows, plus 20,000 pending rows in 500
chats and 500 leases in flight) it times `claim_owned` of one key, `claim_next_owned` of 64 rows
with chat ordering and without, and `due(limit=100)`. Then it drains as PERFORMANCE.md measured
the hot path: 4 concurrent claimers take 64 rows (chat ordering) and settle them, one statement
per row (the baseline) or one batch statement (`settle_many_owned`). The ratio column is 1M
retained over 0 retained: near 1.0 means retention costs nothing.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import psycopg

from app.store import ClaimIdentity, Completed, Ordering, SqlUpdateStore, open_store
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
    taken: list[ClaimIdentity] = []

    async def claim_one() -> None:
        update_id = next(keys)
        bot = "news" if update_id % 2 else "shop"
        identity = await store.claim_owned(
            bot, update_id, now=now, lease_until=now + LEASE, max_attempts=8
        )
        taken.append(identity) if identity is not None else None

    async def claim_batch(ordering: Ordering, settle: bool = True) -> None:
        # Timed: the claim. Untimed: settling the batch, as a dispatcher's steady state does.
        started = time.perf_counter()
        batch = await store.claim_next_owned(
            now=now, lease_until=now + LEASE, max_attempts=8, limit=64, ordering=ordering
        )
        spent.append((time.perf_counter() - started) * 1000)
        if settle:
            await store.settle_many_owned([(c.identity, Completed(now)) for c in batch])

    results = {"claim_owned": await _times(claim_one, samples)}
    await store.settle_many_owned([(identity, Completed(now)) for identity in taken])
    results["due(100)"] = await _times(
        lambda: store.due(now=now, pending_before=now, limit=100), 50
    )
    for label, ordering in (("chat", "chat"), ("none", "none")):
        spent: list[float] = []
        for _ in range(20):
            await claim_batch(ordering)  # type: ignore[arg-type]
        results[f"claim_next_owned {label} 64"] = spent
    # Worst case for chat ordering: every queue's head is in flight, so no row is eligible and
    # the claim walks the whole due backlog to find that out.
    await store.claim_next_owned(
        now=now, lease_until=now + LEASE, max_attempts=8, limit=shape.chats * 2
    )
    spent = []
    for _ in range(10):
        await claim_batch("chat", settle=False)
    results["claim_next_owned chat 64, every queue blocked"] = spent
    # Drain, as PERFORMANCE.md measured it: 4 concurrent claimers take 64 rows with chat
    # ordering, then settle them one statement per row, or in one batch statement.
    now += LEASE + 1  # every lease taken above has lapsed: those rows come back
    for label, batched in (("drain, settle per row", False), ("drain, batched settle", True)):
        results[label] = [await _drain(store, now, batched, limit=samples * 8)]
        now += LEASE + 1
    return results


async def _drain(store: SqlUpdateStore, now: int, batched: bool, *, limit: int) -> float:
    drained = 0

    async def claimer() -> None:
        nonlocal drained
        while drained < limit:
            batch = await store.claim_next_owned(
                now=now, lease_until=now + LEASE, max_attempts=8, limit=64, ordering="chat"
            )
            if not batch:
                return
            if batched:
                await store.settle_many_owned([(c.identity, Completed(now)) for c in batch])
            else:
                for claimed in batch:
                    await store.settle_owned(claimed.identity, Completed(now))
            drained += len(batch)

    started = time.perf_counter()
    await asyncio.gather(*(claimer() for _ in range(4)))
    return drained / (time.perf_counter() - started)


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
                if name.startswith("drain"):
                    a, b = small[name][0], large[name][0]
                    rows.append(
                        f"| {backend} | {name}, updates/s | {a:,.0f} | {b:,.0f} | {b / a:.2f} |"
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
