"""The durable intake beside a bare ASGI server, its own no-store ceiling and aiogram's webhook
handler (issues 3 and 33).

Every server runs in its own process (bench/intake_servers.py) and so does the load: wrk, one
thread, with bench/intake.lua sending distinct ~250-byte message updates, at 16 then at 64
connections, each measurement after a short warm-up. The servers take turns, round after round
(three by default), so a slow minute of the machine falls on all of them; each cell is the
median of its rounds. The durable intake runs on fresh storage (a new PostgreSQL schema,
dropped afterwards; a temporary SQLite file), the same across rounds.

- bare: one ASGI callable on plain uvicorn doing the intake's checks (bot, secret in constant
  time, `json.loads`, an integer `update_id`) and storing nothing: what the server itself can
  answer, the limit. Column "x bare" divides requests/s by its rate at the same connections.
- the ceiling: the product's app and route with a committer that answers at once and stores
  nothing: what durability costs. Column "x ceiling".
- aiogram: `SimpleRequestHandler` in background mode: it answers before the update is
  handled, and stores nothing.
- tracing on (issue 35): the durable intake on PostgreSQL and the ceiling again, each exporting
  a span per request over OTLP/HTTP (the SDK's defaults: batches of 512 from a queue of 2048)
  to a collector of its own, bench/otlp_sink.py, which decodes and counts the spans only once
  the server has stopped; and the intake with 1 trace in 10 sampled
  (`OTEL_TRACES_SAMPLER=parentbased_traceidratio`). The rows without are tracing off, as the
  product runs by default.
- encryption on (issue 47, docs/privacy.md): the durable intake on PostgreSQL and on SQLite
  with a key ring (bodies sealed with AES-256-GCM, queue keys and subjects digested), each beside
  itself without one; the target: on costs at most 10 %.
- the durable intake on PostgreSQL served by granian rather than uvicorn: issue 33 asks
  whether another ASGI server serves the product better (it could not keep the connection
  limits of `app.http.server`; bench/intake_servers.py says which).

Then the PostgreSQL intake runs at a fixed rate of half its 64-connection rate, 64 connections
(bench/paced.py: latency counted from the intended send time), and the ceiling at the same rate
as the control. Issue 33's targets: the intake on PostgreSQL and on SQLite at least 0.5x the
bare server at 64 connections, with p99 at most 25 ms there; issue 3's: p99 at most 25 ms at
half the 64-connection rate.

After each durable run, SQL counts the rows in each measurement's update_id range: every update
answered 200 must be there ("LOST" otherwise), and no more than were sent ("EXTRA").
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import text

from app.privacy.keyring import new_key_text
from app.store.engine import create_sync_engine
from app.store.schema import DEFAULT_TABLE
from bench.child import free_port, process
from bench.intake_servers import BOT, HOST, SECRET
from bench.otlp_sink import command as sink_command
from bench.otlp_sink import exported_spans
from bench.store import fresh_storage

ROOT = Path(__file__).resolve().parents[1]
# Formatted with (update_id, n, user, chat, n), here and in bench/intake.lua.
TEMPLATE = (
    '{"update_id":%d,"message":{"message_id":%d,"from":{"id":%d,"is_bot":false,'
    '"first_name":"Ada","language_code":"en"},"chat":{"id":%d,"first_name":"Ada",'
    '"type":"private"},"date":1767225600,"text":"order %d: two espressos, oat milk"}}'
)
SPAN = 10**10  # update_ids per measurement, so that each one's rows can be counted apart
CONNECTIONS = (16, 64)
PACED = "paced"
POSTGRES = "durable intake, PostgreSQL"
GRANIAN = "durable intake, PostgreSQL, on granian"
SQLITE = "durable intake, SQLite"
CEILING = "no-store ceiling (same app and route)"
BARE = "bare ASGI on uvicorn, the same checks, stores nothing"
POSTGRES_TRACED = "durable intake, PostgreSQL, tracing on"
POSTGRES_SAMPLED = "durable intake, PostgreSQL, tracing on, 1 in 10 sampled"
CEILING_TRACED = "no-store ceiling, tracing on"
POSTGRES_SEALED = "durable intake, PostgreSQL, encryption on"
SQLITE_SEALED = "durable intake, SQLite, encryption on"
SERVERS = (  # label, server kind, storage backend; PostgreSQL first: it sets the fixed rate
    (POSTGRES, "intake", "postgresql"),
    (POSTGRES_SEALED, "intake", "postgresql"),
    (POSTGRES_TRACED, "intake", "postgresql"),
    (POSTGRES_SAMPLED, "intake", "postgresql"),
    (GRANIAN, "granian", "postgresql"),
    (SQLITE, "intake", "sqlite"),
    (SQLITE_SEALED, "intake", "sqlite"),
    (CEILING, "ceiling", "sqlite"),
    (CEILING_TRACED, "ceiling", "sqlite"),
    (BARE, "bare", None),
    ("aiogram 3 SimpleRequestHandler, background", "aiogram", None),
)
# Tracing on (docs/operations.md, Tracing), each beside the same server with it off, and the
# OTEL_* environment that turns it on beside OTEL_EXPORTER_OTLP_ENDPOINT: spans exported over
# OTLP/HTTP to bench/otlp_sink.py, the SDK's defaults otherwise (every trace sampled).
SAMPLED = {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"}
TRACED: dict[str, tuple[str, dict[str, str]]] = {
    POSTGRES_TRACED: (POSTGRES, {}),
    POSTGRES_SAMPLED: (POSTGRES, SAMPLED),
    CEILING_TRACED: (CEILING, {}),
}
# Encryption on: each beside the same server without a ring, and the ring (a fresh one per run).
_KEYS, _INDEX = new_key_text("bench")
SEALING = {"INTAKE_ENCRYPTION_KEYS": _KEYS, "INTAKE_INDEX_KEY": _INDEX}
ENCRYPTED: dict[str, str] = {POSTGRES_SEALED: POSTGRES, SQLITE_SEALED: SQLITE}
WARM = "warm-up"  # a measurement's key prefix for its warm-up load
# Run at half the PostgreSQL intake's 64-connection rate; the ceiling is the control: the
# latency the generator and the HTTP server add by themselves.
PACED_SERVERS = (POSTGRES, CEILING)


@dataclass
class Load:
    """One measurement, as bench/intake.lua or bench/paced.py reports it."""

    requests: int  # answered
    seconds: float
    non2xx: int
    socket_errors: int
    p50_ms: float
    p99_ms: float
    sent: int
    first: int = 0  # the first update_id
    stored: int | None = None  # rows in this load's update_id range, for the durable intake

    @property
    def rate(self) -> float:
        return self.requests / self.seconds

    @property
    def ok(self) -> int:
        return self.requests - self.non2xx


@asynccontextmanager
async def server(
    kind: str, database_url: str, traces: dict[str, str] | None = None
) -> AsyncIterator[int]:
    """Start one server process, with the OTEL_* environment `traces` when given (tracing
    on); yield its port; stop it with SIGTERM (its last spans are exported as it exits)."""
    command = (sys.executable, "-m", "bench.intake_servers", kind, database_url)
    env = None if traces is None else {**os.environ, **traces}
    label = kind if traces is None else f"{kind}, traced"
    async with process(*command, env=env, ready="ready ", merge_stderr=False, label=label) as child:
        yield int(child.line.split()[1])


async def generate(*command: str, first: int) -> Load:
    """Run a load generator process; its last line that is a JSON object is the result."""
    process = await asyncio.create_subprocess_exec(
        *command, cwd=ROOT, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await process.communicate()
    lines = [line for line in out.decode().splitlines() if line.startswith("{")]
    if process.returncode or not lines:
        raise RuntimeError(f"{command[0]} failed ({process.returncode}):\n{out.decode()}")
    return Load(**json.loads(lines[-1]), first=first)


def wrk(port: int, connections: int, seconds: float, first: int) -> Iterable[str]:
    return (
        "wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "10s",
        "-s", str(ROOT / "bench" / "intake.lua"), f"http://{HOST}:{port}/telegram/{BOT}",
        "--", str(first), SECRET, TEMPLATE,
    )  # fmt: skip


def paced(port: int, rate: float, seconds: float, first: int) -> Iterable[str]:
    return (
        sys.executable, "-m", "bench.paced", str(port), SECRET, TEMPLATE,
        f"--rate={rate:.0f}", f"--seconds={seconds}", "--connections=64", f"--first={first}",
    )  # fmt: skip


async def measure(
    kind: str,
    url: str,
    seconds: float,
    warm_up: float,
    ids: Iterator[int],
    traces: dict[str, str] | None = None,
) -> dict[int | str, Load]:
    """wrk at each connection count, each after a warm-up (kept too, as WARM + count)."""
    loads: dict[int | str, Load] = {}
    async with server(kind, url, traces) as port:
        for connections in CONNECTIONS:
            print(f"bench intake: {kind}, {connections} connections", file=sys.stderr)
            first = next(ids)
            warm = await generate(*wrk(port, connections, warm_up, first), first=first)
            loads[f"{WARM} {connections}"] = warm
            first = next(ids)
            run = wrk(port, connections, seconds, first)
            loads[connections] = await generate(*run, first=first)
    return loads


async def measure_paced(
    kind: str, url: str, rate: float, seconds: float, warm_up: float, ids: Iterator[int]
) -> Load:
    """bench/paced.py at a fixed rate, after a warm-up at that rate."""
    print(f"bench intake: {kind}, fixed rate {rate:,.0f}/s", file=sys.stderr)
    async with server(kind, url) as port:
        first = next(ids)
        await generate(*paced(port, rate, warm_up, first), first=first)
        first = next(ids)
        return await generate(*paced(port, rate, seconds, first), first=first)


def count_stored(url: str, loads: Iterable[Load]) -> None:
    """Each load's rows: those in its update_id range."""
    engine = create_sync_engine(url)
    query = text(
        f"SELECT count(*) FROM {DEFAULT_TABLE} "
        "WHERE bot = :bot AND update_id >= :first AND update_id < :last"
    )
    try:
        with engine.connect() as connection:
            for load in loads:
                bounds = {"bot": BOT, "first": load.first, "last": load.first + SPAN}
                load.stored = connection.execute(query, bounds).scalar_one()
    finally:
        engine.dispose()


