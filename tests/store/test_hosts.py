"""Several hosts in one database URL (docs/contract.md, "Failover"): every path reaches the
primary among them, and a connection to a server that turned read-only is let go.

A stand-in for a standby: a throwaway cluster of this machine's binaries
(tests/postgres_server.py) whose sessions are read-only (`default_transaction_read_only`), as
libpq's `target_session_attrs=read-write` tells a standby from a primary. The primary is the
test session's own server. No replication: these tests are about finding the primary, not
about what a failover keeps."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from app.store import StoreUnavailable, open_store
from app.store.migrate import current_revision, upgrade
from app.store.schema import HEAD
from tests.conftest import Storage, table_rows
from tests.postgres_server import Cluster, required_binaries, running_cluster
from tests.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
# One worker runs them all: the second server is started once, not once per worker.
pytestmark = pytest.mark.xdist_group("second-server")


@pytest.fixture(scope="module")
def other_server() -> Iterator[Cluster]:
    """A second server, with a database `test`; its sessions read-write until told."""
    bindir = required_binaries()
    with running_cluster(bindir) as cluster:
        with psycopg.connect(cluster.url(), autocommit=True) as admin:
            admin.execute("CREATE DATABASE test")
        yield cluster


def read_only(cluster: Cluster, on: bool) -> None:
    """Make every session of `cluster` read-only (a standby, to libpq), or not. The reload
    reaches the sessions open now a moment later: returns once one of them has it."""
    value = "on" if on else "off"
    with psycopg.connect(cluster.url(), autocommit=True) as admin:
        admin.execute(f"ALTER SYSTEM SET default_transaction_read_only = {value}")
        admin.execute("SELECT pg_reload_conf()")
        deadline = time.monotonic() + 10
        while True:
            row = admin.execute("SHOW default_transaction_read_only").fetchone()
            if row is not None and row[0] == value:
                return
            assert time.monotonic() < deadline, "the reload did not reach a session"
            time.sleep(0.02)


def hosts_url(storage_url: str, *ports: int, form: str = "libpq") -> str:
    """`storage_url` (its user, database and schema) naming the loopback `ports` in order,
    asking for the read-write one: in libpq's form (`h1:p1,h2:p2` before the path), or in
    SQLAlchemy's (`?host=h1:p1&host=h2:p2`)."""
    url = make_url(storage_url)
    options = url.query["options"]
    assert isinstance(options, str)
    query = f"target_session_attrs=read-write&options={options.replace('=', '%3D')}"
    if form == "sqlalchemy":
        hosts = "&".join(f"host=127.0.0.1:{port}" for port in ports)
        return f"postgresql://{url.username}@/{url.database}?{hosts}&{query}"
    hosts = ",".join(f"127.0.0.1:{port}" for port in ports)
    return f"postgresql://{url.username}@{hosts}/{url.database}?{query}"


def primary_port(storage_url: str) -> int:
    """The port of the test session's server, where `storage_url` points."""
    port = make_url(storage_url).port
    assert port is not None
    return port


def schema_of(storage_url: str) -> str:
    options = make_url(storage_url).query["options"]
    assert isinstance(options, str)
    return options.removeprefix("-csearch_path=")


@pytest.mark.parametrize("form", ["libpq", "sqlalchemy"])
async def test_a_dead_host_first_is_passed_over(postgres_storage: Storage, form: str) -> None:
    url = postgres_storage.url()
    await _one_update_reaches(url, hosts_url(url, free_port(), primary_port(url), form=form))


async def test_a_read_only_server_is_passed_over_for_the_read_write_one(
    postgres_storage: Storage, other_server: Cluster
) -> None:
    url = postgres_storage.url()
    read_only(other_server, True)
    try:
        await _one_update_reaches(url, hosts_url(url, other_server.port, primary_port(url)))
    finally:
        read_only(other_server, False)


async def _one_update_reaches(url: str, through: str) -> None:
    """An update added by a store on the several hosts of `through` is in `url`'s table."""
    store = await open_store(through, pool_size=2)
    try:
        assert await store.add("shop", 1, "{}", 0)
    finally:
        await store.close()
    assert table_rows(url, "update_id") == [(1,)]


async def test_a_primary_turned_read_only_is_let_go_for_the_new_one(
    postgres_storage: Storage, other_server: Cluster
) -> None:
    # The store first reaches the other server (read-write, first in the list), then that
    # one turns read-only, as a demoted primary answers: the next statements, by psycopg
    # itself (the insert) and by SQLAlchemy (a lease check), fail as unavailable, and the
    # ones after them reach this session's server, with no restart.
    url = postgres_storage.url()
    primary = primary_port(url)
    schema = schema_of(url)
    other_url = other_server.url("test")
    with psycopg.connect(other_url, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    other_storage = make_url(url).set(port=other_server.port).render_as_string(False)
    upgrade(other_storage)
    store = await open_store(hosts_url(url, other_server.port, primary), pool_size=3)
    try:
        assert await store.add("shop", 1, "{}", 0)  # on the other server, kept connection
        assert await store.prune(before=1) == 0  # and one of the pool's, there too
        read_only(other_server, True)
        with pytest.raises(StoreUnavailable, match="read-only"):
            await store.prune(before=1)  # by SQLAlchemy, on a connection of the pool
        with pytest.raises(StoreUnavailable, match="read-only"):
            await store.add("shop", 2, "{}", 0)  # by psycopg, on the kept connection
        assert await store.add("shop", 3, "{}", 0)  # on this session's server now
        assert await store.prune(before=1) == 0
        assert table_rows(url, "update_id") == [(3,)]
        assert table_rows(other_storage, "update_id") == [(1,)]
    finally:
        await store.close()
        read_only(other_server, False)
        with psycopg.connect(other_url, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.mark.parametrize("form", ["libpq", "sqlalchemy"])
async def test_wake_ups_are_heard_through_several_hosts(
    postgres_storage: Storage, form: str
) -> None:
    # The LISTEN connection is built from the URL as the pool's are: with a dead host first
    # it still reaches the server, where the other store's insert NOTIFYs it.
    url = postgres_storage.url()
    primary = primary_port(url)
    listener = await open_store(hosts_url(url, free_port(), primary, form=form), pool_size=2)
    writer = await open_store(url, pool_size=2)
    woken = asyncio.Event()
    listening = asyncio.Event()
    task = asyncio.create_task(listener.listen(woken.set, listening=listening))
    try:
        async with asyncio.timeout(20):
            await listening.wait()
            woken.clear()  # the wake that follows each (re)connection
            await writer.add("shop", 1, "{}", 0)
            await woken.wait()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await listener.close()
        await writer.close()


@pytest.mark.parametrize("command", ["migrate", "alembic"])
def test_migrate_and_alembic_take_libpqs_multi_host_url(
    postgres_storage: Storage, command: str
) -> None:
    url = postgres_storage.url(revision=None)
    primary = primary_port(url)
    argv = (
        [sys.executable, "-m", "app.cli", "migrate"]
        if command == "migrate"
        else [sys.executable, "-m", "alembic", "upgrade", "head"]
    )
    env = {name: value for name, value in os.environ.items() if not name.startswith("INTAKE_")}
    env["INTAKE_DATABASE_URL"] = hosts_url(url, free_port(), primary)
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert current_revision(url) == HEAD
