"""Dispatch: updates settled per second, and intake-to-downstream latency, beside PgQueuer.

All on PostgreSQL, against one trivial downstream (an aiohttp process answering 200 at once):
- drain: N recorded updates over 500 chats, per-chat ordering, fencing and renewal on, drained
  by 1, 2 and 4 `telegram-intake worker` processes; the rate is updates settled per second,
  from the moment the rows are committed (workers already idle) to the last completed row.
  Each drain on an analysed table (ANALYZE after the rows are in, the clock started after it)
  and, for 1 and 2 workers, on the table as the intake leaves it (no manual ANALYZE), and
  with the attempt history off (`INTAKE_ATTEMPT_HISTORY=false`), its cost side by side.
- PgQueuer 1.6 (asyncpg, batch 10, 64 concurrent tasks, each job POSTed with aiohttp) drains
  the same bodies to the same downstream in one process, on the same database. It and one
  worker on the analysed table run ROUNDS times in turn, and the table gives their medians.
- latency: `telegram-intake serve` and one `worker` as separate processes; updates POSTed to
  the intake at 200/s; latency from each POST's start to its arrival at the downstream.
- tracing on (issue 35): one worker draining with every span exported over OTLP/HTTP to a
  collector of its own (bench/otlp_sink.py), in turn with the rounds above, and the latency
  path again with `serve` and the worker both exporting.
- encryption on (issue 47): one worker draining bodies sealed with AES-256-GCM under a key
  ring (queue keys digested), opening each, in turn with the rounds above.
- the forwarding client's ceiling (bench client) in the same run.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import aiohttp
import psycopg

from app.privacy.keyring import KeyRing, new_key_text, parse_index_key, parse_keys
from app.store import NewUpdate, open_store
from app.store.codec import PLAIN, Codec
from app.store.migrate import upgrade
from bench import client
from bench.child import free_port, process
from bench.downstream import command as downstream_command
from bench.fixtures import CHATS, SECRET, body, fresh_schema, serve, worker, worker_env
from bench.otlp_sink import command as sink_command
from bench.otlp_sink import exported_spans
from bench.store import POSTGRES_URL

ROUNDS = 3  # of PgQueuer and one worker in turn, for the headline ratio
# Encryption on: a fresh ring for the run, as the workers' environment and the loader's codec.
_KEYS, _INDEX = new_key_text("bench")
SEALING = {"INTAKE_ENCRYPTION_KEYS": _KEYS, "INTAKE_INDEX_KEY": _INDEX}
RING = KeyRing(parse_keys(_KEYS), parse_index_key(_INDEX))

PGQUEUER_WORKER = """
import asyncio, sys
import aiohttp, asyncpg, uvloop
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver

async def main(dsn, schema, url):
    connection = await asyncpg.connect(dsn, server_settings={"search_path": schema})
    pgq = PgQueuer(AsyncpgDriver(connection))
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64))

    @pgq.entrypoint("forward", concurrency_limit=64)
    async def forward(job):
        headers = {"content-type": "application/json", "x-update-id": str(job.id)}
        async with session.post(url, data=job.payload, headers=headers) as response:
            await response.read()

    print("ready", flush=True)
    await pgq.run(batch_size=10, max_concurrent_tasks=64)

