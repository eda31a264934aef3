"""PgBouncer in transaction pooling mode, started by the tests in front of a PostgreSQL server,
as the chaos run starts its own cluster (Debian's `pgbouncer` package; `.ci/run` installs it).

`running_pgbouncer(host, port)` starts one on an ephemeral loopback port with a temporary ini
and userlist (trust authentication, `pool_mode = transaction`, no `ignore_startup_parameters`:
as strict as a stock installation) and stops it at the end. Running as root, it drops to the
`postgres` user, since PgBouncer refuses to run as root.

`require_binary()` is how a test asks for it: without the binary the test fails under CI
(`CI=true`), and elsewhere skips, saying why.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from sqlalchemy.engine import make_url

from app.store.migrate import upgrade
from tests.processes import free_port, unavailable

MISSING = "pgbouncer is not installed (Debian: apt-get install pgbouncer; .ci/run installs it)"


def binary() -> str | None:
    """The pgbouncer executable, or None (Debian puts it in /usr/sbin)."""
    return shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/usr/bin")


def require_binary() -> str:
    """The executable; without it, fail under CI and skip elsewhere."""
    return binary() or unavailable(MISSING)


class PgBouncer:
    """A running PgBouncer: every database of the server, under its own name, at `port`."""

    def __init__(self, port: int, version: str, log: Path) -> None:
        self.port = port
        self.version = version  # "PgBouncer 1.18.0"
        self.log = log

    def url(self, server_url: str) -> str:
        """`server_url` (any form SQLAlchemy or libpq reads), through this PgBouncer."""
        url = make_url(server_url).set(host="127.0.0.1", port=self.port)
        return url.render_as_string(hide_password=False)


@contextmanager
def running_pgbouncer(
    server_host: str, server_port: int, *, user: str = "postgres", pool_size: int = 20
) -> Iterator[PgBouncer]:
    """PgBouncer in transaction pooling mode in front of `server_host:server_port`, until the
    block ends."""
    executable = require_binary()
    run_as = "postgres" if os.geteuid() == 0 else None
    directory = Path(tempfile.mkdtemp(prefix="intake-pgbouncer-"))
    try:
        port = free_port()
        (directory / "userlist.txt").write_text(f'"{user}" ""\n')
        ini = directory / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"* = host={server_host} port={server_port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {directory / 'userlist.txt'}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {pool_size}\n"
            "max_client_conn = 900\n"
            f"logfile = {directory / 'pgbouncer.log'}\n"
        )
        if run_as is not None:
            for path in (directory, *directory.iterdir()):
                shutil.chown(path, run_as)
        version = subprocess.run(
            [executable, "--version"], capture_output=True, text=True, check=True
        ).stdout.splitlines()[0]
        command = [executable, *(["-u", run_as] if run_as else []), str(ini)]
        # Its log goes to stderr too: into a file, never a pipe that nobody reads (a full
        # pipe blocks PgBouncer, which then answers no one).
        with (directory / "pgbouncer.stderr").open("wb") as stderr:
            process = subprocess.Popen(
                command, stdout=subprocess.DEVNULL, stderr=stderr, stdin=subprocess.DEVNULL
            )
        try:
            bouncer = PgBouncer(port, version, directory / "pgbouncer.log")
            _wait_until_listening(process, bouncer)
            yield bouncer
        finally:
            process.send_signal(signal.SIGTERM)  # immediate shutdown
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _wait_until_listening(process: subprocess.Popen[bytes], bouncer: PgBouncer) -> None:
    deadline = time.monotonic() + 15
    while True:
        if process.poll() is not None:
            errors = bouncer.log.with_suffix(".stderr").read_text(errors="replace")
            raise RuntimeError(f"pgbouncer exited with {process.returncode}: {errors}")
        try:
            socket.create_connection(("127.0.0.1", bouncer.port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class BouncedStorage:
    """Fresh databases on the test server, each migrated and reached through PgBouncer. A
    database of its own, not a schema as `tests.conftest.Storage` makes: PgBouncer refuses
    the `options` that would set the search path."""

    def __init__(self, bouncer: PgBouncer, server_url: str, admin: psycopg.Connection) -> None:
        self.bouncer = bouncer
        self._server_url = server_url
        self._admin = admin
        self._databases: list[str] = []

    def direct_url(self, database: str) -> str:
        url = make_url(self._server_url).set(drivername="postgresql+psycopg", database=database)
        return url.render_as_string(hide_password=False)

    def url(self, revision: str | None = "head", **settings: int) -> str:
        """A URL through PgBouncer to a fresh database, migrated (through PgBouncer too) to
        `revision` (None leaves it empty); `settings` are the database's defaults on the
        server (`ALTER DATABASE ... SET`), as an operator sets them for the service's role."""
        name = f"t_{uuid.uuid4().hex[:16]}"
        self._admin.execute(f"CREATE DATABASE {name}")
        self._databases.append(name)
        for setting, value in settings.items():
            self._admin.execute(f"ALTER DATABASE {name} SET {setting} = {int(value)}")
        url = self.bouncer.url(self.direct_url(name))
        if revision is not None:
            upgrade(url, revision)
        return url

    def drop(self) -> None:
        for name in self._databases:
            self._admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
