"""The callback API: how fast a downstream can ask `owns`, beside the same server's ceiling.

One `telegram-intake serve` process on PostgreSQL, one live claim; wrk (1 thread, 64
connections) repeats one request per measurement, each after a warm-up:
- `GET /healthz` answers without the database or a key: the ceiling of this server;
- `POST /v1/claims/owns` with a bearer key: validation, the key check, one indexed read;
- `POST /v1/claims/renew`: the same, with one indexed write and its commit.
Beside them, `SELECT telegram_intake_owns(...)` from one psycopg connection, the check a
downstream in the same database makes instead (one round trip, no HTTP).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time

import psycopg

from app.store import open_store
from app.store.migrate import upgrade
from bench.child import ROOT, free_port
from bench.fixtures import fresh_schema, serve, worker_env
from bench.intake import Load, generate
from bench.store import POSTGRES_URL

KEY = "bench-api-key.0123456789"
CONNECTIONS = 64


def _wrk(url: str, method: str, body: str, seconds: float) -> tuple[str, ...]:
    return (
        "wrk", "-t1", f"-c{CONNECTIONS}", f"-d{seconds}s", "--timeout", "10s",
        "-s", str(ROOT / "bench" / "api.lua"), url, "--", method, body, f"Bearer {KEY}",
    )  # fmt: skip


async def _measure(url: str, method: str, body: str, seconds: float, warm_up: float) -> Load:
    await generate(*_wrk(url, method, body, warm_up), first=0)
    return await generate(*_wrk(url, method, body, seconds), first=0)


def _sql_function_rate(dsn: str, identity: dict[str, object], seconds: float) -> float:
    with psycopg.connect(dsn, autocommit=True) as connection:
        arguments = (identity["bot"], identity["update_id"], identity["attempt"],
                     identity["claim_id"])  # fmt: skip
        count, deadline = 0, time.perf_counter() + seconds
        started = time.perf_counter()
        while time.perf_counter() < deadline:
            row = connection.execute(
                "SELECT telegram_intake_owns(%s, %s, %s, %s)", arguments
            ).fetchone()
            assert row == (True,)
            count += 1
        return count / (time.perf_counter() - started)


async def main(*, quick: bool = False) -> str:
    if shutil.which("wrk") is None:
        raise SystemExit("bench api needs wrk on PATH: apt-get install -y wrk")
    seconds, warm_up = (3, 1) if quick else (10, 3)
    async with fresh_schema() as (url, schema):
        upgrade(url)
        store = await open_store(url)
        try:
            await store.add("default", 1, '{"update_id": 1}', 0)
            now = time.time_ns() // 1_000_000
            claimed = await store.claim_owned(
                "default", 1, now=now, lease_until=now + 3_600_000, max_attempts=8
            )
        finally:
            await store.close()
        assert claimed is not None
        identity = {
            "bot": "default",
            "update_id": 1,
            "attempt": claimed.attempt,
            "claim_id": claimed.claim_id,
        }
        port = free_port()
        env = worker_env(url, "http://127.0.0.1:9", INTAKE_PORT=str(port), INTAKE_API_KEYS=KEY)
        base = f"http://127.0.0.1:{port}"
        loads: dict[str, Load] = {}
        async with serve(env):
            print("bench api: /healthz", file=sys.stderr)
            loads["GET /healthz (ceiling: no database, no key)"] = await _measure(
                f"{base}/healthz", "GET", "", seconds, warm_up
            )
            print("bench api: owns", file=sys.stderr)
            loads["POST /v1/claims/owns"] = await _measure(
                f"{base}/v1/claims/owns", "POST", json.dumps(identity), seconds, warm_up
            )
            print("bench api: renew", file=sys.stderr)
            renew = {**identity, "lease_ms": 3_600_000}
            loads["POST /v1/claims/renew (a write and its commit)"] = await _measure(
                f"{base}/v1/claims/renew", "POST", json.dumps(renew), seconds, warm_up
            )
        dsn = f"{POSTGRES_URL}?options=-csearch_path%3D{schema}"
        print("bench api: the SQL function", file=sys.stderr)
        function_rate = await asyncio.to_thread(_sql_function_rate, dsn, identity, seconds)
    for name, load in loads.items():
        if load.non2xx or load.socket_errors:
            raise RuntimeError(f"{name}: {load.non2xx} non-2xx, {load.socket_errors} errors")
    ceiling = loads["GET /healthz (ceiling: no database, no key)"].rate
    lines = [
        f"One `serve` process on PostgreSQL; wrk, 1 thread, {CONNECTIONS} connections, "
        f"{seconds} s after {warm_up} s of warm-up.",
        "",
        "| request | requests/s | p50 ms | p99 ms | x ceiling |",
        "| --- | --- | --- | --- | --- |",
        *(
            f"| {name} | {load.rate:,.0f} | {load.p50_ms:.1f} | {load.p99_ms:.1f} | "
            f"{load.rate / ceiling:.2f} |"
            for name, load in loads.items()
        ),
        f"| `SELECT telegram_intake_owns(...)`, one connection, one at a time | "
        f"{function_rate:,.0f} | | | |",
    ]
    return "\n".join(lines)
