"""A soak: the whole path at a sustained rate for a long time, sampled as it runs.

    python -m bench.soak                  # 20 minutes at 800 updates/s; plots in docs/performance/
    python -m bench.soak --minutes 1 --rate 200 --plots /tmp/soak

On PostgreSQL (a fresh schema, or `--database-url`): one `serve`, two `worker` processes and
a downstream in its own process that asks `owns` before it answers (`bench.downstream --owns
--forget`). Workers prune every 5 s with 30 s of retention, so completed rows are deleted
about as fast as updates arrive. A paced poster sends `rate` updates/s over 500 chats from
this process (64 connections; a post's latency runs from when it was due, so a stall cannot
hide the posts queued behind it).

Every `interval` seconds (10): each process's resident set (VmRSS), the table's and its
indexes' size on disk and its live rows, the updates posted and delivered, and the p99 of
POST-to-200 and of received-to-arrival (the intake's `X-Intake-Received-At` to the downstream)
over the interval. At the end: the growth of each series from the end of the warm-up (the
first 15% of the run) to the end (the mean of the last fifth of the samples after the warm-up
over the mean of the first fifth), the PNG plots (matplotlib), and a Markdown report.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import psycopg

from app.store.migrate import upgrade
from app.store.schema import DEFAULT_TABLE
from bench.child import ROOT, free_port
from bench.downstream import command as downstream_command
from bench.fixtures import SECRET, body, fresh_schema, start_path, worker_env

KEY = "bench-soak-key.0123456789"
CONNECTIONS = 64
WORKERS = 2
RETENTION_SECONDS = 30
PRUNE_INTERVAL_SECONDS = 5
WARM_UP = 0.15  # of the run
PLOTS = ROOT / "docs" / "performance"


@dataclass
class Sample:
    seconds: float  # since the first post
    posted: int
    delivered: int
    rows: int  # live rows in the table
    table_mib: float
    index_mib: float
    post_p99_ms: float | None
    arrival_p99_ms: float | None
    rss_mib: dict[str, float]

    @property
    def backlog(self) -> int:
        return self.posted - self.delivered


@dataclass
class Soak:
    """A finished soak: its samples, and what was lost or refused."""

    minutes: float
    rate: float
    samples: list[Sample] = field(default_factory=list)
    posted: int = 0
    refused: int = 0  # posts answered other than 200
    delivered: int = 0  # arrivals at the downstream

    def after_warm_up(self) -> list[Sample]:
        start = self.minutes * 60 * WARM_UP
        return [s for s in self.samples if s.seconds >= start]

    def growth(self, series: Callable[[Sample], float | None]) -> float | None:
        """The series' mean over the last fifth of the samples after the warm-up, over its
        mean over the first fifth, minus one; None without enough samples."""
        values = [v for v in map(series, self.after_warm_up()) if v is not None]
        fifth = len(values) // 5
        if fifth < 1 or not statistics.fmean(values[:fifth]):
            return None
        return statistics.fmean(values[-fifth:]) / statistics.fmean(values[:fifth]) - 1

    def series(self) -> dict[str, Callable[[Sample], float | None]]:
        """Every series the growth table reports, by name."""
        rss: dict[str, Callable[[Sample], float | None]] = {
            f"RSS {name}, MiB": (lambda s, name=name: s.rss_mib[name])  # type: ignore[misc]
            for name in self.samples[0].rss_mib
        }
        return {
            **rss,
            "table on disk, MiB": lambda s: s.table_mib,
            "indexes on disk, MiB": lambda s: s.index_mib,
            "live rows": lambda s: s.rows,
            "POST to 200 p99, ms": lambda s: s.post_p99_ms,
            "received to arrival p99, ms": lambda s: s.arrival_p99_ms,
        }

    def report(self, command: str) -> str:
        rows = []
        warmed = self.after_warm_up()
        for name, series in self.series().items():
            values = [v for v in map(series, warmed) if v is not None]
            growth = self.growth(series)
            shown = "n/a" if growth is None else f"{growth:+.1%}"
            if values:
                rows.append(
                    f"| {name} | {values[0]:,.1f} | {values[-1]:,.1f} | {max(values):,.1f} "
                    f"| {shown} |"
                )
        seconds = self.samples[-1].seconds if self.samples else 0.0
        return "\n".join(
            [
                f"`{command}`: {self.minutes:g} min at {self.rate:,.0f} updates/s through "
                f"`serve`, {WORKERS} `worker` processes and an owns-checking downstream, "
                f"PostgreSQL, prune every {PRUNE_INTERVAL_SECONDS} s with "
                f"{RETENTION_SECONDS} s of retention.",
                "",
                f"Posted {self.posted:,} in {seconds:,.0f} s, refused {self.refused}, "
                f"delivered {self.delivered:,}, lost {max(self.posted - self.delivered, 0)}. "
                f"Samples every {self.samples[1].seconds - self.samples[0].seconds:.0f} s; "
                f"growth is the mean of the last fifth after the warm-up "
                f"(the first {WARM_UP:.0%}) over the mean of its first fifth.",
                "",
                "| series | after warm-up | at the end | highest | growth |",
                "| --- | --- | --- | --- | --- |",
                *rows,
            ]
            if len(self.samples) > 1
            else ["no samples"]
        )

    def plot(self, directory: Path) -> list[Path]:
        """Three PNGs: resident sets, the table on disk, latency and throughput."""
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot

        directory.mkdir(parents=True, exist_ok=True)
        minutes = [s.seconds / 60 for s in self.samples]
        title = f"soak: {self.rate:,.0f} updates/s for {self.minutes:g} min"
        paths = []

        figure, axes = pyplot.subplots(figsize=(8, 4))
        for name in self.samples[0].rss_mib:
            axes.plot(minutes, [s.rss_mib[name] for s in self.samples], label=name)
        axes.set(title=f"{title}: resident set", xlabel="minutes", ylabel="MiB", ylim=(0, None))
        axes.legend()
        paths.append(_save(figure, directory / "soak-rss.png"))

        figure, (disk, rows) = pyplot.subplots(2, 1, figsize=(8, 6), sharex=True)
        disk.plot(minutes, [s.table_mib for s in self.samples], label="table")
        disk.plot(minutes, [s.index_mib for s in self.samples], label="indexes")
        disk.set(title=f"{title}: on disk", ylabel="MiB", ylim=(0, None))
        disk.legend()
        rows.plot(minutes, [s.rows for s in self.samples], label="live rows", color="gray")
        rows.plot(minutes, [s.backlog for s in self.samples], label="undelivered", color="red")
        rows.set(xlabel="minutes", ylabel="rows", ylim=(0, None))
        rows.legend()
        paths.append(_save(figure, directory / "soak-disk.png"))

        figure, (latency, rate) = pyplot.subplots(2, 1, figsize=(8, 6), sharex=True)
        for label, values in (
            ("POST to 200", [s.post_p99_ms for s in self.samples]),
            ("received to arrival", [s.arrival_p99_ms for s in self.samples]),
        ):
            latency.plot(minutes, [float("nan") if v is None else v for v in values], label=label)
        latency.set(title=f"{title}: p99 per interval", ylabel="ms", ylim=(0, None))
        latency.legend()
        delivered = [
            (b.delivered - a.delivered) / (b.seconds - a.seconds)
            for a, b in zip(self.samples, self.samples[1:], strict=False)
        ]
        rate.plot(minutes[1:], delivered, label="delivered per second")
        rate.axhline(self.rate, color="gray", linestyle=":", label="posted per second")
        rate.set(xlabel="minutes", ylabel="updates/s", ylim=(0, None))
        rate.legend()
        paths.append(_save(figure, directory / "soak-latency.png"))
        return paths


def _save(figure: object, path: Path) -> Path:
    from matplotlib import pyplot

    figure.tight_layout()  # type: ignore[attr-defined]
    figure.savefig(path, dpi=80)  # type: ignore[attr-defined]
    pyplot.close(figure)  # type: ignore[arg-type]
    return path


class Poster:
    """Posts update after update at `rate` per second, each when due, CONNECTIONS at a time."""

    def __init__(self, intake: str, rate: float) -> None:
        self._url = f"{intake}/telegram/default"
        self._rate = rate
        self.posted = 0
        self.refused = 0
        self.window: list[float] = []  # ms from due to 200, since the last sample

    def sample(self) -> float | None:
        window, self.window = self.window, []
        return _p99(window)

    async def run(self, stop: asyncio.Event) -> None:
        due: asyncio.Queue[tuple[int, float]] = asyncio.Queue()
        headers = {"x-telegram-bot-api-secret-token": SECRET, "content-type": "application/json"}
        connector = aiohttp.TCPConnector(limit=CONNECTIONS)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def connection() -> None:
                while True:
                    n, when = await due.get()
                    async with session.post(self._url, data=body(n), headers=headers) as answer:
                        await answer.read()
                    if answer.status == 200:
                        self.posted += 1
                    else:
                        self.refused += 1
                    self.window.append((time.perf_counter() - when) * 1000)
                    due.task_done()

            connections = [asyncio.create_task(connection()) for _ in range(CONNECTIONS)]
            start, sent = time.perf_counter(), 0
            while not stop.is_set():
                for n in range(sent + 1, int((time.perf_counter() - start) * self._rate) + 1):
                    due.put_nowait((n, start + n / self._rate))
                    sent = n
                await asyncio.sleep(0.005)
            await due.join()
            for task in connections:
                task.cancel()


def _p99(values: list[float]) -> float | None:
    return statistics.quantiles(values, n=100)[98] if len(values) >= 2 else None


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


async def soak(
    url: str, *, minutes: float, rate: float, interval: float = 10.0, quiet: bool = False
) -> Soak:
    """Soak the path over the PostgreSQL database at `url` (migrated here)."""
    upgrade(url)
    result = Soak(minutes, rate)
    async with AsyncExitStack() as stack:
        port, hook_port = free_port(), free_port()
        intake, downstream = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{hook_port}"
        env = worker_env(
            url,
            downstream,
            INTAKE_PORT=str(port),
            INTAKE_API_KEYS=KEY,
            INTAKE_RETENTION_SECONDS=str(RETENTION_SECONDS),
            INTAKE_PRUNE_INTERVAL_SECONDS=str(PRUNE_INTERVAL_SECONDS),
        )
        command = downstream_command(hook_port, owns=(intake, KEY), forget=True)
        children = await start_path(stack, env, command, WORKERS)
        database = await psycopg.AsyncConnection.connect(_libpq(url), autocommit=True)
        stack.push_async_callback(database.close)
        session = await stack.enter_async_context(aiohttp.ClientSession())

        async def take_sample(seconds: float, poster: Poster) -> Sample:
            async with session.get(f"{downstream}/sample") as answer:
                arrived = await answer.json()
            cursor = await database.execute(
                "SELECT pg_table_size(c.oid), pg_indexes_size(c.oid), s.n_live_tup "
                "FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid "
                "WHERE c.oid = %s::regclass",
                (DEFAULT_TABLE,),
            )
            table, indexes, rows = await cursor.fetchone() or (0, 0, 0)
            return Sample(
                seconds=seconds,
                posted=poster.posted,
                delivered=arrived["count"],
                rows=rows,
                table_mib=table / 2**20,
                index_mib=indexes / 2**20,
                post_p99_ms=poster.sample(),
                arrival_p99_ms=_p99(arrived["latencies_ms"]),
                rss_mib={name: child.rss_mib() for name, child in children.items()},
            )

        poster, stop = Poster(intake, rate), asyncio.Event()
        posting = asyncio.create_task(poster.run(stop))
        started = time.perf_counter()
        end = started + minutes * 60
        next_sample = started + interval
        while next_sample <= end + 0.001:
            await asyncio.sleep(max(next_sample - time.perf_counter(), 0))
            sample = await take_sample(time.perf_counter() - started, poster)
            result.samples.append(sample)
            if not quiet:
                print(_progress(sample), file=sys.stderr)
            next_sample += interval
        stop.set()
        await posting
        result.posted, result.refused = poster.posted, poster.refused
        async with asyncio.timeout(300):  # the backlog, delivered
            while True:
                async with session.get(f"{downstream}/count") as answer:
                    result.delivered = (await answer.json())["count"]
                if result.delivered >= result.posted:
                    break
                await asyncio.sleep(0.2)
    return result


def _progress(s: Sample) -> str:
    rss = ", ".join(f"{name} {mib:.0f}" for name, mib in s.rss_mib.items())
    return (
        f"bench soak: {s.seconds:5.0f} s posted {s.posted:,} delivered {s.delivered:,} "
        f"rows {s.rows:,} table {s.table_mib:.1f} MiB indexes {s.index_mib:.1f} MiB "
        f"p99 post {s.post_p99_ms or 0:.1f} ms arrival {s.arrival_p99_ms or 0:.1f} ms; "
        f"RSS MiB {rss}"
    )


@asynccontextmanager
async def _database(url: str | None) -> AsyncIterator[str]:
    if url is not None:
        yield url
        return
    async with fresh_schema() as (fresh, _):
        yield fresh


async def main(arguments: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=800.0, help="updates per second")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--plots", type=Path, default=PLOTS, help="where the PNGs go")
    parser.add_argument("--database-url", help="default: a fresh schema on the bench database")
    args = parser.parse_args(arguments)
    command = " ".join(["python -m bench.soak", *(arguments or sys.argv[1:])])
    async with _database(args.database_url) as url:
        result = await soak(url, minutes=args.minutes, rate=args.rate, interval=args.interval)
    paths = result.plot(args.plots)
    print(f"# bench soak ({os.cpu_count()} cores)\n\n{result.report(command)}\n")
    print("Plots: " + ", ".join(str(path) for path in paths))


if __name__ == "__main__":
    asyncio.run(main())
