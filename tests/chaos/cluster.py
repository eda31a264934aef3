"""A PostgreSQL server of the chaos run's own, so that restarting it hurts nothing else.

With the server binaries on this machine (`initdb`, `pg_ctl`: Debian's postgresql package, or
`pg_config --bindir`), `private_cluster` makes a throwaway cluster in a temporary directory on
an ephemeral port and `restart` crashes it (`pg_ctl restart -m immediate`: no shutdown
checkpoint; recovery replays the WAL, as after a power cut). Running as root, the cluster is
made and run as the `postgres` user, since PostgreSQL refuses to run as root.

Without the binaries (a machine whose PostgreSQL runs in a container), `shared_database`
uses a fresh database on the test server and `restart` terminates every connection to it:
a weaker fault (connections lost, nothing crashed), reported as such in the run's table.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from tests.processes import free_port

DATABASE_PASSWORD = "chaos-database-password-3b8e"  # checked absent from every log


def server_binaries() -> Path | None:
    """The directory of `initdb` and `pg_ctl`, or None."""
    candidates = []
    if pg_config := shutil.which("pg_config"):
        bindir = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        candidates.append(bindir.stdout.strip())
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for candidate in candidates:
        if candidate and (Path(candidate) / "initdb").exists():
            return Path(candidate)
    return None


class Database:
    """Where the chaos run keeps its rows, and the one fault it can inflict on it."""

    def __init__(self, url: str, fault: str, password: str | None = None) -> None:
        self.url = url  # libpq form: postgresql://...
        self.fault = fault  # what `restart` does, for the report
        self.password = password  # in the URL: no log may show it

    def restart(self) -> None:
        raise NotImplementedError


class PrivateCluster(Database):
    def __init__(self, bindir: Path, directory: Path, port: int, user: str | None) -> None:
        # Trust authentication ignores the password; it is there so that the run can check
        # that no process ever logs the database URL's password.
        super().__init__(
            f"postgresql://postgres:{DATABASE_PASSWORD}@127.0.0.1:{port}/postgres",
            "PostgreSQL crashed and restarted (pg_ctl restart -m immediate)",
            DATABASE_PASSWORD,
        )
        self._bindir = bindir
        self._data = directory / "data"
        self._log = directory / "server.log"
        self._port = port
        self._user = user

    def _run(self, *command: str) -> None:
        prefix = ["runuser", "-u", self._user, "--"] if self._user else []
        result = subprocess.run([*prefix, *command], capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            log = self._log.read_text(errors="replace") if self._log.exists() else ""
            raise RuntimeError(f"{command[0]} failed: {result.stderr}{result.stdout}\n{log}")

    def init(self) -> None:
        self._run(
            str(self._bindir / "initdb"), "-D", str(self._data), "-U", "postgres",
            "--auth=trust", "--no-sync", "-E", "UTF8",
        )  # fmt: skip
        self.start()

    def _options(self) -> str:
        # Durable as production is (fsync on); small and quick to start.
        return (
            f"-p {self._port} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' "
            "-c max_connections=200 -c shared_buffers=64MB"
        )

    def start(self) -> None:
        self._run(
            str(self._bindir / "pg_ctl"), "-D", str(self._data), "-l", str(self._log),
            "-o", self._options(), "-w", "-t", "60", "start",
        )  # fmt: skip

    def restart(self) -> None:
        self._run(
            str(self._bindir / "pg_ctl"), "-D", str(self._data), "-l", str(self._log),
            "-o", self._options(), "-m", "immediate", "-w", "-t", "60", "restart",
        )  # fmt: skip

    def stop(self) -> None:
        self._run(str(self._bindir / "pg_ctl"), "-D", str(self._data), "-m", "immediate", "stop")


class SharedDatabase(Database):
    def __init__(self, admin_url: str, name: str) -> None:
        base = admin_url.rsplit("/", 1)[0]
        super().__init__(
            f"{base}/{name}", "every connection to the database terminated (no server binaries)"
        )
        self._admin_url = admin_url
        self._name = name

    def restart(self) -> None:
        with psycopg.connect(self._admin_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (self._name,),
            )


@contextmanager
def chaos_database(admin_url: str) -> Iterator[Database]:
    """A private cluster when the server binaries are here, else a database on `admin_url`."""
    bindir = server_binaries()
    if bindir is None:
        name = f"chaos_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        try:
            yield SharedDatabase(admin_url, name)
        finally:
            with psycopg.connect(admin_url, autocommit=True) as admin:
                admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        return
    user = "postgres" if os.geteuid() == 0 else None
    directory = Path(tempfile.mkdtemp(prefix="intake-chaos-pg-"))
    try:
        if user is not None:
            shutil.chown(directory, user)
        cluster = PrivateCluster(bindir, directory, free_port(), user)
        failed = True
        try:
            cluster.init()
            yield cluster
            failed = False
        finally:
            # Stopped before its directory goes, even when starting it failed half-way; a
            # failure to stop is raised only when it would hide no other error.
            try:
                cluster.stop()
            except RuntimeError:
                if not failed:
                    raise
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def wait_until_up(url: str, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while True:
        try:
            psycopg.connect(url, connect_timeout=2).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
