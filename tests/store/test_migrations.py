"""Alembic migrations on both backends: the schema they build, the rows they keep, the way
back, the fence on an old table, the command line, and processes that migrate at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from subprocess import PIPE
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, inspect, text
from sqlalchemy.exc import IntegrityError

from app.queues import queue_of
from app.store import ClaimIdentity, Completed, DueUpdate, SchemaError, SqlUpdateStore, open_store
from app.store.engine import create_sync_engine
from app.store.migrate import current_revision, downgrade, upgrade
from app.store.predicates import NON_TERMINAL
from app.store.schema import (
    DEFAULT_TABLE,
    HEAD,
    QUEUE_RULE,
    make_metadata,
    owns_function_name,
    version_table_name,
)
from tests.conftest import Storage, table_rows

ROOT = Path(__file__).resolve().parents[2]
TABLE = DEFAULT_TABLE
BASE_COLUMNS = tuple(make_metadata(revision="0001").tables[TABLE].c.keys())
NEW_COLUMNS = ("claim_id", "exhausted_at", "acknowledged_at")
BUDGET_COLUMNS = ("uncounted", "delivery_due_at", "deliveries")  # revision 0003
NOW = 1_800_000_000_000
LEASE = {"now": NOW, "lease_until": NOW + 30_000, "max_attempts": 3}
TOP = 2**63 - 1
BODY = '{"text": "Привет, 世界 👋🏽 naïve e\u0301 שלום \\"q\\" \'s\'\n\t\\\\"}'
# One row per state; in each column the non-NULL values all differ.
ROWS = [
    dict(zip(BASE_COLUMNS, values, strict=True))
    for values in [
        ("bot-a", TOP, BODY, "message", "chat:-1001", "pending", 0, NOW - 1, NOW - 1, None, None),
        ("bot-b", 1, "é" * 50_000, None, "chat:7", "processing", 1, NOW + 9, NOW - 2, None, "502"),
        ("bot-c", 2**31, "{}", "edited", None, "completed", 2, NOW - 3, NOW - 30, NOW - 3, None),
        ("bot-d", 0, "🚀", "callback", "", "failed", 3, NOW + 60_000, NOW - 40, None, "Ошибка"),
        ("bot-e", TOP - 1, " ", "post", "🚀", "abandoned", 5, NOW - 50, NOW - 70, NOW - 50, "x"),
    ]
]


@contextmanager
def _connect(url: str) -> Iterator[Connection]:
    """A synchronous connection in one committed transaction, as Alembic's own."""
    engine = create_sync_engine(url)
    try:
        with engine.connect() as connection, connection.begin():
            yield connection
    finally:
        engine.dispose()


@asynccontextmanager
async def _opened(url: str) -> AsyncIterator[SqlUpdateStore]:
    store = await open_store(url)
    try:
        yield store
    finally:
        await store.close()


def _insert(url: str, rows: list[dict[str, Any]]) -> None:
    with _connect(url) as connection:
        for row in rows:
            names, values = ", ".join(row), ", ".join(f":{name}" for name in row)
            connection.execute(text(f"INSERT INTO {TABLE} ({names}) VALUES ({values})"), row)


