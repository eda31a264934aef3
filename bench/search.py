"""Search: operators' `search_updates` on a table holding a million rows, both backends.

The table: 1,000,000 rows of three bots over 5,000 chats, spread over a day, most of them
completed, with failed, pending and exhausted ones among them, and four update types of very
different frequency (message 80%, callback_query 15%, edited_message 4.9%, my_chat_member
0.1%). Each filter of docs/contract.md section 9 is searched 60 times with fresh random values (a
chat, an hour of the day, a page deep in the results by cursor), through the store as the API calls
it; p50 and p95 per filter, beside the floor of the same run: `get_update`, one primary-key
read. The target (issue 16): every indexed filter under 100 ms p95 on PostgreSQL; `contains`
reads at most 1,000 rows per page, bounded by the others.
"""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from sqlalchemy import text

from app.store import SqlUpdateStore, UpdateFilter, open_store
from bench.store import fresh_storage

BOTS = ("shop", "news", "alerts")
CHATS = 5_000
DAY_MS = 86_400_000
START = 1_900_000_000_000  # epoch ms of the day's first update
TYPES = (  # (type, share in ten thousand)
    ("message", 8_000),
    ("callback_query", 1_500),
    ("edited_message", 490),
    ("my_chat_member", 10),
)

_SERIES = {
    "postgresql": "SELECT g AS n FROM generate_series(1, :count) AS g",
    "sqlite": (
        "WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < :count) "
        "SELECT n FROM s"
    ),
}


def _type_of() -> str:
    """SQL: the update type of row n, by the shares above."""
    cases, edge = [], 0
    for name, share in TYPES[:-1]:
        edge += share
        cases.append(f"WHEN n % 10000 < {edge} THEN '{name}'")
    return f"CASE {' '.join(cases)} ELSE '{TYPES[-1][0]}' END"


def _state_of() -> str:
    """SQL: 97% completed, 1% failed, 1% pending, 1% exhausted (abandoned)."""
    return (
        "CASE WHEN n % 100 = 1 THEN 'failed' WHEN n % 100 = 2 THEN 'pending' "
        "WHEN n % 100 = 3 THEN 'abandoned' ELSE 'completed' END"
    )


async def fill(store: SqlUpdateStore, count: int, start: int = START) -> None:
    """`count` rows over the day from `start`, generated in the database."""
    dialect = store.dialect
    received = f"{start} + (n * {DAY_MS // count})"
    state = _state_of()
    statement = text(
        f"INSERT INTO {store.table.name} (bot, update_id, body, update_type, queue_key, state, "
        "attempts, due_at, received_at, settled_at, error, claim_id, exhausted_at, "
        "acknowledged_at, queue_rule) "
        f"SELECT CASE n % 3 WHEN 0 THEN 'shop' WHEN 1 THEN 'news' ELSE 'alerts' END, n, "
        '\'{"update_id": \' || n || \', "message": {"chat": {"id": \' || (n % '
        f"{CHATS}) || '}}, \"text\": \"order ' || n || '\"}}}}', "
        f"{_type_of()}, CAST(n % {CHATS} AS TEXT), {state}, "
        f"CASE WHEN {state} = 'pending' THEN 0 ELSE 1 END, {received}, {received}, "
        f"CASE WHEN {state} = 'completed' THEN {received} END, "
        f"CASE WHEN {state} IN ('failed', 'abandoned') THEN 'HTTP 500' END, "
        f"CASE WHEN {state} = 'pending' THEN NULL ELSE 'c' || n END, "
        f"CASE WHEN {state} = 'abandoned' THEN {received} END, NULL, 1 "
        f"FROM ({_SERIES[dialect]}) AS s"
    )
    async with store.engine.begin() as connection:
        await connection.execute(statement, {"count": count})
        await connection.execute(text(f"ANALYZE {store.table.name}"))


async def _timed(runs: int, call: Callable[[], Awaitable[object]]) -> tuple[float, float]:
    """p50 and p95 in ms of `runs` calls (after two warm-up calls)."""
    for _ in range(2):
        await call()
    spans = []
    for _ in range(runs):
        started = time.perf_counter()
        await call()
        spans.append((time.perf_counter() - started) * 1000)
    spans.sort()
    return statistics.median(spans), spans[int(len(spans) * 0.95) - 1]


