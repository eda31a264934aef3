"""Cost at a steady rate, alone: `bench pipeline`'s steady case beside its burst with the same
worker and downstream (one worker process, the plain one), without the pipeline's other cases.

N updates (20,000) posted through `serve` in a burst, 64 at a time, then N / 2 at a paced 500
updates/s, each delivered by the `worker` process to the downstream process, on PostgreSQL.
For each: POST-to-arrival p50 and p99 (the paced one from each update's due time), and the CPU
seconds per 1,000 updates of each process and of the whole PostgreSQL cluster over the same
window; then issue 33's verdict: paced CPU per update at most 1.5x the burst's, p50 <= 4 ms.
How each is measured is `bench pipeline`'s (its module docstring).

Beside them, the floor of this machine: what one round trip to PostgreSQL costs when it is
paced against when it is not. One psycopg connection runs a trivial prepared statement
(`SELECT $1::int`) ROUND_TRIPS times back to back, then as many times at 500 a second (an
`asyncio.sleep` of 2 ms after each); the CPU of this process and of the connection's server
process, per round trip. The paced figure holds what each wake-up from idle costs (the timer,
the event loop's return from `epoll_wait`, the server's from its socket wait): what a
pipeline that no longer batches pays at every hop, several times per update.
"""

from __future__ import annotations

import asyncio
import resource
import sys

import psycopg

from bench.child import Child
from bench.pipeline import PACE, Case, comparison, run_case
from bench.store import POSTGRES_URL

ROUND_TRIPS = 2_000


async def main(*, quick: bool = False) -> str:
    count = 2_000 if quick else 20_000
    burst, paced = Case(1, "plain"), Case(1, "plain", pace=PACE)
    print(f"bench steady: a burst of {count:,}", file=sys.stderr)
    await run_case(burst, count)
    print(f"bench steady: {count // 2:,} at {PACE:.0f} updates/s", file=sys.stderr)
    await run_case(paced, count // 2)
    print("bench steady: one round trip, back to back and paced", file=sys.stderr)
    together, apart = await round_trip_cpu(0.0), await round_trip_cpu(1 / PACE)
    return "\n".join(
        [
            *comparison(burst, paced),
            "",
            f"The floor, one psycopg round trip (`SELECT $1::int`, prepared), {ROUND_TRIPS:,} "
            "times, microseconds of CPU each:",
            "",
            "| sent | client | server | both |",
            "| --- | --- | --- | --- |",
            _floor_row("back to back", together),
            _floor_row(f"paced, {PACE:.0f}/s", apart),
            "",
            f"A paced round trip costs {sum(apart) / sum(together):.2f}x one sent back to back.",
        ]
    )


async def round_trip_cpu(pause: float) -> tuple[float, float]:
    """CPU seconds per round trip, (this process, the server's process), ROUND_TRIPS sent
    with `pause` seconds after each."""
    async with await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True) as connection:
        cursor = await connection.execute("SELECT pg_backend_pid()")
        row = await cursor.fetchone()
        assert row is not None
        server = Child("", int(row[0]))
        for n in range(10):  # prepared from here on
            await connection.execute("SELECT %s::int", (n,), prepare=True)
        client_before, server_before = _own_cpu_seconds(), server.cpu_seconds()
        for n in range(ROUND_TRIPS):
            await connection.execute("SELECT %s::int", (n,), prepare=True)
            if pause:
                await asyncio.sleep(pause)
        client = _own_cpu_seconds() - client_before
        return client / ROUND_TRIPS, (server.cpu_seconds() - server_before) / ROUND_TRIPS


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _floor_row(sent: str, cpu: tuple[float, float]) -> str:
    client, server = (seconds * 1e6 for seconds in cpu)
    return f"| {sent} | {client:.0f} | {server:.0f} | {client + server:.0f} |"
