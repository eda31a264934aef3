"""The SQL store beyond the conformance rules: bad input, URLs, errors, capability."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.engine import make_url

from app.store import (
    ClaimIdentity,
    Completed,
    Failed,
    NewUpdate,
    SchemaError,
    StoreUnavailable,
    open_store,
    open_store_waiting,
)
from app.store.backends.sqlite import SqliteBackend
from app.store.engine import normalise_url
from app.store.migrate import upgrade
from app.store.records import methods as record_methods
from tests.conftest import Storage

GOOD = {"bot": "shop", "update_id": 7, "body": '{"update_id": 7}', "received_at": 0}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("bot", "Shop"),
        ("bot", ""),
        ("bot", "a" * 33),
        ("bot", "-shop"),
        ("bot", "shop; DROP TABLE x"),
        ("update_id", -1),
        ("update_id", 1.5),
        ("update_id", "7"),
        ("update_id", True),
        ("update_id", 2**63),
        ("body", b"{}"),
        ("received_at", 1.0),
        ("received_at", None),
    ],
)
async def test_add_rejects_bad_input_naming_it_and_writes_nothing(
    storage: Storage, field: str, value: Any
) -> None:
    store = await open_store(storage.url())
    try:
        with pytest.raises(ValueError, match=repr(value).replace("(", r"\(").replace("[", r"\[")):
            await store.add(**{**GOOD, field: value})
        assert await store.due(now=1, pending_before=1, limit=10) == []
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ('{"update_id": 7, "text": "a\x00b"}', "NUL character"),
        ('{"update_id": 7, "text": "\ud800"}', "not valid UTF-8"),
    ],
)
async def test_add_rejects_a_body_a_backend_cannot_store(
    storage: Storage, body: str, named: str
) -> None:
    store = await open_store(storage.url())
    try:
        with pytest.raises(ValueError, match=named):
            await store.add(**{**GOOD, "body": body})
        assert await store.due(now=1, pending_before=1, limit=10) == []
    finally:
        await store.close()


@pytest.mark.parametrize(
    "trace_context",
    [
        "",
        "00-" + "0" * 32 + "-" + "cd" * 8 + "-01",  # an all-zero trace id is invalid
        "00-" + "ab" * 16 + "-" + "0" * 16 + "-01",  # so is an all-zero parent id
        "01-" + "ab" * 16 + "-" + "cd" * 8 + "-01",  # a version this does not read
        "00-" + "AB" * 16 + "-" + "cd" * 8 + "-01",  # upper case
        "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01\n",
        42,
    ],
)
async def test_a_new_update_s_trace_context_must_be_a_traceparent(
    storage: Storage, trace_context: Any
) -> None:
    store = await open_store(storage.url())
    try:
        with pytest.raises(ValueError, match=r"trace_context .* is not a W3C traceparent"):
            await store.add_many(
                [NewUpdate("shop", 7, '{"update_id": 7}', 1, None, None, trace_context)]
            )
        assert await store.due(now=1, pending_before=1, limit=10) == []
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"now": 10, "lease_until": 10}, "lease_until 10"),
        ({"now": 10, "lease_until": 5}, "lease_until 5"),
        ({"max_attempts": 0}, "max_attempts 0"),
        ({"max_attempts": -2}, "max_attempts -2"),
        ({"max_attempts": 2**31}, "max_attempts 2147483648"),
        ({"durable_exhaustion": 1}, "durable_exhaustion 1"),
        ({"now": 10.5}, "now 10.5"),
        ({"update_id": -3}, "update_id -3"),
    ],
)
async def test_claim_rejects_bad_input_and_leaves_the_row_pending(
    storage: Storage, arguments: dict[str, Any], named: str
) -> None:
    store = await open_store(storage.url())
    try:
        await store.add(**GOOD)
        call = {"bot": "shop", "update_id": 7, "now": 10, "lease_until": 100, "max_attempts": 2}
        with pytest.raises(ValueError, match=named):
            await store.claim_owned(**{**call, **arguments})
        assert await store.claim("shop", 7, now=10, lease_until=100, max_attempts=2) == 1
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: Completed(1.5), "at 1.5"),
        (lambda: Failed(10, 5, "retry before the failure"), "retry_at 5"),
        (lambda: Failed(10, 20, None), "error None"),
        (lambda: ClaimIdentity("shop", 1, 0, "id"), "attempt 0"),
        (lambda: ClaimIdentity("shop", 1, 1, ""), "claim_id ''"),
        (lambda: ClaimIdentity("Shop", 1, 1, "id"), "bot name 'Shop'"),
    ],
)
def test_settlements_and_identities_reject_bad_values(make: Any, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        make()


async def test_transitions_reject_bad_arguments_before_any_statement(storage: Storage) -> None:
    store = await open_store(storage.url())
    try:
        await store.add(**GOOD)
        identity = await store.claim_owned("shop", 7, now=10, lease_until=100, max_attempts=2)
        assert identity is not None
        with pytest.raises(ValueError, match="settlement"):
            await store.settle_owned(identity, "completed")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="at '50'"):
            await store.owns(identity, "50")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="ordering 'fifo'"):
            await store.claim_next_owned(
                now=1,
                lease_until=2,
                max_attempts=1,
                limit=1,
                ordering="fifo",  # type: ignore[arg-type]
            )
        with pytest.raises(ValueError, match="bots 'shop'"):
            await store.claim_next_owned(now=1, lease_until=2, max_attempts=1, limit=1, bots="shop")
        with pytest.raises(ValueError, match="limit 0"):
            await store.due(now=1, pending_before=1, limit=0)
        with pytest.raises(ValueError, match="cursor"):
            await store.due_exhaustions(limit=1, after=("shop",))  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="error None"):
            await store.exhaust(identity, 50, None)  # type: ignore[arg-type]
        assert await store.owns(identity, 50)
    finally:
        await store.close()


@pytest.mark.parametrize("table", ["Updates", "1updates", "updates; DROP TABLE x", "a" * 41, ""])
async def test_open_store_rejects_a_bad_table_name(storage: Storage, table: str) -> None:
    with pytest.raises(ValueError, match="table name"):
        await open_store(storage.url(), table=table)


async def test_open_store_on_a_missing_table_names_the_upgrade(storage: Storage) -> None:
    with pytest.raises(SchemaError, match="alembic upgrade head"):
        await open_store(storage.url(revision=None))


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("sqlite:///var/x.db", "sqlite+aiosqlite:///var/x.db"),
        ("sqlite+aiosqlite:///var/x.db", "sqlite+aiosqlite:///var/x.db"),
        ("postgresql://u@h/db", "postgresql+psycopg://u@h/db"),
        ("postgres://u@h/db", "postgresql+psycopg://u@h/db"),
        ("postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),
    ],
)
def test_normalise_url_maps_plain_urls_onto_our_drivers(given: str, expected: str) -> None:
    assert normalise_url(given).render_as_string() == expected


LIBPQ_DIALECT = PGDialect_psycopg()


@pytest.mark.parametrize(
    ("given", "hosts", "ports", "rest"),
    [
        (  # libpq's form, as Patroni and managed services print it
            "postgresql://u:p@h1:5432,h2:5433/db?target_session_attrs=read-write",
            "h1,h2",
            "5432,5433",
            {"dbname": "db", "user": "u", "password": "p", "target_session_attrs": "read-write"},
        ),
        ("postgres://u@h1,h2:6000/db", "h1,h2", ",6000", {"dbname": "db", "user": "u"}),
        ("postgresql://u@[::1]:5432,[fe80::2]/db", "::1,fe80::2", "5432,", {"dbname": "db"}),
        ("postgresql://u@h1:1,h2:2?sslmode=require", "h1,h2", "1,2", {"sslmode": "require"}),
        (  # SQLAlchemy's own form, as it is
            "postgresql://u@/db?host=h1:5432&host=h2:5433&target_session_attrs=read-write",
            "h1,h2",
            "5432,5433",
            {"dbname": "db", "target_session_attrs": "read-write"},
        ),
        ("postgresql://u@/db?host=h1,h2&port=1,2", "h1,h2", "1,2", {"dbname": "db"}),
    ],
)
def test_normalise_url_reads_several_hosts_in_libpqs_form_and_sqlalchemys(
    given: str, hosts: str, ports: str, rest: dict[str, str]
) -> None:
    url = normalise_url(given)
    _, arguments = LIBPQ_DIALECT.create_connect_args(url)
    assert url.drivername == "postgresql+psycopg"
    assert (arguments.pop("host"), arguments.pop("port")) == (hosts, ports)
    assert rest.items() <= arguments.items()
    # The form settings keep (rendered) reads back the same.
    again = normalise_url(url.render_as_string(hide_password=False))
    assert LIBPQ_DIALECT.create_connect_args(again)[1] == {
        **arguments,
        "host": hosts,
        "port": ports,
    }


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("postgresql://u@h1:1,h2:x/db", "not a host"),
        ("postgresql://u@h1,,h2/db", "not a host"),
        ("postgresql://u@h1,h2/db?host=h3", "both"),
        ("postgresql://u@h1,h2/db?port=5", "both"),
    ],
)
def test_normalise_url_refuses_hosts_it_cannot_read(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        normalise_url(url)


def test_one_host_and_sqlite_paths_with_commas_are_left_as_they_are() -> None:
    assert normalise_url("postgresql://u@h:5/db").render_as_string() == (
        "postgresql+psycopg://u@h:5/db"
    )
    assert normalise_url("sqlite:///var/a,b.db").database == "var/a,b.db"


@pytest.mark.parametrize("url", ["mysql://u@h/db", "postgresql+asyncpg://u@h/db"])
def test_normalise_url_refuses_other_databases_and_drivers(url: str) -> None:
    with pytest.raises(ValueError, match="use"):
        normalise_url(url)


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "sqlite:///file:x?mode=memory"])
async def test_an_in_memory_sqlite_database_is_refused_naming_why(url: str) -> None:
    with pytest.raises(ValueError, match="loses every recorded update"):
        await open_store(url)


async def test_unreachable_postgres_is_store_unavailable() -> None:
    with pytest.raises(StoreUnavailable):
        await open_store("postgresql://postgres@127.0.0.1:1/test")


async def test_waiting_for_the_database_tries_again_then_gives_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    started = asyncio.get_running_loop().time()
    with pytest.raises(StoreUnavailable):
        await open_store_waiting("postgresql://postgres@127.0.0.1:1/test", wait=1.0)
    assert asyncio.get_running_loop().time() - started >= 1.0
    assert sum("trying again" in r.getMessage() for r in caplog.records) >= 2


async def test_waiting_for_the_database_does_not_wait_for_a_refusal(
    postgres_storage: Storage,
) -> None:
    # A database that does not exist will not exist in a minute either: refused at once.
    url = make_url(postgres_storage.url()).set(database="no_such_db")
    started = asyncio.get_running_loop().time()
    with pytest.raises(StoreUnavailable, match="does not exist"):
        await open_store_waiting(url.render_as_string(hide_password=False), wait=30.0)
    assert asyncio.get_running_loop().time() - started < 10


async def test_waiting_for_the_database_does_not_wait_for_its_schema(
    postgres_storage: Storage,
) -> None:
    # Up but not migrated is no gap to wait out: refused at once, naming the upgrade.
    started = asyncio.get_running_loop().time()
    with pytest.raises(SchemaError):
        await open_store_waiting(postgres_storage.url(revision=None), wait=30.0)
    assert asyncio.get_running_loop().time() - started < 10


async def test_sqlite_store_uses_wal_and_full_sync(sqlite_storage: Storage) -> None:
    store = await open_store(sqlite_storage.url())
    try:
        async with store.engine.connect() as connection:
            mode = (await connection.exec_driver_sql("PRAGMA journal_mode")).scalar()
            sync = (await connection.exec_driver_sql("PRAGMA synchronous")).scalar()
        assert (mode, sync) == ("wal", 2)  # 2 is FULL
        # The writer's own connection (the intake's insert, the claims, the batch settle) too.
        backend = store._backend
        assert isinstance(backend, SqliteBackend)
        asked = [text("PRAGMA journal_mode"), text("PRAGMA synchronous")]
        rows = await backend._writer.run_each(lambda t: [t.execute(q)[0][0] for q in asked])
        assert rows == ["wal", 2]
    finally:
        await store.close()


async def test_the_longest_table_name_migrates_and_serves(storage: Storage) -> None:
    table = "t" * 40  # every name derived from it fits PostgreSQL's 63 characters
    url = storage.url(revision=None)
    upgrade(url, table=table)
    store = await open_store(url, table=table)
    try:
        assert store.capability == "durable"
        assert await store.add("shop", 1, "{}", 0)
        assert await store.claim_owned("shop", 1, now=1, lease_until=2, max_attempts=1)
    finally:
        await store.close()


async def test_sqlite_file_uri_serves_reads_beside_writes(sqlite_storage: Storage) -> None:
    path = sqlite_storage.url(revision=None).removeprefix("sqlite+aiosqlite:///")
    url = f"sqlite+aiosqlite:///file:{path}?mode=rwc&uri=true"
    upgrade(url)
    store = await open_store(url)
    try:
        for update_id in range(20):
            await asyncio.gather(
                store.add("shop", update_id, "{}", 0),
                store.due(now=1, pending_before=1, limit=100),
            )
        assert len(await store.due(now=1, pending_before=1, limit=100)) == 20
    finally:
        await store.close()


def test_a_pool_checkout_timeout_is_unavailability() -> None:
    from sqlalchemy import exc

    from app.store.errors import translated_errors

    with pytest.raises(StoreUnavailable, match="database unavailable"), translated_errors("t"):
        raise exc.TimeoutError("QueuePool limit of size 10 overflow 10 reached")


async def test_prune_deletes_in_bounded_batches_until_none_is_left(
    storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(record_methods, "PRUNE_BATCH", 3)
    store = await open_store(storage.url())
    try:
        statements: list[str] = []
        original = store.transaction

        def counted() -> Any:
            statements.append("transaction")
            return original()

        monkeypatch.setattr(store, "transaction", counted)
        for update_id in range(1, 11):
            await store.add("shop", update_id, f'{{"update_id": {update_id}}}', 0)
            attempt = await store.claim("shop", update_id, now=1, lease_until=5, max_attempts=3)
            assert attempt == 1
            await store.settle("shop", update_id, 1, Completed(2))
        await store.add("shop", 11, '{"update_id": 11}', 0)  # pending: never pruned
        statements.clear()
        assert await store.prune(100) == 10
        assert len(statements) == 4  # 3 + 3 + 3 + 1, each its own transaction
        assert [u.update_id for u in await store.due(now=100, pending_before=100, limit=20)] == [11]
    finally:
        await store.close()


@pytest.mark.parametrize("ordering", ["none", "chat"])
async def test_claim_next_owned_breaks_due_at_ties_by_key(storage: Storage, ordering: str) -> None:
    """Rows due at the same instant are taken in key order, whatever order they were written
    in: one table state gives one claim. Left to the index, ties went in the rows' physical
    order, which vacuum and free space decide (the model test's replays then diverged)."""
    store = await open_store(storage.url())
    try:
        for update_id in (3, 1, 4, 2):
            await store.add("shop", update_id, f'{{"update_id": {update_id}}}', 10)
        taken = await store.claim_next_owned(
            now=20,
            lease_until=30,
            max_attempts=3,
            limit=2,
            ordering=ordering,  # type: ignore[arg-type]
        )
        assert [c.identity.update_id for c in taken] == [1, 2]
    finally:
        await store.close()
