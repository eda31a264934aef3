"""What revision 0006 (Telegram's queues) costs: the trigger, and the upgrade's re-keying.

For each backend, 20,000 realistic updates of every type of `app.queues.QUEUES` (ids over
2,000 users and chats), inserted in batches of 100 as the intake's group commit does:
- as this release records them (`queue_rule` set: the trigger's WHEN is false), the baseline;
- as the release before 0006 records them (no `queue_rule`): the trigger keys each row in
  the database. This is what an old `serve` pays while old and new processes run side by side.
Then `alembic upgrade 0005 -> 0006` over a table of 20,000 open rows recorded by the old
release, beside the same upgrade of an empty table: how long the upgrade holds the table.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import insert

from app.queues import QUEUES
from app.store.engine import create_sync_engine
from app.store.migrate import downgrade, upgrade
from app.store.schema import DEFAULT_TABLE, QUEUE_RULE, make_table
from bench.store import fresh_storage

ROWS = 20_000
BATCH = 100
ROUNDS = 3


def _updates(count: int, seed: int = 30) -> list[dict[str, Any]]:
    """Rows as the intake records them, of every update type, ids shared across types."""
    rng = random.Random(seed)  # noqa: S311 - ids for a benchmark
    names = list(QUEUES)
    rows = []
    for update_id in range(1, count + 1):
        update_type = names[update_id % len(names)]
        queue = QUEUES[update_type]
        value: object = rng.randint(1, 2_000) if queue.category is not None else str(update_id)
        payload: dict[str, Any] = {"text": "x" * 120}
        holder = payload
        for field in queue.path[:-1]:
            holder = holder.setdefault(field, {"first_name": "Anna"})
        holder[queue.path[-1]] = value
        body = json.dumps({"update_id": update_id, update_type: payload})
        rows.append(
            {
                "bot": "shop",
                "update_id": update_id,
                "body": body,
                "update_type": update_type,
                "queue_key": "kept" if queue.category is not None else None,
                "state": "pending",
                "attempts": 0,
                "due_at": update_id,
                "received_at": update_id,
            }
        )
    return rows


def _insert_all(url: str, rows: list[dict[str, Any]], *, old_release: bool) -> float:
    """Seconds to insert `rows` in batches of BATCH, one transaction each."""
    table = make_table(DEFAULT_TABLE, "0005" if old_release else "0006")
    if not old_release:
        rows = [row | {"queue_rule": QUEUE_RULE} for row in rows]
    engine = create_sync_engine(url)
    try:
        started = time.perf_counter()
        for start in range(0, len(rows), BATCH):
            with engine.begin() as connection:
                connection.execute(insert(table), rows[start : start + BATCH])
        return time.perf_counter() - started
    finally:
        engine.dispose()


async def _storage(backend: str, directory: Path, revision: str = "head") -> tuple[str, Any]:
    url, drop = await fresh_storage(backend, directory)
    if revision != "head":
        downgrade(url, revision)
    return url, drop


async def main(quick: bool = False) -> str:
    count = 2_000 if quick else ROWS
    rows = _updates(count)
    lines = [
        "| backend | inserts/s, this release (queue_rule set) | inserts/s, the release before "
        "0006 (trigger keys each row) | x | upgrade to 0006, empty table, ms | upgrade to 0006, "
        f"{count:,} open rows, ms | ms per 10,000 rows re-keyed |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        for backend in ("postgresql", "sqlite"):
            new: list[float] = []
            old: list[float] = []
            for _ in range(ROUNDS):  # interleaved, so a slow minute hits both
                for old_release, into in ((False, new), (True, old)):
                    url, drop = await _storage(backend, directory)
                    into.append(count / _insert_all(url, rows, old_release=old_release))
                    drop()
            empty_ms: list[float] = []
            full_ms: list[float] = []
            for _ in range(ROUNDS):
                for filled, into in ((False, empty_ms), (True, full_ms)):
                    url, drop = await _storage(backend, directory, "0005")
                    if filled:
                        _insert_all(url, rows, old_release=True)
                    started = time.perf_counter()
                    upgrade(url, "0006")
                    into.append((time.perf_counter() - started) * 1000)
                    drop()
            fresh, trigger = statistics.median(new), statistics.median(old)
            empty, full = statistics.median(empty_ms), statistics.median(full_ms)
            per = (full - empty) / count * 10_000
            lines.append(
                f"| {backend} | {fresh:,.0f} | {trigger:,.0f} | {trigger / fresh:.2f} | "
                f"{empty:,.0f} | {full:,.0f} | {per:,.0f} |"
            )
    lines.append("")
    lines.append(
        f"Medians of {ROUNDS} interleaved rounds; {count:,} rows of the {len(QUEUES)} update "
        f"types, ~200-byte bodies, batches of {BATCH} rows per transaction; x = the old "
        "release's inserts/s over this release's."
    )
    return "\n".join(lines)


if __name__ == "__main__":
    print(asyncio.run(main()))