uvloop.run(main(*sys.argv[1:]))  # as PgQueuer's own CLI runs it
"""


async def fetch(session: aiohttp.ClientSession, url: str) -> object:
    async with session.get(url) as response:
        return await response.json()


async def drain_ours(
    downstream: str,
    workers: int,
    count: int,
    *,
    analyzed: bool,
    history: bool = True,
    traces: str | None = None,
    sealed: bool = False,
) -> float:
    """Updates settled per second by `workers` worker processes. With `analyzed`, the table
    is analysed after the rows are in and the clock starts after that; without, the clock
    starts when they are in, and the planner has what the workers themselves gather (as on a
    table that the intake fills). `history`: the workers record every attempt (the default).
    `traces`: the workers export their spans to this OTLP/HTTP collector (tracing on).
    `sealed`: encryption on: the rows go in sealed, and the workers open them (issue 47)."""
    async with fresh_schema() as (url, _):
        upgrade(url)
        env = worker_env(
            url,
            downstream,
            INTAKE_POLL_INTERVAL_SECONDS="1",
            INTAKE_ATTEMPT_HISTORY="true" if history else "false",
            **_traced(traces),
            **(SEALING if sealed else {}),
        )
        # The default bot is named `default`.
        rows = [
            NewUpdate("default", n, body(n), 0, "message", f"chat:{1_000_000 + n % CHATS}")
            for n in range(1, count + 1)
        ]
        async with _workers(env, workers):
            store = await open_store(url, codec=Codec(RING) if sealed else PLAIN)
            try:
                for start in range(0, count, 5_000):
                    chunk = rows[start : start + 5_000]
                    await store.add_many(chunk)
                if analyzed:
                    await analyze(url, "telegram_updates")
                # The idle workers start on the first rows while the rest go in: what they
                # completed before the clock started is not counted.
                before = await _completed(url)
                started = time.perf_counter()
                done = await _wait_completed(url, count)
            finally:
                await store.close()
        return (done - before) / (time.perf_counter() - started)


@asynccontextmanager
async def _workers(env: dict[str, str], count: int) -> AsyncIterator[None]:
    async with AsyncExitStack() as stack:
        for _ in range(count):
            await stack.enter_async_context(worker(env))
        yield


async def analyze(url: str, table: str) -> None:
    """Statistics as a live table has them (autovacuum keeps them): a table bulk-loaded a
    moment ago and never analyzed can mislead the planner of either queue's claim."""
    libpq = url.replace("postgresql+psycopg://", "postgresql://")
    async with await psycopg.AsyncConnection.connect(libpq, autocommit=True) as connection:
        await connection.execute(f"ANALYZE {table}")


async def _completed(url: str) -> int:
    libpq = url.replace("postgresql+psycopg://", "postgresql://")
    async with await psycopg.AsyncConnection.connect(libpq, autocommit=True) as connection:
        cursor = await connection.execute(
            "SELECT count(*) FROM telegram_updates WHERE state = 'completed'"
        )
        row = await cursor.fetchone()
        assert row is not None
        return int(row[0])


async def _wait_completed(url: str, count: int) -> int:
    """Once no row is left to deliver, the rows completed. The poll counts the rows left, as
    PgQueuer's counts its queue: a count of the completed ones grows with the table, and at
    every 50 ms it took 3 ms of the server's time that the drain would have used."""
    libpq = url.replace("postgresql+psycopg://", "postgresql://")
    async with await psycopg.AsyncConnection.connect(libpq, autocommit=True) as connection:
        while True:
            cursor = await connection.execute(
                "SELECT count(*) FROM telegram_updates "
                "WHERE state IN ('pending', 'processing', 'failed')"
            )
            row = await cursor.fetchone()
            assert row is not None
            if row[0] == 0:
                done = await _completed(url)
                assert done == count, f"{done} of {count} completed"
                return done
            await asyncio.sleep(0.05)


async def drain_pgqueuer(downstream: str, count: int) -> float:
    """PgQueuer's jobs forwarded per second, one process."""
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    async with fresh_schema() as (_, schema):
        connection = await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": schema})
        try:
            queries = Queries(AsyncpgDriver(connection))
            await queries.install()
            payloads = [body(n).encode() for n in range(1, count + 1)]
            for start in range(0, count, 5_000):
                chunk = payloads[start : start + 5_000]
                await queries.enqueue(["forward"] * len(chunk), chunk, [0] * len(chunk))
            await connection.execute("ANALYZE pgqueuer")
            command = (
                sys.executable,
                "-c",
                PGQUEUER_WORKER,
                POSTGRES_URL,
                schema,
                f"{downstream}/hook",
            )
            async with aiohttp.ClientSession() as session:
                await session.post(f"{downstream}/reset")
                async with process(*command, ready="ready", label="PgQueuer worker"):
                    started = time.perf_counter()
                    while True:
                        if not await connection.fetchval("SELECT count(*) FROM pgqueuer"):
                            break
                        await asyncio.sleep(0.05)
                    elapsed = time.perf_counter() - started
        finally:
            await connection.close()
    return count / elapsed


Spans = dict[str, tuple[float, float]]


def _traced(traces: str | None) -> dict[str, str]:
    """The environment that turns tracing on, exporting to `traces`; none for None."""
    return {} if traces is None else {"OTEL_EXPORTER_OTLP_ENDPOINT": traces}


