"""The console's pages on a table holding a million rows (issue 17: every page under 200 ms p95
on PostgreSQL).

The table is `bench search`'s: 1,000,000 rows of three bots over 5,000 chats, spread over the
last day (so the overview's last hour holds about 42,000 of them), most completed, with failed,
pending and exhausted ones among them. A real `serve` process answers; one client signs in and
fetches each page 40 times, one at a time, with fresh random values where a page takes any.
Beside them, in the same run: `/healthz` (the floor: the same server, no database) and the
sign-in page (a template, no database).
"""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from app.store import open_store
from app.store.migrate import upgrade
from bench import search
from bench.fixtures import fresh_schema, serve, worker_env

KEY = "bench-console.key-0123456789"
PORT = 18_477
CONFIG = """
[[api_keys]]
key = "{key}"
name = "bench"

{bots}
"""


def _config(directory: Path) -> Path:
    bots = "\n".join(
        f'[[bots]]\nname = "{bot}"\nsecret_token = "bench-secret_token"\n'
        f'downstream_url = "http://127.0.0.1:9/hook"\n'
        for bot in search.BOTS
    )
    path = directory / "intake.toml"
    path.write_text(CONFIG.format(key=KEY, bots=bots))
    return path


def _pages(rng: random.Random, count: int) -> dict[str, Callable[[], str]]:
    def bot() -> str:
        return rng.choice(search.BOTS)

    return {
        "/healthz (the floor: no database)": lambda: "/healthz",
        "sign-in page (a template, no database)": lambda: "/console/sign-in",
        "overview": lambda: "/console",
        "overview, its live part": lambda: "/console/overview.part",
        "bots": lambda: "/console/bots",
        "updates, every bot": lambda: "/console/updates",
        "updates, a bot's failed": lambda: f"/console/updates?bot={bot()}&state=failed",
        "updates, a bot's chat": lambda: (
            f"/console/updates?bot={bot()}&chat={rng.randrange(search.CHATS)}"
        ),
        "one update": lambda: f"/console/updates/shop/{rng.randrange(1, count // 3) * 3}",
        "exhaustions, every bot": lambda: "/console/exhaustions",
        "exhaustions, a bot's dry run": lambda: f"/console/exhaustions?bot={bot()}&preview=redrive",
        "audit log": lambda: "/console/audit",
    }


async def main(*, quick: bool = False) -> str:
    count = 20_000 if quick else 1_000_000
    runs = 10 if quick else 40
    rng = random.Random(17)  # noqa: S311 (reproducible page values, not secrets)
    results: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as directory:
        async with fresh_schema() as (url, _):
            upgrade(url)
            print(f"bench console: filling {count:,} rows", file=sys.stderr)
            store = await open_store(url)
            try:
                start = int(time.time() * 1000) - search.DAY_MS
                await search.fill(store, count, start=start)
            finally:
                await store.close()
            env = worker_env(
                url,
                "http://127.0.0.1:9",
                INTAKE_CONFIG=str(_config(Path(directory))),
                INTAKE_PORT=str(PORT),
                INTAKE_LOG_LEVEL="warning",
            )
            async with (
                serve(env),
                httpx.AsyncClient(base_url=f"http://127.0.0.1:{PORT}", timeout=30) as client,
            ):
                signed = await client.post("/console/sign-in", data={"key": KEY})
                assert signed.status_code == 303, signed.text
                for name, path in _pages(rng, count).items():
                    results[name] = await _timed(client, path, runs)
    floor = results["/healthz (the floor: no database)"][1]
    lines = [
        f"The console's pages over {count:,} rows (PostgreSQL, a `serve` process, one client, "
        f"{runs} fetches a page after two warm-up ones):",
        "",
        "| page | p50 ms | p95 ms | x /healthz p95 |",
        "| --- | --- | --- | --- |",
    ]
    for name, (p50, p95) in results.items():
        lines.append(f"| {name} | {p50:.1f} | {p95:.1f} | {p95 / floor:.0f} |")
    slowest = max(p95 for name, (_, p95) in results.items())
    verdict = "met" if slowest < 200 else "NOT met"
    lines += [
        "",
        f"Target: every page under 200 ms p95 on PostgreSQL: slowest {slowest:.0f} ms, {verdict}.",
    ]
    return "\n".join(lines)


async def _timed(
    client: httpx.AsyncClient, path: Callable[[], str], runs: int
) -> tuple[float, float]:
    for _ in range(2):
        answer = await client.get(path())
        assert answer.status_code == 200, (path(), answer.status_code, answer.text[:300])
    spans = []
    for _ in range(runs):
        chosen = path()
        started = time.perf_counter()
        answer = await client.get(chosen)
        spans.append((time.perf_counter() - started) * 1000)
        assert answer.status_code == 200, (chosen, answer.status_code)
    spans.sort()
    return statistics.median(spans), spans[int(len(spans) * 0.95) - 1]