def _searches(
    store: SqlUpdateStore, rng: random.Random
) -> dict[str, Callable[[], Awaitable[object]]]:
    def search(**criteria: object) -> Callable[[], Awaitable[object]]:
        async def call() -> object:
            fields = {
                name: value() if callable(value) else value for name, value in criteria.items()
            }
            bots = fields.pop("bots", BOTS)
            chosen = UpdateFilter(bots=bots, **fields)  # type: ignore[arg-type]
            return await store.search_updates(chosen, limit=50)

        return call

    def hour() -> int:
        return START + rng.randrange(23) * 3_600_000

    async def deep() -> object:  # the fifth page of one bot's newest
        chosen = UpdateFilter(bots=(rng.choice(BOTS),))
        cursor = None
        for _ in range(5):
            page = await store.search_updates(chosen, after=cursor, limit=50)
            cursor = page.next
        return cursor

    async def floor() -> object:
        return await store.get_update(rng.choice(BOTS), rng.randrange(1, 1_000_000))

    return {
        "get_update (the floor: one primary-key read)": floor,
        "every bot, newest 50": search(),
        "bot": search(bots=lambda: (rng.choice(BOTS),)),
        "bot, fifth page by cursor": deep,
        "bot + state failed": search(bots=lambda: (rng.choice(BOTS),), state="failed"),
        "bot + state completed": search(bots=lambda: (rng.choice(BOTS),), state="completed"),
        "every bot + state abandoned": search(state="abandoned"),
        "bot + chat": search(
            bots=lambda: (rng.choice(BOTS),), chat=lambda: str(rng.randrange(CHATS))
        ),
        "bot + type my_chat_member (0.1%)": search(
            bots=lambda: (rng.choice(BOTS),), update_type="my_chat_member"
        ),
        "every bot + type edited_message": search(update_type="edited_message"),
        "bot + an hour's window": search(
            bots=lambda: (rng.choice(BOTS),),
            received_after=hour,
            received_before=lambda: hour() + 3_600_000,
        ),
        "bot + chat + window + contains": search(
            bots=lambda: (rng.choice(BOTS),),
            chat=lambda: str(rng.randrange(CHATS)),
            received_after=START,
            received_before=START + DAY_MS,
            contains="order 1",
        ),
        "every bot + contains (1,000 rows a page)": search(contains="order 77"),
    }


async def main(*, quick: bool = False) -> str:
    count = 20_000 if quick else 1_000_000
    runs = 10 if quick else 60
    rng = random.Random(256)  # noqa: S311 (reproducible search values, not secrets)
    results: dict[str, dict[str, tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as directory:
        for backend in ("postgresql", "sqlite"):
            print(f"bench search: filling {count:,} rows on {backend}", file=sys.stderr)
            url, drop = await fresh_storage(backend, Path(directory))
            store = await open_store(url)
            try:
                await fill(store, count)
                for name, call in _searches(store, rng).items():
                    results.setdefault(name, {})[backend] = await _timed(runs, call)
            finally:
                await store.close()
                drop()
    floor = results["get_update (the floor: one primary-key read)"]
    lines = [
        f"`search_updates` on {count:,} rows ({len(BOTS)} bots, {CHATS:,} chats, a day), "
        f"{runs} searches per filter with random values, 50 rows a page:",
        "",
        "| filter | PostgreSQL p50 ms | p95 ms | x floor | SQLite p50 ms | p95 ms |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, by in results.items():
        pg, lite = by["postgresql"], by["sqlite"]
        lines.append(
            f"| {name} | {pg[0]:.1f} | {pg[1]:.1f} | {pg[1] / floor['postgresql'][1]:.0f} | "
            f"{lite[0]:.1f} | {lite[1]:.1f} |"
        )
    lines += ["", "Target: every filter under 100 ms p95 on PostgreSQL."]
    return "\n".join(lines)
