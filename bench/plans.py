"""Query plans of every store statement with a million settled rows retained, both backends.

The same statements and plan reader as tests/store/test_query_plans.py, which asserts that none
of them scans the table; this prints them for docs/store.md.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from app.store import open_store
from bench.store import fresh_storage
from tests.store.big_table import Shape, fill
from tests.store.test_query_plans import explain, statements


async def main(*, quick: bool = False) -> str:
    plans: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory() as directory:
        for backend in ("postgresql", "sqlite"):
            url, drop = await fresh_storage(backend, Path(directory))
            store = await open_store(url)
            try:
                await fill(store.engine, Shape(retained=10_000 if quick else 1_000_000))
                async with store.engine.connect() as connection:
                    for name, statement in statements(store).items():
                        plan = await explain(connection, store, statement)
                        plans.setdefault(name, {})[backend] = "<br>".join(plan)
            finally:
                await store.close()
                drop()
    # A statement one backend alone runs (its own insert, say) has no plan on the other.
    rows = [
        f"| `{name}` | {p.get('postgresql', '-')} | {p.get('sqlite', '-')} |"
        for name, p in plans.items()
    ]
    head = "| statement | PostgreSQL | SQLite |\n| --- | --- | --- |"
    return head + "\n" + "\n".join(rows)