async def latency(downstream: str, rate: float, seconds: float, traces: str | None = None) -> Spans:
    """p50 and p99 (ms) through `serve` + `worker`: from the POST to its 200 (the intake's
    share), from the 200 to arrival at the downstream (the workers' share), and in all.
    `traces`: both export their spans there (tracing on)."""
    async with fresh_schema() as (url, _):
        upgrade(url)
        port = free_port()
        env = worker_env(url, downstream, INTAKE_PORT=str(port), **_traced(traces))
        async with serve(env), _workers(env, 1), aiohttp.ClientSession() as session:
            await session.post(f"{downstream}/reset")
            sent: dict[str, float] = {}
            answered: dict[str, float] = {}
            total = int(rate * seconds)
            start = time.perf_counter() + 0.1
            headers = {
                "x-telegram-bot-api-secret-token": SECRET,
                "content-type": "application/json",
            }

            async def post(n: int) -> None:
                sent[str(n)] = time.time()
                async with session.post(
                    f"http://127.0.0.1:{port}/telegram/default", data=body(n), headers=headers
                ) as response:
                    assert response.status == 200, response.status
                answered[str(n)] = time.time()

            posts = []
            for n in range(1, total + 1):
                delay = start + n / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                posts.append(asyncio.create_task(post(n)))
            await asyncio.gather(*posts)
            async with asyncio.timeout(30):
                while True:
                    if (await fetch(session, f"{downstream}/count"))["count"] >= total:  # type: ignore[index]
                        break
                    await asyncio.sleep(0.05)
            arrived = await fetch(session, f"{downstream}/times")
        assert isinstance(arrived, dict)
        return {
            "POST to 200 (intake)": _p50_p99([answered[n] - sent[n] for n in sent]),
            "200 to arrival (workers)": _p50_p99([arrived[n] - answered[n] for n in sent]),
            "POST to arrival": _p50_p99([arrived[n] - sent[n] for n in sent]),
        }


def _p50_p99(seconds: list[float]) -> tuple[float, float]:
    quantiles = statistics.quantiles([s * 1000 for s in seconds], n=100)
    return quantiles[49], quantiles[98]


