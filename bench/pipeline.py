"""The whole path, as it runs in production: posts through `serve`, drained by `worker`
processes, to a downstream in its own process, on PostgreSQL; and the single-process `run`
(intake and workers in one process, the README's quick start) on SQLite and on PostgreSQL.

For 1 and 2 worker processes, and for each of two downstreams (an aiohttp process):
- `plain`: answers 200 at once;
- `owns`: first asks `POST /v1/claims/owns` of `serve` with the attempt's identity, as the
  README tells a downstream to, and answers 200 if owned (409 if not).
A client posts N updates over 500 chats to `serve` (64 at a time, as fast as it answers), as
Telegram would; the workers deliver while the posts arrive. Throughput is N over the time from
the first post to the last arrival; latency runs from each post's start to its arrival at the
downstream. Peak RSS is each process's own high-water mark (VmHWM), and CPU its user and
system time from the first post to the last arrival, per 1,000 updates (where the time
goes; start-up not counted). Beside them, in the same
run, `bench dispatch`'s drain: the same N rows recorded first, then drained by one worker.
The `run` rows take the plain downstream; their ratio is SQLite's rate over PostgreSQL's.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import aiohttp

from app.store.migrate import upgrade
from bench.child import Child, free_port, process
from bench.dispatch import drain_ours
from bench.downstream import command as downstream_command
from bench.fixtures import CHATS, SECRET, body, fresh_schema, serve, start_path, worker_env

KEY = "bench-pipeline-key.0123456789"
CONCURRENCY = 64


class Case:
    """`workers` worker processes behind one `serve` on PostgreSQL; or, with `backend`, one
    `run` process (workers 0) on that backend."""

    def __init__(self, workers: int, downstream: str, backend: str | None = None) -> None:
        self.workers = workers
        self.downstream = downstream
        self.backend = backend
        self.rate = 0.0
        self.p50 = self.p99 = 0.0
        self.peaks: dict[str, float] = {}
        self.cpu: dict[str, float] = {}  # CPU seconds per 1,000 updates, by process


@asynccontextmanager
async def database(backend: str | None) -> AsyncIterator[str]:
    """A fresh database URL: a new PostgreSQL schema, migrated; or a new SQLite file in a
    temporary directory, which `run` migrates itself."""
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as directory:
            yield f"sqlite:///{directory}/intake.db"
        return
    async with fresh_schema() as (url, _):
        upgrade(url)
        yield url


async def run_case(case: Case, count: int) -> None:
    async with database(case.backend) as url, AsyncExitStack() as stack:
        port, hook_port = free_port(), free_port()
        intake = f"http://127.0.0.1:{port}"
        downstream = f"http://127.0.0.1:{hook_port}"
        env = worker_env(url, downstream, INTAKE_PORT=str(port), INTAKE_API_KEYS=KEY)
        command = downstream_command(
            hook_port, owns=(intake, KEY) if case.downstream == "owns" else None
        )
        children: dict[str, Child]
        if case.backend is None:
            children = await start_path(stack, env, command, case.workers)
        else:
            children = {
                "downstream": await stack.enter_async_context(process(*command, ready="ready")),
                "run": await stack.enter_async_context(serve(env, "run")),
            }
        started = {name: child.cpu_seconds() for name, child in children.items()}
        sent, first = await _post_all(intake, count)
        arrived = await _wait_arrived(downstream, count)
        case.peaks = {name: child.peak_rss_mib() for name, child in children.items()}
        case.cpu = {
            name: (child.cpu_seconds() - started[name]) * 1000 / count
            for name, child in children.items()
        }
    last = max(arrived.values())
    case.rate = count / (last - first)
    spans = statistics.quantiles([(arrived[n] - sent[n]) * 1000 for n in sent], n=100)
    case.p50, case.p99 = spans[49], spans[98]


async def _post_all(intake: str, count: int) -> tuple[dict[str, float], float]:
    """POST every update to `serve`, CONCURRENCY at a time; each one's start, and the first."""
    sent: dict[str, float] = {}
    headers = {"x-telegram-bot-api-secret-token": SECRET, "content-type": "application/json"}
    numbers = iter(range(1, count + 1))
    first = time.time()
    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def poster() -> None:
            for n in numbers:
                sent[str(n)] = time.time()
                async with session.post(
                    f"{intake}/telegram/default", data=body(n), headers=headers
                ) as answer:
                    assert answer.status == 200, answer.status

        await asyncio.gather(*(poster() for _ in range(CONCURRENCY)))
    return sent, first


async def _wait_arrived(downstream: str, count: int) -> dict[str, float]:
    async with aiohttp.ClientSession() as session, asyncio.timeout(600):
        while True:
            async with session.get(f"{downstream}/count") as answer:
                if (await answer.json())["count"] >= count:
                    break
            await asyncio.sleep(0.1)
        async with session.get(f"{downstream}/times") as answer:
            times: dict[str, float] = await answer.json()
            return times


async def main(*, quick: bool = False) -> str:
    count = 2_000 if quick else 20_000
    cases = [Case(w, d) for w in (1, 2) for d in ("plain", "owns")]
    singles = [Case(0, "plain", backend) for backend in ("sqlite", "postgresql")]
    for case in cases:
        print(f"bench pipeline: {case.workers} worker(s), {case.downstream}", file=sys.stderr)
        await run_case(case, count)
    for case in singles:
        print(f"bench pipeline: one run process on {case.backend}", file=sys.stderr)
        await run_case(case, count)
    print("bench pipeline: bench dispatch's drain", file=sys.stderr)
    hook_port = free_port()
    async with process(*downstream_command(hook_port), ready="ready"):
        drain = await drain_ours(f"http://127.0.0.1:{hook_port}", 1, count, analyzed=False)
    plain_rate = {c.workers: c.rate for c in cases if c.downstream == "plain"}
    rows = [_row(case, str(case.workers), case.rate / plain_rate[case.workers]) for case in cases]
    postgres_rate = singles[-1].rate
    run_rows = [_row(case, str(case.backend), case.rate / postgres_rate) for case in singles]
    return "\n".join(
        [
            f"{count:,} updates over {CHATS} chats posted through `serve` ({CONCURRENCY} at a "
            "time) and delivered by `worker` processes to a downstream process, PostgreSQL.",
            "",
            "| workers | downstream | updates/s | x plain | POST to arrival p50 ms | p99 ms "
            "| peak RSS MiB | CPU s per 1,000 updates |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
            *rows,
            "",
            f"The same {count:,} updates posted to one `run` process (intake and workers in "
            "one process), delivered to the plain downstream, on each backend (SQLite: a new "
            "file in WAL mode, `synchronous=FULL`):",
            "",
            "| backend | downstream | updates/s | x PostgreSQL | POST to arrival p50 ms "
            "| p99 ms | peak RSS MiB | CPU s per 1,000 updates |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
            *run_rows,
            "",
            f"`bench dispatch`'s drain in the same run (the rows recorded first, one worker, "
            f"the plain downstream, no manual ANALYZE): {drain:,.0f} updates/s.",
        ]
    )


def _row(case: Case, first: str, ratio: float) -> str:
    peaks = ", ".join(f"{name} {mib:.0f}" for name, mib in case.peaks.items())
    cpu = ", ".join(f"{name} {seconds:.2f}" for name, seconds in case.cpu.items())
    return (
        f"| {first} | {case.downstream} | {case.rate:,.0f} | {ratio:.2f} | {case.p50:.1f} "
        f"| {case.p99:.1f} | {peaks} | {cpu} |"
    )
