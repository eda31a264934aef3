"""The store behind PgBouncer in transaction pooling mode (tests/pgbouncer.py): the conformance
check passes through it with `pgbouncer=True` (INTAKE_DATABASE_PGBOUNCER), and the controls
show what breaks without the setting, with an error that names it."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import pytest
from sqlalchemy import delete

from app.store import SqlUpdateStore, StoreUnavailable, UpdateStore, open_store
from app.store.conformance.check import check_update_store
from tests import pgbouncer
from tests.pgbouncer import BouncedStorage


def emptied_stores(url: str, **options: object) -> Callable[[], Awaitable[SqlUpdateStore]]:
    """`make_store` for the check: stores on one migrated database, emptied first (as
    tests/store/test_conformance.py does), recording events, opened with `options`."""

    async def make_store() -> SqlUpdateStore:
        opened = await open_store(url, events=True, **options)  # type: ignore[arg-type]
        async with opened.engine.begin() as connection:
            for table in opened.table.metadata.sorted_tables:  # with revision 0004's
                await connection.execute(delete(table))
        return opened

    return make_store


@pytest.mark.parametrize(("revision", "level"), [("0001", "base"), ("head", "durable")])
async def test_store_conforms_behind_pgbouncer(
    pgbouncer_storage: BouncedStorage, revision: str, level: str
) -> None:
    # The service's default timeouts too: behind PgBouncer they must not stop the connection.
    stores = emptied_stores(
        pgbouncer_storage.url(revision),
        pgbouncer=True,
        statement_timeout_ms=30_000,
        lock_timeout_ms=5_000,
    )

    async def make_store() -> UpdateStore:
        store = await stores()
        assert store.capability == level
        return store

    assert await check_update_store(make_store) == []


async def _ping_often(url: str, **options: object) -> None:
    """A store's connection runs one statement past psycopg's prepare threshold (5 uses)."""
    store = await open_store(url, **options)  # type: ignore[arg-type]
    try:
        for _ in range(8):
            await store.ping()
    finally:
        await store.close()


async def test_behind_pgbouncer_without_the_setting_a_store_is_refused_at_connect(
    pgbouncer_storage: BouncedStorage,
) -> None:
    # The service's sessions send `jit=off` (and their timeouts) in the startup `options`,
    # which PgBouncer refuses: a store not told of the pooler fails at once, naming the
    # setting, rather than meeting another client's prepared statement later on a shared
    # session (`prepared statement "_pg3_0" already exists`, what it met before).
    with pytest.raises(StoreUnavailable, match="unsupported startup parameter") as raised:
        await _ping_often(pgbouncer_storage.url())
    assert "INTAKE_DATABASE_PGBOUNCER" in str(raised.value)
    # With the setting nothing is sent and nothing is prepared, however often a statement runs.
    url = pgbouncer_storage.url()
    for _ in range(3):
        await _ping_often(url, pgbouncer=True)


async def test_timeouts_sent_at_connect_are_refused_by_pgbouncer_without_the_setting(
    pgbouncer_storage: BouncedStorage,
) -> None:
    with pytest.raises(StoreUnavailable, match="unsupported startup parameter") as raised:
        await open_store(pgbouncer_storage.url(), statement_timeout_ms=30_000)
    assert "INTAKE_DATABASE_PGBOUNCER" in str(raised.value)


async def test_behind_pgbouncer_the_timeouts_are_the_servers_and_a_difference_is_told(
    pgbouncer_storage: BouncedStorage, caplog: pytest.LogCaptureFixture
) -> None:
    url = pgbouncer_storage.url()
    timeouts = {"statement_timeout_ms": 30_000, "lock_timeout_ms": 5_000}
    with caplog.at_level(logging.WARNING, logger="app.store.backends"):
        await _ping_often(url, pgbouncer=True, **timeouts)
    told = [r.getMessage() for r in caplog.records if "INTAKE_DATABASE_PGBOUNCER" in r.getMessage()]
    assert len(told) == 1, told  # once, at the first connection
    assert "statement_timeout = 30000, lock_timeout = 5000" in told[0]
    assert "ALTER ROLE" in told[0]

    # Set on the server (for the database here; for the role in production): nothing to tell.
    url = pgbouncer_storage.url(statement_timeout=30_000, lock_timeout=5_000)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="app.store.backends"):
        await _ping_often(url, pgbouncer=True, **timeouts)
    assert [r.getMessage() for r in caplog.records] == []


@pytest.mark.parametrize(
    ("ci", "outcome"), [("true", pytest.fail.Exception), ("", pytest.skip.Exception)]
)
def test_a_missing_pgbouncer_fails_under_ci_and_skips_elsewhere(
    monkeypatch: pytest.MonkeyPatch, ci: str, outcome: type[BaseException]
) -> None:
    monkeypatch.setattr(pgbouncer.shutil, "which", lambda *_, **__: None)
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="pgbouncer is not installed"):
        pgbouncer.require_binary()
