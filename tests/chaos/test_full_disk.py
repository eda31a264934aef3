"""A full disk under each backend (issue 49; docs/reliability.md, "A full disk").

Each case puts the database's files on a small tmpfs volume the test mounts (root is there)
and fills the volume with a file of its own while Telegram's traffic and the deliveries run:
SQLite's file and WAL; PostgreSQL's data directory; PostgreSQL's WAL, which stops the server
(the test, its supervisor, starts it again once there is room). The downstream fails every
first attempt and takes every second one, with `max_attempts = 2`: an attempt the fault
spent would end an update exhausted.

Each asserts: a 503 with `Retry-After` while the disk is full, never a 200 for an update not
recorded (every update answered 200 is delivered: lost 0); each update delivered exactly as
planned (attempt 1 refused, attempt 2 taken, nothing twice) and none exhausted; two log lines
at ERROR for the episode (its beginning and its end, in the database's words) and few others;
`/readyz` naming the cause while it lasts, ready once it ends; the storage.full and
storage.recovered events; the gauge; recovery without a restart.

Under CI (`CI=true`) a machine where tmpfs cannot be mounted fails the tests rather than
skipping them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
import pytest
from starlette.requests import Request
from starlette.responses import Response

from app.store.migrate import upgrade
from tests.downstream import (
    SIGNING_SECRET,
    FakeDownstream,
    Received,
    eventually,
    message,
    ok,
    status,
)
from tests.postgres_server import Cluster, required_binaries, running_cluster
from tests.processes import SECRET, STARTUP, Process, environment, free_port, unavailable

pytestmark = pytest.mark.slow  # real processes

KEY = "full-disk-key-0123456789"
LEASE = 2.0  # seconds: a fault of FAULT seconds outlasts every lease taken before it
FAULT = 5.0  # seconds the disk stays full
BEFORE = 40  # updates posted before the fill, the fill coming while they are delivered


def _reachable() -> Path:
    """A new directory that the server's user can reach (pytest's own are root's alone)."""
    return Path(tempfile.mkdtemp(prefix="intake-full-disk-"))


@contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs volume of `size` mounted at `path` for the test (then unmounted, and `path`
    removed when it is empty)."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0777", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        unavailable(f"cannot mount a tmpfs volume (root is needed): {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)
        with contextlib.suppress(OSError):
            path.rmdir()


class Filler:
    """A file that takes every byte left on a volume, until `free`d. Made empty at once: on a
    volume already full, a new file could not be made at all."""

    def __init__(self, volume: Path) -> None:
        self._path = volume / "filler"
        self._path.touch()

    def fill(self) -> None:
        chunk = b"\0" * 65536
        with self._path.open("ab") as file:
            try:
                while True:
                    file.write(chunk)
                    file.flush()
            except OSError:
                pass
            # What the buffer still held could not go: the volume is full to the last byte.
            with contextlib.suppress(OSError):
                os.ftruncate(file.fileno(), self._path.stat().st_size)

    def free(self) -> None:
        self._path.unlink(missing_ok=True)


@dataclass
class Traffic:
    """Telegram's side: each update POSTed until it is answered 200, a 503 retried."""

    port: int
    answered: set[int] = field(default_factory=set)  # answered 200
    refused: int = 0  # 503s, each with Retry-After
    without_retry_after: list[int] = field(default_factory=list)
    other: list[str] = field(default_factory=list)  # any other answer

    async def post(self, client: httpx.AsyncClient, update_id: int) -> None:
        headers = {"X-Telegram-Bot-Api-Secret-Token": SECRET, "Content-Type": "application/json"}
        while True:
            try:
                answer = await client.post(
                    f"http://127.0.0.1:{self.port}/telegram/default",
                    content=message(update_id, chat=update_id % 7),
                    headers=headers,
                )
            except httpx.TransportError as error:
                self.other.append(f"{update_id}: {error!r}")
                await asyncio.sleep(0.2)
                continue
            if answer.status_code == 200:
                self.answered.add(update_id)
                return
            if answer.status_code != 503:
                self.other.append(f"{update_id}: {answer.status_code} {answer.text}")
                return
            self.refused += 1
            if "retry-after" not in answer.headers:
                self.without_retry_after.append(update_id)
            await asyncio.sleep(0.2)  # Telegram waits longer; the test cannot

    async def run(self, ids: range, client: httpx.AsyncClient, *, width: int = 4) -> None:
        """Post `ids`, `width` at a time, each until it is answered 200."""
        queue = list(ids)

        async def lane() -> None:
            while queue:
                await self.post(client, queue.pop(0))

        await asyncio.gather(*(lane() for _ in range(width)))


async def first_refused_then_taken(received: Received, request: Request) -> Response:
    """Every first attempt fails (a 503 the worker retries), every later one is taken."""
    await asyncio.sleep(0.05)  # requests in flight when the disk fills
    if received.attempt == 1:
        return await status(503)(received, request)
    return await ok(received, request)


@dataclass
class Service:
    """The processes under test and how to reach them."""

    port: int
    processes: list[Process]
    downstream: FakeDownstream

    async def get(self, path: str) -> httpx.Response:
        headers = {"authorization": f"Bearer {KEY}"}
        async with httpx.AsyncClient(timeout=10) as client:
            return await client.get(f"http://127.0.0.1:{self.port}{path}", headers=headers)

    async def storage_gauge(self) -> float:
        text = (await self.get("/metrics")).text
        [value] = [
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith("telegram_intake_storage_full ")
        ]
        return value

    async def readiness(self) -> tuple[int, dict[str, str]]:
        answer = await self.get("/readyz")
        return answer.status_code, answer.json()


def service_env(url: str, downstream: FakeDownstream, port: int) -> dict[str, str]:
    return environment(
        url,
        f"{downstream.url}/hook",
        port=port,
        api_keys=KEY,
        mode="durable",
        max_attempts=2,
        breaker_failures=10_000,  # every first attempt fails: that is the plan, not an outage
        lease_seconds=LEASE,
        exhaustion_url=f"{downstream.url}/exhausted",
        operations_url=f"{downstream.url}/operations",
        operations_signing_secret=SIGNING_SECRET,
        log_format="json",
    )


async def through_a_full_disk(
    service: Service,
    fill: Callable[[], None],
    free: Callable[[], Awaitable[None]],
    *,
    words: str,
) -> None:
    """Traffic before, during and after a full disk that `fill` makes and `free` ends; then
    every assertion of the module's docstring. `words`: what the database says of it."""
    traffic = Traffic(service.port)
    pids = [process.pid for process in service.processes]
    async with httpx.AsyncClient(timeout=30) as client:
        await traffic.run(range(1, BEFORE + 1), client)
        await eventually(lambda: len(service.downstream.received) >= BEFORE // 2, within=20)
        await asyncio.to_thread(fill)
        full_at = time.monotonic()
        during = asyncio.create_task(traffic.run(range(BEFORE + 1, BEFORE + 41), client))
        # While it lasts: /readyz names it (to a viewer), the gauge says so.
        status_code, readiness = await eventually(_unready(service), within=FAULT + 10)
        assert status_code == 503, readiness
        assert words in readiness["error"], readiness
        assert await service.storage_gauge() == 1
        await asyncio.sleep(max(0.0, FAULT - (time.monotonic() - full_at)))
        await free()
        freed_at = time.monotonic()
        await during  # every update of the fault answered 200 by now
        recovered = time.monotonic() - freed_at
        await traffic.run(range(BEFORE + 41, BEFORE + 61), client)
    total = BEFORE + 60
    assert traffic.answered == set(range(1, total + 1)), traffic.other
    assert traffic.refused > 0
    assert traffic.without_retry_after == []
    assert traffic.other == []

    def delivered() -> bool:
        taken = {r.update_id for r in service.downstream.received if r.attempt >= 2}
        return taken >= traffic.answered

    await eventually(delivered, within=60)
    await eventually(lambda: _ready(service), within=15)
    await asyncio.sleep(2 * LEASE)  # anything still to come twice has come
    attempts: dict[int, list[int]] = {}
    for received in service.downstream.received:
        attempts.setdefault(received.update_id, []).append(received.attempt)
    wrong = {u: sorted(a) for u, a in attempts.items() if sorted(a) != [1, 2]}
    assert wrong == {}, f"delivered otherwise than once after one refusal: {wrong}"
    assert service.downstream.exhaustions == []
    assert await service.storage_gauge() == 0
    # Each process that met the full disk told of its episode, in order: when it began, in the
    # database's words, and when it ended.
    events = [json.loads(r.body) for r in service.downstream.operations]
    assert "exhaustion.created" not in [event["type"] for event in events]
    told: dict[str, list[str]] = {}
    for event in events:
        if event["type"].startswith("storage."):
            told.setdefault(event["data"]["worker"], []).append(event["type"])
            assert words in event["data"]["cause"], event
    assert told, events
    assert all(kinds == ["storage.full", "storage.recovered"] for kinds in told.values()), told
    for process, pid in zip(service.processes, pids, strict=True):
        assert process.poll() is None  # never exited
        assert process.pid == pid  # nor restarted
    _assert_told_once(service.processes, words)
    print(f"recovered {recovered:.2f} s after space was freed; {traffic.refused} 503s")


def _unready(service: Service) -> Callable[[], Awaitable[tuple[int, dict[str, str]] | None]]:
    async def check() -> tuple[int, dict[str, str]] | None:
        status_code, body = await service.readiness()
        return (
            (status_code, body) if status_code == 503 and "full" in body.get("error", "") else None
        )

    return check


async def _ready(service: Service) -> bool:
    status_code, _ = await service.readiness()
    return status_code == 200


def _assert_told_once(processes: list[Process], words: str) -> None:
    """Each process logged the episode once as it began and once as it ended, at ERROR, in
    the database's words, and few other lines above INFO: not a line per request."""
    for process in processes:
        lines = [json.loads(line) for line in process.stderr.splitlines() if line.startswith("{")]
        loud = [line for line in lines if line["level"] in ("WARNING", "ERROR", "CRITICAL")]
        errors = [line["message"] for line in loud if line["level"] != "WARNING"]
        began = [m for m in errors if "writes fail until space is freed" in m]
        ended = [m for m in errors if "writes again after" in m]
        assert len(began) == 1, (process.name, errors)
        assert words in began[0], (process.name, errors)
        assert len(ended) == 1, (process.name, errors)
        assert len(errors) == 2, (process.name, errors)
        assert len(loud) <= 12, (process.name, [line["message"] for line in loud])


async def test_sqlite_on_a_full_volume_of_4_mib_recovers_by_itself(
    downstream: FakeDownstream, tmp_path: Path
) -> None:
    """SQLite's file and WAL on a 4 MiB volume: once space is freed the WAL is checkpointed
    and truncated, or it would take the room back and never reach its own checkpoint."""
    downstream.answer = first_refused_then_taken
    with tmpfs(tmp_path / "volume", "4m") as volume:
        filler = Filler(volume)
        url = f"sqlite+aiosqlite:///{volume / 'intake.db'}"
        await asyncio.to_thread(upgrade, url)
        port = free_port()
        run = Process("run", tmp_path, service_env(url, downstream, port), "run")
        try:
            await eventually(
                lambda: run.answers(f"http://127.0.0.1:{port}/healthz"), within=STARTUP
            )

            async def free() -> None:
                filler.free()

            await through_a_full_disk(
                Service(port, [run], downstream),
                filler.fill,
                free,
                words="database or disk is full",
            )
        except BaseException:
            print(run.report())
            raise
        finally:
            run.kill()


async def _postgres_case(
    downstream: FakeDownstream,
    tmp_path: Path,
    cluster: Cluster,
    fill: Callable[[], None],
    free: Callable[[], Awaitable[None]],
    *,
    split: bool,
) -> None:
    """The service on `cluster` through a full disk that `fill` makes and `free` ends: as
    `serve` and a `worker` (`split`), or as one `run`."""
    downstream.answer = first_refused_then_taken
    url = cluster.url().replace("postgresql://", "postgresql+psycopg://")
    await asyncio.to_thread(upgrade, url)
    port = free_port()
    env = service_env(url, downstream, port)
    if split:
        worker_env = env | {"INTAKE_WORKER_PORT": str(free_port())}
        processes = [
            Process("serve", tmp_path, env, "serve"),
            Process("worker", tmp_path, worker_env, "worker"),
        ]
    else:
        processes = [Process("run", tmp_path, env, "run")]
    try:
        await eventually(
            lambda: processes[0].answers(f"http://127.0.0.1:{port}/healthz"), within=STARTUP
        )
        service = Service(port, processes, downstream)
        await through_a_full_disk(service, fill, free, words="No space left on device")
    except BaseException:
        print(*(process.report() for process in processes), cluster.log_text[-5000:], sep="\n")
        raise
    finally:
        for process in processes:
            process.kill()


async def test_postgresql_with_its_data_directory_full(
    downstream: FakeDownstream, tmp_path: Path
) -> None:
    """ "could not extend file": every write that needs new room fails, in every process."""
    bindir = required_binaries()
    with (
        tmpfs(_reachable(), "160m") as volume,
        running_cluster(bindir, directory=volume) as cluster,
    ):
        filler = Filler(volume)

        async def free() -> None:
            filler.free()

        await _postgres_case(downstream, tmp_path, cluster, filler.fill, free, split=True)


async def test_postgresql_with_its_wal_volume_full_stops_and_is_started_again(
    downstream: FakeDownstream, tmp_path: Path
) -> None:
    """The WAL's next segment cannot be made: PostgreSQL PANICs and stops, and tells only the
    connection whose commit met it (one process here: `run`; docs/reliability.md says what
    the others see). The test, as its supervisor, starts it again once there is room."""
    bindir = required_binaries()
    with (
        tmpfs(_reachable(), "64m") as wal,
        running_cluster(bindir, wal_directory=wal) as cluster,
    ):
        filler = Filler(wal)

        def fill() -> None:
            with psycopg.connect(cluster.url(), autocommit=True) as other:
                # The WAL writer wakes rarely: the service's own commits write the WAL, and
                # the one that needs the next segment meets the full volume.
                other.execute("ALTER SYSTEM SET wal_writer_delay = '10s'")
                other.execute("SELECT pg_reload_conf()")
                # Use up the segments a checkpoint left for reuse, as a busy server does, and
                # the segment in use to its last 64 kB: a few of the service's commits more
                # need a new one.
                other.execute("CREATE TABLE ballast (n bigint)")
                other.execute("INSERT INTO ballast SELECT n FROM generate_series(1, 300000) n")
                while _left_in_segment(other) > 64 * 1024:
                    other.execute("INSERT INTO ballast SELECT n FROM generate_series(1, 500) n")
            filler.fill()

        async def free() -> None:
            await eventually(lambda: not cluster.running, within=30)
            filler.free()
            await asyncio.to_thread(cluster.start)

        await _postgres_case(downstream, tmp_path, cluster, fill, free, split=False)


def _left_in_segment(connection: psycopg.Connection[tuple[object, ...]]) -> int:
    """Bytes of WAL left before the segment in use ends."""
    [(size,)] = connection.execute(
        "SELECT setting::bigint FROM pg_settings WHERE name = 'wal_segment_size'"
    ).fetchall()
    [(position,)] = connection.execute(
        "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint"
    ).fetchall()
    return int(str(size)) - int(str(position)) % int(str(size))