async def main(*, quick: bool = False) -> str:
    count = 2_000 if quick else 20_000
    port = free_port()
    downstream = f"http://127.0.0.1:{port}"
    server = process(*downstream_command(port), ready="ready", label="downstream")
    sink_port = free_port()
    sink = f"http://127.0.0.1:{sink_port}"
    collector = process(*sink_command(sink_port), ready="ready", label="OTLP sink")
    lines: list[str] = []
    async with server, collector:
        # The headline, one worker against PgQueuer: ROUNDS of each in turn, medians, as the
        # machine's pace drifts over minutes (PgQueuer alone moved 1,700 to 2,200 in an hour).
        # One worker with tracing on takes its turn too (issue 35).
        peers: list[float] = []
        singles: list[float] = []
        traced: list[float] = []
        sealed: list[float] = []
        spans: list[int] = []
        for round_ in range(1 if quick else ROUNDS):
            print(f"bench dispatch: PgQueuer, round {round_ + 1}", file=sys.stderr)
            peers.append(await drain_pgqueuer(downstream, count))
            print(f"bench dispatch: 1 worker process, round {round_ + 1}", file=sys.stderr)
            singles.append(await drain_ours(downstream, 1, count, analyzed=True))
            print(f"bench dispatch: 1 worker, tracing on, round {round_ + 1}", file=sys.stderr)
            traced.append(await drain_ours(downstream, 1, count, analyzed=True, traces=sink))
            spans.append(await exported_spans(sink))
            print(f"bench dispatch: 1 worker, encryption on, round {round_ + 1}", file=sys.stderr)
            sealed.append(await drain_ours(downstream, 1, count, analyzed=True, sealed=True))
        peer = statistics.median(peers)
        ours: dict[tuple[int, bool], float] = {(1, True): statistics.median(singles)}
        unrecorded: dict[int, float] = {}  # analysed, attempt history off
        for workers, analyzed in ((1, True), (1, False), (2, True), (2, False), (4, True)):
            print(f"bench dispatch: {workers} worker process(es)", file=sys.stderr)
            if (workers, analyzed) not in ours:
                ours[workers, analyzed] = await drain_ours(
                    downstream, workers, count, analyzed=analyzed
                )
            if analyzed and workers <= 2:
                print(f"bench dispatch: {workers}, attempt history off", file=sys.stderr)
                unrecorded[workers] = await drain_ours(
                    downstream, workers, count, analyzed=True, history=False
                )
        print("bench dispatch: latency at 200/s", file=sys.stderr)
        seconds = 5 if quick else 20
        latencies = await latency(downstream, 200, seconds)
        print("bench dispatch: latency at 200/s, tracing on", file=sys.stderr)
        latencies_traced = await latency(downstream, 200, seconds, traces=sink)
        spans_traced = await exported_spans(sink)
    # One worker's ratio: the median of the rounds' own (each from the same minutes).
    ratios = [mine / theirs for mine, theirs in zip(singles, peers, strict=True)]
    headline = statistics.median(ratios)
    rounds = ", ".join(
        f"{mine:,.0f} / {theirs:,.0f} = {ratio:.2f}"
        for mine, theirs, ratio in zip(singles, peers, ratios, strict=True)
    )
    lines += [
        f"Drain of {count:,} updates over {CHATS} chats to a trivial downstream, PostgreSQL. "
        f"PgQueuer and one worker on the analysed table: medians of {len(peers)} rounds in "
        f"turn (one worker / PgQueuer: {rounds}), and one worker's x PgQueuer the median of "
        "those ratios; the other rows are one drain each, against PgQueuer's median.",
        "",
        "| dispatcher | processes | table | updates/s | x PgQueuer | x analysed |",
        "| --- | --- | --- | --- | --- | --- |",
        "| PgQueuer 1.6 (asyncpg, batch 10, 64 tasks, aiohttp; not fenced) | 1 | analysed | "
        f"{peer:,.0f} | 1.00 | |",
    ]
    for (workers, analyzed), rate in ours.items():
        table = "analysed" if analyzed else "as the intake leaves it (no ANALYZE)"
        versus = f"{rate / ours[workers, True]:.2f}"
        ratio = headline if (workers, analyzed) == (1, True) else rate / peer
        lines.append(
            f"| telegram-intake worker (fenced, renewed, per-chat order) | {workers} | {table} "
            f"| {rate:,.0f} | {ratio:.2f} | {versus} |"
        )
    lines += [
        "",
        "Attempt history (every attempt's start and end, written by the claim and settle "
        "statements themselves) against none, analysed tables:",
        "",
        "| processes | history on, updates/s | history off, updates/s | on / off |",
        "| --- | --- | --- | --- |",
        *(
            f"| {workers} | {ours[workers, True]:,.0f} | {off:,.0f} | "
            f"{ours[workers, True] / off:.2f} |"
            for workers, off in unrecorded.items()
        ),
        "",
        "Tracing on (issue 35): one worker exporting every span over OTLP/HTTP to a "
        "collector of its own (bench/otlp_sink.py; the SDK's defaults), in turn with the "
        "rounds above; spans exported per update settled (4 expected: the attempt, its "
        "claim, its forward, its settle):",
        "",
        "| drain, 1 worker, analysed | tracing off, updates/s | tracing on, updates/s | on / off "
        "| spans per update |",
        "| --- | --- | --- | --- | --- |",
        f"| median of {len(traced)} rounds | {statistics.median(singles):,.0f} | "
        f"{statistics.median(traced):,.0f} | "
        f"{statistics.median(on / off for on, off in zip(traced, singles, strict=True)):.2f} | "
        f"{sum(spans) / (count * len(spans)):.2f} |",
        "",
        "Encryption on (issue 47, docs/privacy.md): the same drain with every body sealed "
        "(AES-256-GCM) and queue keys digested, the worker opening each, in turn with the "
        "rounds above (target: on / off at least 0.90):",
        "",
        "| drain, 1 worker, analysed | encryption off, updates/s | on, updates/s | on / off "
        "(median of rounds) |",
        "| --- | --- | --- | --- |",
        f"| median of {len(sealed)} rounds | {statistics.median(singles):,.0f} | "
        f"{statistics.median(sealed):,.0f} | "
        f"{statistics.median(on / off for on, off in zip(sealed, singles, strict=True)):.2f} |",
        "",
        f"Latency at 200 updates/s for {seconds} s, `serve` and one `worker` process, tracing "
        f"off and on (on: {spans_traced:,} spans exported for {int(200 * seconds):,} updates):",
        "",
        "| span | off p50 ms | off p99 ms | on p50 ms | on p99 ms |",
        "| --- | --- | --- | --- | --- |",
        *(
            f"| {name} | {p50:.1f} | {p99:.1f} | {latencies_traced[name][0]:.1f} | "
            f"{latencies_traced[name][1]:.1f} |"
            for name, (p50, p99) in latencies.items()
        ),
        "",
        "The forwarding client's ceiling, same machine, same run:",
        "",
        await client.main(quick=True),
    ]
    return "\n".join(lines)
