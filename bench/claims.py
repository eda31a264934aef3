"""Chat-ordered claims with and without a blocked chat (issue 14, item 8), both backends.

Two tables of one backend, side by side: 500 chats flowing (40 pending rows each), and the
same beside one chat whose head waits in backoff (failed, retried an hour on) with 100,000
pending rows behind it, all received before the flowing chats' rows. Claims alternate between
the two tables, so that both meet the same machine: each takes 64 rows with chat ordering for
one bot, as a worker does (timed), then settles them (untimed), so the next claim finds the
next heads. The ratio is the blocked table's p50 over the free one's; before the walk over the
chat heads, a claim beside the blocked chat stepped through its whole backlog.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store import Completed, SqlUpdateStore, open_store
from bench.store import fresh_storage

BOT = "bench"
NOW = 2_000_000_000_000
CHATS = 500
LIMIT = 64
SAMPLES = 200  # claims timed on each table
SERIES = {
    "postgresql": "SELECT g AS n FROM generate_series(1, :count) AS g",
    "sqlite": (
        "WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < :count) "
        "SELECT n FROM s"
    ),
}
# queue_rule 1: rows as this code records them (without it, revision 0006's trigger keys them).
COLUMNS = (
    "bot, update_id, body, update_type, queue_key, state, attempts, due_at, received_at, queue_rule"
)
BODY = '{"update_id": 1, "message": {"text": "bench"}}'


async def fill(engine: AsyncEngine, *, blocked: int, per_chat: int) -> None:
    """CHATS chats of `per_chat` pending rows (update_ids interleaving the chats, as
    Telegram's do) and, with `blocked`, chat "hot": a failed head retried an hour from now
    and `blocked` pending rows behind it, received before all the others."""
    series = SERIES[engine.dialect.name]
    groups = [
        ("1000000 + n", f"'chat:' || (n % {CHATS})", f"{NOW} - 1000000 + n", CHATS * per_chat)
    ]
    async with engine.begin() as connection:
        if blocked:
            await connection.execute(
                text(
                    f"INSERT INTO telegram_updates ({COLUMNS}, claim_id) VALUES ('{BOT}', 1, "
                    f"'{BODY}', 'message', 'hot', 'failed', 1, {NOW + 3_600_000}, "
                    f"{NOW - 10**8}, 1, 'a-claim-id')"
                )
            )
            groups.append(("1 + n", "'hot'", f"{NOW} - 10000000 + n", blocked))
        for update_id, queue_key, due_at, count in groups:
            await connection.execute(
                text(
                    f"INSERT INTO telegram_updates ({COLUMNS}) SELECT '{BOT}', {update_id}, "
                    f"'{BODY}', 'message', {queue_key}, 'pending', 0, {due_at}, {due_at}, 1 "
                    f"FROM ({series}) AS s"
                ),
                {"count": count},
            )
        await connection.execute(text("ANALYZE telegram_updates"))


async def claim_and_settle(store: SqlUpdateStore, spent: list[float]) -> None:
    started = time.perf_counter()
    batch = await store.claim_next_owned(
        now=NOW, lease_until=NOW + 60_000, max_attempts=8, limit=LIMIT, bots=[BOT]
    )
    spent.append((time.perf_counter() - started) * 1000)
    assert len(batch) == LIMIT, len(batch)
    assert all(c.queue_key != "hot" for c in batch)
    await store.settle_many_owned([(c.identity, Completed(NOW)) for c in batch])


def _p(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1]


async def main(*, quick: bool = False) -> str:
    blocked = 10_000 if quick else 100_000
    per_chat, samples = (8, 30) if quick else (40, SAMPLES)
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        for backend in ("postgresql", "sqlite"):
            stores: dict[str, SqlUpdateStore] = {}
            drops = []
            try:
                for case, backlog in (("free", 0), ("blocked", blocked)):
                    url, drop = await fresh_storage(backend, Path(directory))
                    drops.append(drop)
                    stores[case] = await open_store(url)
                    await fill(stores[case].engine, blocked=backlog, per_chat=per_chat)
                spent: dict[str, list[float]] = {case: [] for case in stores}
                for _ in range(3):  # warm: caches, prepared statements
                    for store in stores.values():
                        await claim_and_settle(store, [])
                for _ in range(samples):
                    for case, store in stores.items():
                        await claim_and_settle(store, spent[case])
            finally:
                for store in stores.values():
                    await store.close()
                for drop in drops:
                    drop()
            free, hot = spent["free"], spent["blocked"]
            rows += [
                f"| {backend} | {CHATS} chats flowing | {_p(free, 50):.2f} | {_p(free, 99):.2f} "
                "| 1.00 |",
                f"| {backend} | the same beside one chat of {blocked:,} blocked rows | "
                f"{_p(hot, 50):.2f} | {_p(hot, 99):.2f} | {_p(hot, 50) / _p(free, 50):.2f} |",
            ]
    head = (
        f"Claims of {LIMIT} with chat ordering, one bot, {samples} each, alternating.\n\n"
        "| backend | table | p50 ms | p99 ms | p50 ratio |\n| --- | --- | --- | --- | --- |"
    )
    return head + "\n" + "\n".join(rows)