def rows_cell(loads: list[Load]) -> str:
    if any(load.stored is None for load in loads):
        return "stores nothing"
    stored = sum(load.stored or 0 for load in loads)
    ok, sent = sum(load.ok for load in loads), sum(load.sent for load in loads)
    verdict = "LOST" if stored < ok else "EXTRA" if stored > sent else "none lost"
    return f"{stored:,} / {ok:,} ({verdict})"


def errors_cell(loads: list[Load]) -> str:
    return f"{sum(x.non2xx for x in loads):,} / {sum(x.socket_errors for x in loads):,}"


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "| --- " * len(head) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def median_load(loads: list[Load]) -> Load:
    """The round whose rate is the median (the middle one of three)."""
    return sorted(loads, key=lambda load: load.rate)[(len(loads) - 1) // 2]


def closed_table(rounds: dict[str, list[dict[int | str, Load]]]) -> list[str]:
    names = ("req/s", "p50 ms", "p99 ms", "x bare", "x ceiling")
    head = ["server", *(f"{name} @{c}" for c in CONNECTIONS for name in names)]
    rows = []
    for label, each in rounds.items():
        row = [label]
        for c in CONNECTIONS:
            load = median_load([loads[c] for loads in each])
            bare = median_load([loads[c] for loads in rounds[BARE]])
            ceiling = median_load([loads[c] for loads in rounds[CEILING]])
            row += [f"{load.rate:,.0f}", f"{load.p50_ms:.1f}", f"{load.p99_ms:.1f}"]
            row += [f"{load.rate / bare.rate:.2f}", f"{load.rate / ceiling.rate:.2f}"]
        measured = [loads[c] for loads in each for c in CONNECTIONS]
        rows.append([*row, errors_cell(measured), rows_cell(measured)])
    return table([*head, "non-2xx / socket errors", "rows stored / 200s"], rows)


def rounds_table(rounds: dict[str, list[dict[int | str, Load]]]) -> list[str]:
    """Every round's rate at 64 connections, for the spread behind each median."""
    top = CONNECTIONS[-1]
    count = len(rounds[BARE])
    head = ["server", *(f"round {n + 1} req/s @{top}" for n in range(count))]
    rows = [
        [label, *(f"{loads[top].rate:,.0f}" for loads in each)] for label, each in rounds.items()
    ]
    return table(head, rows)


def paced_table(results: dict[str, dict[int | str, Load]], seconds: float) -> list[str]:
    head = ["fixed rate, 64 connections", "asked req/s", "done req/s", "p50 ms", "p99 ms"]
    rows = []
    for label in PACED_SERVERS:
        load = results[label][PACED]
        row = [label, f"{load.sent / seconds:,.0f}", f"{load.rate:,.0f}"]
        row += [f"{load.p50_ms:.1f}", f"{load.p99_ms:.1f}", errors_cell([load])]
        rows.append([*row, rows_cell([load])])
    return table([*head, "non-2xx / socket errors", "rows stored / 200s"], rows)


def verdicts(
    rounds: dict[str, list[dict[int | str, Load]]], results: dict[str, dict[int | str, Load]]
) -> list[str]:
    """Issue 33's targets for both durable intakes, and issue 3's paced p99."""
    top = CONNECTIONS[-1]
    p99 = results[POSTGRES][PACED].p99_ms
    bare = median_load([loads[top] for loads in rounds[BARE]])
    lines = []
    for name, label in (("PostgreSQL", POSTGRES), ("SQLite", SQLITE)):
        load = median_load([loads[top] for loads in rounds[label]])
        ratio = load.rate / bare.rate
        lines.append(
            f"Target, {name} at {top} connections >= 0.5x the bare server: {ratio:.2f}x, "
            f"{'met' if ratio >= 0.5 else 'MISSED'}; p99 <= 25 ms: {load.p99_ms:.1f} ms, "
            f"{'met' if load.p99_ms <= 25 else 'MISSED'}."
        )
    lines.append(
        f"Target, PostgreSQL p99 <= 25 ms at half its {top}-connection rate: {p99:.1f} ms, "
        f"{'met' if p99 <= 25 else 'MISSED'}."
    )
    return lines


def tracing_table(
    rounds: dict[str, list[dict[int | str, Load]]], spans: dict[str, list[int]]
) -> list[str]:
    """Each traced server beside itself untraced at 64 connections (medians), and the spans
    exported for the requests answered 200: one each when every trace is sampled, unless the
    SDK dropped some because its queue was full (`OTEL_BSP_*`); about a tenth when 1 in 10."""
    top = CONNECTIONS[-1]
    head = ["tracing", "off req/s", "on req/s", "on / off", "off p99 ms", "on p99 ms"]
    rows = []
    for traced, (plain, sampling) in TRACED.items():
        on = median_load([loads[top] for loads in rounds[traced]])
        off = median_load([loads[top] for loads in rounds[plain]])
        answered = sum(load.ok for loads in rounds[traced] for load in loads.values())
        exported = sum(spans[traced])
        dropped = not sampling and exported < answered
        cell = f"{exported:,} / {answered:,}" + (" (dropped)" if dropped else "")
        rows.append(
            [
                traced,
                f"{off.rate:,.0f}",
                f"{on.rate:,.0f}",
                f"{on.rate / off.rate:.2f}",
                f"{off.p99_ms:.1f}",
                f"{on.p99_ms:.1f}",
                cell,
            ]
        )
    return table([*head, "spans exported / 200s"], rows)


def encryption_table(rounds: dict[str, list[dict[int | str, Load]]]) -> list[str]:
    """Each durable intake with a key ring beside itself without, at 64 connections: the
    median of each round's own ratio (both from the same minutes), and the medians."""
    top = CONNECTIONS[-1]
    head = ["encryption", "off req/s", "on req/s", "on / off (median of rounds)", "target"]
    rows = []
    for sealed, plain in ENCRYPTED.items():
        on = median_load([loads[top] for loads in rounds[sealed]])
        off = median_load([loads[top] for loads in rounds[plain]])
        ratios = sorted(
            a[top].rate / b[top].rate for a, b in zip(rounds[sealed], rounds[plain], strict=True)
        )
        ratio = ratios[(len(ratios) - 1) // 2]
        verdict = "met" if ratio >= 0.9 else "MISSED"
        rows.append([sealed, f"{off.rate:,.0f}", f"{on.rate:,.0f}", f"{ratio:.2f}", verdict])
    return table(head, rows)


def report(
    rounds: dict[str, list[dict[int | str, Load]]],
    results: dict[str, dict[int | str, Load]],
    spans: dict[str, list[int]],
    seconds: float,
    warm_up: float,
) -> str:
    size = len(TEMPLATE % (SPAN, 1234, 5_234_567_890, 5_234_567_890, 1234))
    lines = [
        *closed_table(rounds),
        "",
        *rounds_table(rounds),
        "",
        *paced_table(results, seconds),
        "",
        *tracing_table(rounds, spans),
        "",
        *encryption_table(rounds),
        "",
        *verdicts(rounds, results),
        "",
        f"wrk (1 thread) and bench/paced.py: {seconds:g} s per measurement after {warm_up:g} s "
        f"of warm-up, {len(rounds[BARE])} rounds in turns, medians; ~{size}-byte message "
        "updates, each update_id sent once; x = requests/s over the bare server's (or the "
        "no-store ceiling's) at the same connection count.",
    ]
    return "\n".join(lines)


async def main(*, quick: bool = False) -> str:
    if shutil.which("wrk") is None:
        raise SystemExit("bench intake needs wrk on PATH: apt-get install -y wrk")
    try:
        import aiogram  # noqa: F401
    except ImportError:
        raise SystemExit(
            "bench intake needs aiogram: pip install -e ./kit/python -e '.[bench]'"
        ) from None
    seconds, warm_up, count = (2, 1, 1) if quick else (8, 2, 3)
    ids = (n * SPAN for n in itertools.count(1))
    rounds: dict[str, list[dict[int | str, Load]]] = {label: [] for label, _, _ in SERVERS}
    results: dict[str, dict[int | str, Load]] = {}  # the paced runs, after the rounds
    spans: dict[str, list[int]] = {label: [] for label in TRACED}  # exported, each round
    sink_port = free_port()
    sink = f"http://{HOST}:{sink_port}"
    with tempfile.TemporaryDirectory() as directory, contextlib.ExitStack() as drops:
        urls = {}
        for label, _, backend in SERVERS:
            urls[label] = ""
            if backend:
                urls[label], drop = await fresh_storage(backend, Path(directory))
                drops.callback(drop)
        async with process(*sink_command(sink_port), ready="ready", label="OTLP sink"):
            for _ in range(count):
                for label, kind, _ in SERVERS:
                    traces = None
                    if label in TRACED:
                        traces = {"OTEL_EXPORTER_OTLP_ENDPOINT": sink, **TRACED[label][1]}
                    if label in ENCRYPTED:
                        traces = SEALING  # the server's environment, beside os.environ
                    loads = await measure(kind, urls[label], seconds, warm_up, ids, traces)
                    rounds[label].append(loads)
                    if label in TRACED:
                        spans[label].append(await exported_spans(sink))
        for label, kind, _ in SERVERS:
            if label in PACED_SERVERS:
                top = median_load([loads[CONNECTIONS[-1]] for loads in rounds[POSTGRES]])
                paced_load = await measure_paced(
                    kind, urls[label], top.rate / 2, seconds, warm_up, ids
                )
                results[label] = {PACED: paced_load}
            if kind in ("intake", "granian"):
                measured = [load for loads in rounds[label] for load in loads.values()]
                count_stored(urls[label], [*measured, *results.get(label, {}).values()])
    return report(rounds, results, spans, seconds, warm_up)