def _as_tuples(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [tuple(row[name] for name in BASE_COLUMNS) for row in rows]


def _after_0006(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows as revision 0006 leaves them: each one that may still be delivered (open, or
    an exhaustion not acknowledged) keyed by Telegram's queue (`app.queues`, none for a body
    that is not an update); the others as they were."""
    kept = []
    for row in rows:
        reopens = row.get("exhausted_at") is not None and row.get("acknowledged_at") is None
        if row["state"] in NON_TERMINAL or reopens:
            try:
                update = json.loads(row["body"])
            except ValueError:
                update = None
            payload = update.get(row["update_type"]) if isinstance(update, dict) else None
            row = row | {"queue_key": queue_of(row["update_type"] or "", payload)}
        kept.append(row)
    return kept


def _columns(url: str) -> set[str] | None:
    with _connect(url) as connection:
        inspector = inspect(connection)
        if not inspector.has_table(TABLE):
            return None
        return {column["name"] for column in inspector.get_columns(TABLE)}


def _autogenerate_diff(url: str, revision: str) -> list[Any]:
    # compare_type and compare_server_default are on: a BIGINT that came out INTEGER, or a
    # default the migration added but the metadata lacks, counts as a difference.
    opts = {
        "version_table": version_table_name(TABLE),
        "compare_type": True,
        "compare_server_default": True,
    }
    with _connect(url) as connection:
        context = MigrationContext.configure(connection, opts=opts)
        return list(compare_metadata(context, make_metadata(TABLE, revision)))


def _indexes_and_checks(url: str) -> tuple[list[Any], list[Any]]:
    """What autogenerate does not compare: partial-index predicates and CHECK constraints."""
    with _connect(url) as connection:
        inspector = inspect(connection)
        indexes = [
            (ix["name"], ix["column_names"], bool(ix["unique"]), str(where))
            for ix in inspector.get_indexes(TABLE)
            for where in [ix.get("dialect_options", {}).get(f"{connection.dialect.name}_where")]
        ]
        checks = [(ck["name"], ck["sqltext"]) for ck in inspector.get_check_constraints(TABLE)]
    return sorted(indexes), sorted(checks)


def _assert_schema_is(storage: Storage, url: str, revision: str) -> None:
    assert _autogenerate_diff(url, revision) == []
    # The reference is the metadata's own DDL on the same server, so both sides are spelled
    # the way this backend reflects them (PostgreSQL rewrites `IN (...)` as `= ANY (ARRAY...)`).
    reference = storage.url(None)
    with _connect(reference) as connection:
        make_metadata(TABLE, revision).create_all(connection)
    assert _indexes_and_checks(url) == _indexes_and_checks(reference)


def _owns_function_exists(url: str) -> bool:
    query = "SELECT count(*) FROM pg_proc WHERE proname = :name AND pronamespace = "
    query += "current_schema()::regnamespace"
    with _connect(url) as connection:
        return bool(connection.scalar(text(query), {"name": owns_function_name(TABLE)}))


@pytest.mark.parametrize("revision", ["0001", "0002", "0003", "0009", "0010", "0011"])
def test_upgrade_matches_the_metadata_of_its_revision(storage: Storage, revision: str) -> None:
    _assert_schema_is(storage, storage.url(revision), revision)


def test_0004_keeps_search_indexes_an_operator_built_first(
    postgres_storage: Storage,
) -> None:
    """docs/store.md's way to upgrade a large PostgreSQL table: the search indexes built
    CONCURRENTLY (writes go on) before `alembic upgrade head`, which keeps them (the same
    index: its oid, found through this schema's search_path, is unchanged)."""
    url = postgres_storage.url("0003")
    _insert(url, ROWS)
    engine = create_sync_engine(url)
    try:
        with engine.connect() as connection:
            autocommit = connection.execution_options(isolation_level="AUTOCOMMIT")
            autocommit.execute(
                text(
                    f"CREATE INDEX CONCURRENTLY ix_{TABLE}_chat"
                    f" ON {TABLE} (bot, queue_key, received_at, update_id)"
                )
            )
            built = autocommit.scalar(
                text("SELECT to_regclass(:name)::oid"), {"name": f"ix_{TABLE}_chat"}
            )
    finally:
        engine.dispose()
    upgrade(url, "head", table=TABLE)
    _assert_schema_is(postgres_storage, url, HEAD)
    with _connect(url) as connection:
        kept = connection.scalar(
            text("SELECT to_regclass(:name)::oid"), {"name": f"ix_{TABLE}_chat"}
        )
    assert kept == built


async def test_upgrade_keeps_rows_in_every_state(storage: Storage) -> None:
    url = storage.url("0001")
    _insert(url, ROWS)

    upgrade(url)

    assert table_rows(url, *BASE_COLUMNS) == _as_tuples(_after_0006(ROWS))
    assert table_rows(url, *NEW_COLUMNS) == [(None, None, None)] * len(ROWS)
    assert table_rows(url, *BUDGET_COLUMNS) == [(0, None, 0)] * len(ROWS)
    async with _opened(url) as store:
        assert store.capability == "durable"
        identity = await store.claim_owned("bot-a", TOP, **LEASE)
        assert identity is not None
        assert (identity.bot, identity.update_id, identity.attempt) == ("bot-a", TOP, 1)


async def test_downgrade_to_0001_and_back(storage: Storage) -> None:
    url = storage.url("head")
    fenced = {"claim_id": "c-b", "exhausted_at": None, "acknowledged_at": None}
    exhausted = {"claim_id": "c-e", "exhausted_at": NOW - 50, "acknowledged_at": NOW - 5}
    rows = [*ROWS[:1], ROWS[1] | fenced, *ROWS[2:4], ROWS[4] | exhausted]
    # As this code records them (queue_rule set): their keys stand as written.
    _insert(url, [row | {"queue_rule": QUEUE_RULE} for row in rows])
    if storage.backend == "postgresql":
        assert _owns_function_exists(url)

    downgrade(url, "0001")

    # The way down gives open rows the key of the release before 0006; these bodies hold no
    # id, so they get none, as under 0006.
    assert table_rows(url, *BASE_COLUMNS) == _as_tuples(_after_0006(ROWS))
    assert _columns(url) == set(BASE_COLUMNS)
    _assert_schema_is(storage, url, "0001")
    async with _opened(url) as store:
        assert store.capability == "base"
    if storage.backend == "postgresql":
        assert not _owns_function_exists(url)

    upgrade(url)

    assert table_rows(url, *BASE_COLUMNS) == _as_tuples(_after_0006(ROWS))
    # The 0002 columns were dropped on the way down.
    assert table_rows(url, *NEW_COLUMNS) == [(None, None, None)] * len(ROWS)
    _assert_schema_is(storage, url, HEAD)
    async with _opened(url) as store:
        assert store.capability == "durable"

    downgrade(url, "base")

    assert _columns(url) is None
    assert current_revision(url) is None


async def test_downgrade_below_0002_refuses_to_lose_an_open_exhaustion(storage: Storage) -> None:
    url = storage.url("head")
    open_exhaustion = {"claim_id": "c-e", "exhausted_at": NOW - 50, "acknowledged_at": None}
    _insert(url, [ROWS[4] | open_exhaustion])

    with pytest.raises(RuntimeError, match="1 unacknowledged exhaustions"):
        downgrade(url, "0001")

    assert current_revision(url) == HEAD
    assert table_rows(url, *NEW_COLUMNS) == [("c-e", NOW - 50, None)]


async def test_0003_makes_open_exhaustions_due_for_delivery_and_goes_back_losing_nothing(
    storage: Storage,
) -> None:
    url = storage.url("0002")
    open_exhaustion = {"claim_id": "c-e", "exhausted_at": NOW - 50, "acknowledged_at": None}
    acknowledged = {"claim_id": "c-b", "exhausted_at": NOW - 60, "acknowledged_at": NOW - 5}
    rows = [*ROWS[:3], ROWS[3] | acknowledged, ROWS[4] | open_exhaustion]
    _insert(url, rows)

    upgrade(url)

    # Only the open exhaustion is due for delivery: at once, as it was under 0002.
    assert table_rows(url, *BUDGET_COLUMNS) == [(0, None, 0)] * 4 + [(0, NOW - 50, 0)]
    async with _opened(url) as store:
        taken = await store.take_exhaustions(
            now=NOW, lease_until=NOW + 1_000, limit=10, bots=["bot-d", "bot-e"]
        )
        assert [e.identity for e in taken] == [ClaimIdentity("bot-e", TOP - 1, 5, "c-e")]

    downgrade(url, "0002")

    assert table_rows(url, *BASE_COLUMNS, *NEW_COLUMNS) == [
        tuple(row.get(name) for name in (*BASE_COLUMNS, *NEW_COLUMNS)) for row in _after_0006(rows)
    ]
    _assert_schema_is(storage, url, "0002")


async def test_0005_gives_each_earlier_audit_entry_its_bots(storage: Storage) -> None:
    url = storage.url("0004")
    entries = [  # (action, target, detail) as 0004's store wrote them
        ("pause", "bot-a", '{"reason": "a-private"}'),
        ("rate_limit", "bot-b", '{"per_second": 2.0}'),
        ("park", "bot-b/7", '{"attempt": 1, "reason": "b-private"}'),
        ("redrive", "bot-a", '{"identities": ["bot-a/1/2"]}'),
        ("acknowledge", "bot-a,bot-b", '{"identities": ["bot-a/1/2", "bot-b/3/1"]}'),
        ("acknowledge", "exhaustions", '{"filter": {"bots": ["exhaustions"]}}'),
        ("redrive", "exhaustions", '{"filter": {"chat": "42"}}'),  # every bot
    ]
    with _connect(url) as connection:
        for at, (action, target, detail) in enumerate(entries, start=1):
            connection.execute(
                text(
                    f"INSERT INTO {TABLE}_audit (at, key_name, action, target, detail) "
                    "VALUES (:at, 'ops', :action, :target, :detail)"
                ),
                {"at": at, "action": action, "target": target, "detail": detail},
            )

    upgrade(url)

    async with _opened(url) as store:

        async def seen(bots: list[str] | None) -> list[int]:
            return [entry.at for entry in await store.audit_log(bots=bots)]

        assert await seen(None) == [7, 6, 5, 4, 3, 2, 1]
        assert await seen(["bot-a"]) == [4, 1]
        assert await seen(["bot-b"]) == [3, 2]
        assert await seen(["bot-a", "bot-b"]) == [5, 4, 3, 2, 1]
        assert await seen(["exhaustions"]) == [6]  # a bot of that name: its filter named it
    downgrade(url, "0004")
    _assert_schema_is(storage, url, "0004")
    with _connect(url) as connection:  # the audit log itself stays
        assert connection.scalar(text(f"SELECT count(*) FROM {TABLE}_audit")) == 7


async def test_a_0002_table_serves_plain_bots_and_names_the_upgrade_for_the_rest(
    storage: Storage,
) -> None:
    url = storage.url("0002")
    async with _opened(url) as store:
        assert store.capability == "base"
        assert await store.add("bot-a", 1, BODY, NOW - 1)
        assert await store.claim("bot-a", 1, **LEASE) == 1
        with pytest.raises(SchemaError, match=r"revision 0002 .*alembic upgrade head"):
            await store.claim_next_owned(limit=10, **LEASE)


IDENTITY = ClaimIdentity("bot-a", 1, 1, "c")
FENCED: Mapping[str, Callable[[SqlUpdateStore], Any]] = {
    "claim_owned": lambda store: store.claim_owned("bot-a", 1, **LEASE),
    "claim_next_owned": lambda store: store.claim_next_owned(limit=10, **LEASE),
    "exhaust": lambda store: store.exhaust(IDENTITY, NOW, "boom"),
    "renew_owned": lambda store: store.renew_owned(IDENTITY, NOW + 1),
    "owns": lambda store: store.owns(IDENTITY, NOW),
    "settle_owned": lambda store: store.settle_owned(IDENTITY, Completed(NOW)),
    "settle_many_owned": lambda store: store.settle_many_owned([(IDENTITY, Completed(NOW))]),
    "acknowledge_exhaustion": lambda store: store.acknowledge_exhaustion(IDENTITY, NOW),
    "due_exhaustions": lambda store: store.due_exhaustions(limit=10),
    "claim_durable": lambda store: store.claim("bot-a", 1, durable_exhaustion=True, **LEASE),
}


@pytest.mark.parametrize("feature", list(FENCED))
async def test_fenced_feature_on_0001_names_the_upgrade(storage: Storage, feature: str) -> None:
    url = storage.url("0001")
    async with _opened(url) as store:
        assert await store.add("bot-a", 1, BODY, NOW - 1)

        with pytest.raises(SchemaError, match="alembic upgrade head"):
            await FENCED[feature](store)

        # Nothing was written: the row is still pending, with no attempt spent.
        assert table_rows(url, *("state", "attempts")) == [("pending", 0)]


async def test_base_methods_on_0001_work(storage: Storage) -> None:
    async with _opened(storage.url("0001")) as store:
        assert await store.add("bot-a", 1, BODY, NOW - 1)
        assert await store.due(now=NOW, pending_before=NOW, limit=10) == [
            DueUpdate("bot-a", 1, BODY, None, NOW - 1)
        ]
        attempt = await store.claim("bot-a", 1, **LEASE)
        assert attempt == 1
        assert await store.renew("bot-a", 1, attempt, NOW + 60_000, now=NOW + 1)
        await store.settle("bot-a", 1, attempt, Completed(at=NOW + 2))
        assert await store.due(now=NOW + 99_000, pending_before=NOW + 99_000, limit=10) == []
        assert await store.prune(NOW + 3) == 1


async def test_open_store_on_empty_database_names_the_upgrade(storage: Storage) -> None:
    with pytest.raises(SchemaError, match="alembic upgrade head"):
        await open_store(storage.url(None))


def _run(*args: str, env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
    command = [sys.executable, "-W", "error", *args]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("INTAKE_")}
    environment.update(env or {})
    return subprocess.Popen(command, cwd=ROOT, env=environment, text=True, stdout=PIPE, stderr=PIPE)


def _finish(process: subprocess.Popen[str]) -> str:
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    return stdout


@pytest.mark.slow  # the alembic command line, a real process
@pytest.mark.xdist_group("untimed")  # measures no time: beside the serial group
def test_alembic_command_line_uses_intake_database_url(storage: Storage) -> None:
    url = storage.url(None)
    env = {"INTAKE_DATABASE_URL": url}

    _finish(_run("-m", "alembic", "upgrade", "head", env=env))
    assert current_revision(url) == HEAD

    _finish(_run("-m", "alembic", "downgrade", "base", env=env))
    assert current_revision(url) is None
    assert _columns(url) is None


# Each process signals it is ready, waits for the gate, then migrates and opens the store.
RACER = """
import asyncio, pathlib, sys, time
from app.store import open_store
from app.store.migrate import upgrade

url, ready, gate = sys.argv[1:]
pathlib.Path(ready).touch()
deadline = time.monotonic() + 30
while not pathlib.Path(gate).exists():
    assert time.monotonic() < deadline, "the gate never opened"
    time.sleep(0.001)
upgrade(url)

async def main():
    store = await open_store(url)
    print(store.capability)
    await store.close()

asyncio.run(main())
"""


def _race(url: str, gate_dir: Path, processes: int = 4) -> None:
    gate_dir.mkdir()
    gate = gate_dir / "gate"
    ready = [gate_dir / f"ready-{n}" for n in range(processes)]
    racers = [_run("-c", RACER, url, str(path), str(gate)) for path in ready]
    deadline = time.monotonic() + 30
    while not all(path.exists() for path in ready):
        if any(racer.poll() is not None for racer in racers) or time.monotonic() > deadline:
            break  # _finish reports the racer that died
        time.sleep(0.01)
    gate.touch()

    outcomes = [(racer.communicate(timeout=60), racer.returncode) for racer in racers]
    assert [code for _, code in outcomes] == [0] * processes, [err for (_, err), _ in outcomes]
    assert [out.strip() for (out, _), _ in outcomes] == ["durable"] * processes
    with _connect(url) as connection:
        versions = connection.execute(text(f"SELECT * FROM {version_table_name(TABLE)}"))
        assert [tuple(row) for row in versions] == [(HEAD,)]


@pytest.mark.slow
@pytest.mark.xdist_group("untimed")
def test_four_processes_auto_migrating_one_fresh_sqlite_file_all_succeed(
    sqlite_storage: Storage, tmp_path: Path
) -> None:
    for round_ in range(5):
        _race(sqlite_storage.url(None), tmp_path / f"round-{round_}")


@pytest.mark.slow
@pytest.mark.xdist_group("untimed")
def test_four_processes_auto_migrating_one_fresh_postgres_schema_all_succeed(
    postgres_storage: Storage, tmp_path: Path
) -> None:
    for round_ in range(3):
        _race(postgres_storage.url(None), tmp_path / f"round-{round_}")


@pytest.mark.slow
@pytest.mark.xdist_group("untimed")
def test_upgrade_downgrade_upgrade_keeps_ten_thousand_postgres_rows(
    postgres_storage: Storage,
) -> None:
    # Messages keyed by their chat, as every version keys them (0006 re-keys the open ones
    # to the same key); rows of no type have no key.
    url = postgres_storage.url("0001")
    with _connect(url) as connection:
        connection.execute(
            text(f"""
            INSERT INTO {TABLE} ({", ".join(BASE_COLUMNS)})
            SELECT 'bot-' || g % 7, g,
                   '{{"update_id": ' || g || ', "message": {{"chat": {{"id": -' || (g % 100 + 1)
                   || '}}, "text": "тело ' || g || '"}}}}',
                   CASE WHEN g % 3 > 0 THEN 'message' END,
                   CASE WHEN g % 3 > 0 THEN '-' || (g % 100 + 1) END,
                   (ARRAY['pending', 'processing', 'completed', 'failed', 'abandoned'])[1 + g % 5],
                   g % 4, {NOW} + g, {NOW} - g,
                   CASE WHEN g % 5 IN (2, 4) THEN {NOW} + g END,
                   CASE WHEN g % 5 >= 3 THEN 'error ' || g END
              FROM generate_series(1, 10000) AS g
            """)
        )
    digest = f"""
        SELECT count(*), md5(string_agg(({", ".join(BASE_COLUMNS)})::text, '|'
                                        ORDER BY bot, update_id))
          FROM {TABLE}
    """

    def fingerprint() -> tuple[Any, ...]:
        with _connect(url) as connection:
            return tuple(connection.execute(text(digest)).one())

    before = fingerprint()
    assert before[0] == 10_000
    for step in (lambda: upgrade(url), lambda: downgrade(url, "0001"), lambda: upgrade(url)):
        step()
        assert fingerprint() == before
    assert current_revision(url) == HEAD


def test_revision_0009_names_the_update_of_each_event_recorded_before_it(
    storage: Storage,
) -> None:
    """An erasure deletes the events of the updates it erases by their update: the events an
    older release recorded get theirs from their data (as it wrote them: JSON)."""
    url = storage.url("0008")
    made = json.dumps({"bot": "shop", "update_id": 41, "error": "HTTP 400"})
    engine = create_sync_engine(url)
    try:
        with engine.begin() as connection:
            insert = text(
                "INSERT INTO telegram_updates_events (type, data, created_at, due_at) "
                "VALUES (:type, :data, 1, 1)"
            )
            connection.execute(insert, {"type": "exhaustion.created", "data": made})
            connection.execute(insert, {"type": "bot.paused", "data": '{"bot": "shop"}'})
    finally:
        engine.dispose()
    upgrade(url, "head")
    events = table_rows(url, "type", "bot", "update_id", table="telegram_updates_events")
    assert sorted(events, key=str) == sorted(
        [("exhaustion.created", "shop", 41), ("bot.paused", None, None)], key=str
    )


# Revision 0010 (docs/design.md decision 7): the other destinations beside the update's row.
HELD = {"claim_id": "c-held", "exhausted_at": None, "acknowledged_at": None}
DELIVERY = {
    "bot": "bot-a",
    "destination": "payments",
    "update_id": 5,
    "state": "processing",
    "attempts": 2,
    "due_at": NOW + 30_000,
    "received_at": NOW - 5,
    "claim_id": "c-pay",
}


def _every_column(url: str) -> list[tuple[Any, ...]]:
    return table_rows(url, *make_metadata(TABLE, "0009").tables[TABLE].c.keys())


def _add(url: str, table: str, row: dict[str, Any]) -> None:
    with _connect(url) as connection:
        names, values = ", ".join(row), ", ".join(f":{name}" for name in row)
        connection.execute(text(f"INSERT INTO {table} ({names}) VALUES ({values})"), row)


def test_0010_keeps_every_row_and_lease_and_takes_unrouted_rows(storage: Storage) -> None:
    url = storage.url("0009")
    rows = [*ROWS[:1], ROWS[1] | HELD, *ROWS[2:]]
    _insert(url, [row | {"queue_rule": QUEUE_RULE} for row in rows])
    before = _every_column(url)
    unrouted = ROWS[2] | {"update_id": 77, "state": "unrouted", "queue_rule": QUEUE_RULE}
    with pytest.raises(IntegrityError, match=r"(?i)check"):  # 0009 holds no unrouted row
        _insert(url, [unrouted])
    # A connection opened before the upgrade reads the new CHECK after it (SQLite: the
    # schema version the upgrade raised makes it read the table's SQL again).
    engine = create_sync_engine(url)
    try:
        with engine.connect() as early:
            early.execute(text(f"SELECT count(*) FROM {TABLE}"))
            early.commit()  # its schema read, its transaction ended: the upgrade may lock

            upgrade(url, "0010")

            with early.begin():
                names, values = ", ".join(unrouted), ", ".join(f":{n}" for n in unrouted)
                early.execute(text(f"INSERT INTO {TABLE} ({names}) VALUES ({values})"), unrouted)
    finally:
        engine.dispose()

    # Every row as it was, the held lease with its attempt count, claim_id and due time.
    assert [row for row in _every_column(url) if row[1] != 77] == before
    _assert_schema_is(storage, url, "0010")
    _add(url, f"{TABLE}_deliveries", DELIVERY)
    with pytest.raises(IntegrityError, match=r"(?i)check"):  # a delivery is never unrouted
        _add(url, f"{TABLE}_deliveries", DELIVERY | {"update_id": 6, "state": "unrouted"})


def test_downgrade_from_0010_refuses_while_it_would_lose_a_destinations_rows(
    storage: Storage,
) -> None:
    url = storage.url("head")
    _insert(url, [ROWS[0] | {"queue_rule": QUEUE_RULE}])
    _add(url, f"{TABLE}_deliveries", DELIVERY)
    with pytest.raises(RuntimeError, match="1 deliveries to destinations other than default"):
        downgrade(url, "0009")
    with _connect(url) as connection:
        connection.execute(text(f"DELETE FROM {TABLE}_deliveries"))
        connection.execute(text(f"UPDATE {TABLE} SET state = 'unrouted'"))
    with pytest.raises(RuntimeError, match="1 updates that do not go to default"):
        downgrade(url, "0009")
    assert current_revision(url) == HEAD
    with _connect(url) as connection:
        connection.execute(text(f"UPDATE {TABLE} SET state = 'pending'"))

    downgrade(url, "0009")

    _assert_schema_is(storage, url, "0009")
    assert table_rows(url, "update_id", "state") == [(TOP, "pending")]


def test_the_five_argument_owns_asks_the_destinations_own_row(postgres_storage: Storage) -> None:
    url = postgres_storage.url("head")
    _insert(url, [ROWS[1] | HELD | {"queue_rule": QUEUE_RULE, "due_at": 2**62}])
    live = DELIVERY | {"due_at": 2**62}
    _add(url, f"{TABLE}_deliveries", live)
    _add(url, f"{TABLE}_deliveries", live | {"update_id": 6, "due_at": 1})  # lease lapsed
    owns = owns_function_name(TABLE)

    def asks(*identity: object) -> bool:
        with _connect(url) as connection:
            return bool(connection.scalar(text(f"SELECT {owns}(:a, :b, :c, :d, :e)"),
                                          dict(zip("abcde", identity, strict=True))))  # fmt: skip

    assert asks("bot-b", "default", 1, 1, "c-held")  # default: the update's row
    assert not asks("bot-b", "default", 1, 1, "c-other")
    assert asks("bot-a", "payments", 5, 2, "c-pay")
    assert not asks("bot-a", "payments", 5, 1, "c-pay")  # an earlier attempt
    assert not asks("bot-a", "payments", 5, 2, "c-held")  # another claim
    assert not asks("bot-a", "analytics", 5, 2, "c-pay")  # another destination
    assert not asks("bot-a", "payments", 6, 2, "c-pay")  # its lease has lapsed


# Revision 0011 (docs/design.md decision 8): the console's minute samples beside the rows.


def test_0011_adds_the_samples_and_keeps_every_row(storage: Storage) -> None:
    url = storage.url("0010")
    _insert(url, [row | {"queue_rule": QUEUE_RULE} for row in ROWS])
    before = _every_column(url)
    upgrade(url, "0011")
    assert _every_column(url) == before
    _assert_schema_is(storage, url, "0011")
    sample = {"bot": "bot-a", "destination": "default", "minute": 1_796_000_000_000}
    _add(url, f"{TABLE}_samples", sample | {"received": 3})
    with pytest.raises(IntegrityError):  # one row per bot, destination and minute
        _add(url, f"{TABLE}_samples", sample)
    downgrade(url, "0010")
    _assert_schema_is(storage, url, "0010")
    assert _every_column(url) == before
