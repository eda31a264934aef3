"""Claim and due statements use indexes, not scans, with a million settled rows retained."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest
from psycopg import sql as psql
from sqlalchemy import Table, select
from sqlalchemy.ext.asyncio import AsyncConnection

from app.store import (
    ClaimIdentity,
    Completed,
    ExhaustionFilter,
    NewUpdate,
    SqlUpdateStore,
    UpdateFilter,
    open_store,
)
from app.store.backends import postgres_statements, sqlite_statements
from app.store.backends.postgres import PostgresBackend
from app.store.claims import statements as claims
from app.store.control import statements as control
from app.store.exhaustions import statements as exhaustions
from app.store.records import statements as records
from app.store.settles import statements as settles
from app.store.types import Route
from app.store.views import statements as views
from tests.conftest import Storage
from tests.store.big_table import NOW, fill

LEASE = NOW + 60_000
IDENTITY = ClaimIdentity("shop", 1_000_002, 1, "0f0e0d0c-0b0a-4908-8706-050403020100")


def _add(store: SqlUpdateStore) -> dict[str, tuple[Any, dict[str, Any]]]:
    """The batch insert as each backend runs it, for one row, and for one with a delivery
    beside it; on SQLite, with the lookup of the keys it inserted that runs after it when
    some were not new."""
    rows, _ = store._stored_rows([NewUpdate("shop", 5, "{}", NOW)])
    routes = (Route("default"), Route("payments"))
    routed, deliveries = store._stored_rows([NewUpdate("shop", 6, "{}", NOW, routes=routes)])
    table, beside = store.table, store.deliveries_table
    assert beside is not None
    if store.dialect == "postgresql":
        add, arrays = postgres_statements.add, postgres_statements.add_arrays
        return {
            "add": (add(table), arrays(rows)),
            "add_routed": (add(table, None, beside), arrays(routed, deliveries)),
        }
    batch = sqlite_statements.add_rows(rows)
    found = (sqlite_statements.inserted(table), {**batch, "after": 1_000})
    beside_rows = sqlite_statements.delivery_rows(deliveries)
    return {
        "add": (sqlite_statements.add(table), batch),
        "inserted": found,
        "add_deliveries": (sqlite_statements.add_deliveries(beside), beside_rows),
    }


def _settle_many(
    store: SqlUpdateStore, table: Table | None = None, identity: ClaimIdentity = IDENTITY
) -> tuple[Any, dict[str, Any]]:
    """The batch settle as each backend runs it, for one item (of `table`'s)."""
    t = store.table if table is None else table
    items = [(identity, Completed(NOW))]
    if store.dialect == "postgresql":
        return postgres_statements.settle_many_owned(t), postgres_statements.settle_many_parameters(
            items
        )
    batch = sqlite_statements.json_batch(settles.SETTLE_COLUMNS, settles.settle_rows(items))
    return sqlite_statements.settle_many_owned(t), batch


def statements(store: SqlUpdateStore) -> dict[str, Any]:
    t = store.table
    return {
        **_add(store),
        "claim": claims.claim(
            t,
            bot="shop",
            update_id=1_000_002,
            now=NOW,
            lease_until=LEASE,
            max_attempts=8,
            durable_exhaustion=True,
        ),
        "claim_owned": claims.claim_owned(
            t,
            bot="shop",
            update_id=1_000_002,
            now=NOW,
            lease_until=LEASE,
            max_attempts=8,
            durable_exhaustion=False,
        ),
        "claim_next_owned chat": claims.claim_next_owned(
            t,
            now=NOW,
            lease_until=LEASE,
            max_attempts=8,
            limit=64,
            ordering="chat",
            bots=None,
            durable_exhaustion=True,
            lateral=store.dialect == "postgresql",
        ),
        "claim_next_owned none": claims.claim_next_owned(
            t,
            now=NOW,
            lease_until=LEASE,
            max_attempts=8,
            limit=64,
            ordering="none",
            bots=["shop"],
            durable_exhaustion=False,
            lateral=store.dialect == "postgresql",
        ),
        "renew_owned": claims.renew_owned(t, identity=IDENTITY, lease_until=LEASE, now=NOW),
        "owns": claims.owns(t, identity=IDENTITY, at=NOW, lock=True),
        "settle_owned": settles.settle_owned(t, identity=IDENTITY, settlement=Completed(NOW)),
        "settle_many_owned": _settle_many(store),
        "due": claims.due(t, now=NOW, pending_before=NOW, limit=100),
        "exhaust": exhaustions.exhaust(t, identity=IDENTITY, at=NOW, error="HTTP 400"),
        "due_exhaustions": exhaustions.due_exhaustions(t, limit=100, after=("news", 5), bots=None),
        "acknowledge_exhaustion": exhaustions.acknowledge_exhaustion(t, identity=IDENTITY, at=NOW),
        "prune": records.prune(t, store.deliveries_table, before=1_000, limit=2_000, unrouted=True),
        **_operator_statements(store),
        **_delivery_statements(store),
    }


def _delivery_statements(store: SqlUpdateStore) -> dict[str, Any]:
    """The claims and keyed transitions of a destination beside `default` (revision 0010),
    on the deliveries table that `fill` filled."""
    d = store.deliveries_table
    assert d is not None
    paying = dataclasses.replace(IDENTITY, update_id=5, destination="payments")
    chat, none = (
        claims.claim_next_owned(
            d,
            now=NOW,
            lease_until=LEASE,
            max_attempts=8,
            limit=64,
            ordering=ordering,
            bots=None,
            durable_exhaustion=True,
            lateral=store.dialect == "postgresql",
            destination="payments",
        )
        for ordering in ("chat", "none")
    )
    return {
        "claim_next_owned chat payments": chat,
        "claim_next_owned none payments": none,
        "renew_owned payments": claims.renew_owned(d, identity=paying, lease_until=LEASE, now=NOW),
        "owns payments": claims.owns(d, identity=paying, at=NOW, lock=True),
        "settle_owned payments": settles.settle_owned(
            d, identity=paying, settlement=Completed(NOW)
        ),
        "settle_many_owned payments": _settle_many(store, d, paying),
    }


def _operator_statements(store: SqlUpdateStore) -> dict[str, Any]:
    """Operator control's statements (revision 0004): each search filter walks its index and
    stops at its page; the bulk actions walk the open exhaustions; park finds its key."""
    t = store.table
    shop = ("shop",)

    def search(after: Any = None, **criteria: Any) -> Any:
        chosen = UpdateFilter(**{"bots": shop, **criteria})
        return views.search_updates(t, chosen, after=after, limit=50)

    mine = exhaustions.exhaustions_matching(t, ExhaustionFilter(bots=shop, error_contains="HTTP"))
    return {
        "search_updates bot": search(),
        "search_updates bots, after a cursor": search(
            bots=("news", "shop"), after=(500_000, "news", 499_999)
        ),
        "search_updates chat": search(chat="7"),
        "search_updates type": search(update_type="callback_query"),
        "search_updates window": search(received_after=400_000, received_before=401_000),
        "search_updates state": search(state="failed"),
        "search_updates contains": search(chat="7", contains="order"),
        "redrive": exhaustions.redrive(
            t, mine, after=None, limit=1_000, start=NOW, interval_ms=2.0
        ),
        "acknowledge_exhaustions": exhaustions.acknowledge_exhaustions(
            t, mine, after=("shop", 5), limit=1_000, at=NOW
        ),
        "park": control.park(t, identity=IDENTITY, at=NOW, reason="poison"),
    }


async def explain(connection: AsyncConnection, store: SqlUpdateStore, statement: Any) -> list[str]:
    """The plan, one line per node, of `statement`: a statement with its values inlined, or a
    (statement, parameters) pair as the store executes it."""
    statement, params = statement if isinstance(statement, tuple) else (statement, None)
    if params is None:
        compiled = statement.compile(
            dialect=store.engine.dialect, compile_kwargs={"literal_binds": True}
        )
        sql, args = str(compiled), None
    else:
        compiled = statement.compile(dialect=store.engine.dialect)
        values = {**compiled.params, **params}
        sql = compiled.string
        args = tuple(values[k] for k in compiled.positiontup) if compiled.positiontup else values
    if store.dialect == "sqlite":
        rows = (await connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}", args)).all()
        return [str(row[-1]) for row in rows]
    plan = (await connection.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {sql}", args)).scalar()
    return plan_lines(plan)


async def postgres_store(url: str) -> tuple[SqlUpdateStore, PostgresBackend]:
    """A store on `url` with a pool of four, and its backend: the kept connections and the
    compiled statements the tests look into."""
    store = await open_store(url, pool_size=4)
    backend = store._backend
    assert isinstance(backend, PostgresBackend)
    return store, backend


def plan_lines(plan: Any) -> list[str]:
    """PostgreSQL's JSON plan, one line per node: its type, relation and index."""
    lines: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        lines.append(
            f"{node['Node Type']} {node.get('Relation Name', '')} "
            f"{node.get('Index Name', '')}".strip()
        )
        for child in node.get("Plans", []):
            walk(child)

    walk((json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"])
    return lines


def scans(plan: list[str], dialect: str) -> list[str]:
    """Lines that read the whole table (or a whole index of it)."""
    # The bots' controls (revision 0004) are a row per bot: reading them whole is cheapest.
    pattern = (
        r"^SCAN (telegram_updates(_deliveries)?|older)\b(?!_bots)"
        if dialect == "sqlite"
        else r"^Seq Scan (?!telegram_updates_(bots|destinations)$)"
    )
    return [line for line in plan if re.search(pattern, line)]


# Statements on one key: they must find it by the primary key, never walk a range of leases.
KEYED = (
    "claim",
    "claim_owned",
    "renew_owned",
    "owns",
    "settle_owned",
    "settle_many_owned",
    "exhaust",
    "acknowledge_exhaustion",
    "park",
)
KEY_LOOKUP = {
    # pk_telegram_updates_deliveries too; ix_telegram_updates_dl_update is (bot, update_id)
    # on the deliveries table: a row per destination of one update.
    "postgresql": (
        "pk_telegram_updates",
        "ix_telegram_updates_unacknowledged",
        "ix_telegram_updates_dl_update",
    ),
    "sqlite": ("(bot=? AND update_id=?)", "(bot=? AND destination=? AND update_id=?)"),
}


@pytest.mark.slow
@pytest.mark.xdist_group("query-plans")  # untimed: not in the serial group
async def test_statements_use_indexes_with_a_million_retained_rows(storage: Storage) -> None:
    store = await open_store(storage.url())
    try:
        await fill(store.engine)
        found: dict[str, list[str]] = {}
        async with store.engine.connect() as connection:
            for name, statement in statements(store).items():
                plan = await explain(connection, store, statement)
                lookups = KEY_LOOKUP[store.dialect]
                keyed = name.split()[0] in KEYED and not any(
                    k in line for k in lookups for line in plan
                )
                if scans(plan, store.dialect) or keyed:
                    found[name] = plan
            # The control: a filter on an unindexed column must be seen as a scan.
            control = select(store.table.c.bot).where(store.table.c.body == "{}")
            assert scans(await explain(connection, store, control), store.dialect)
        assert found == {}, "\n".join(f"{k}: {v}" for k, v in found.items())
    finally:
        await store.close()


async def _generic_plan(
    connection: AsyncConnection, store: SqlUpdateStore, text: str, values: list[Any]
) -> list[str]:
    """The plan PostgreSQL keeps for `text` (in `$n` form) under force_generic_plan, as a kept
    connection runs it (`postgres_execution.Kept`): planned once, for any values."""
    await connection.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
    await connection.exec_driver_sql(f"PREPARE kept_statement AS {text}")
    try:
        literals = psql.SQL(", ").join(psql.Literal(value) for value in values).as_string()
        execute = f"EXPLAIN (FORMAT JSON) EXECUTE kept_statement({literals})"
        plan = (await connection.exec_driver_sql(execute.replace("%", "%%"))).scalar()
    finally:
        await connection.exec_driver_sql("DEALLOCATE kept_statement")
        await connection.exec_driver_sql("RESET plan_cache_mode")
    return plan_lines(plan)


def _numbered(text: str) -> tuple[str, list[str]]:
    """psycopg's named SQL (`%(name)s`, `%(name)b`) in `$n` form, and the names in order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) is None:
            return "%"
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return re.sub(r"%\((\w+)\)[sb]|%%", number, text), names


@pytest.mark.slow
@pytest.mark.xdist_group("query-plans")  # untimed: not in the serial group
async def test_kept_statements_generic_plans_use_indexes_with_a_million_retained_rows(
    postgres_storage: Storage,
) -> None:
    # The claim and the batch settle run on kept connections that plan them once, for any
    # values: that one plan must find its rows by the indexes too, as the custom ones do.
    store, backend = await postgres_store(postgres_storage.url())
    try:
        await fill(store.engine)
        for ordering in ("chat", "none"):  # every shape compiled, for a bot with no rows
            for bots in (["nobody"], None):
                await store.claim_next_owned(
                    now=NOW, lease_until=LEASE, max_attempts=8, limit=64, ordering=ordering,
                    bots=bots, durable_exhaustion=True,
                )  # fmt: skip
        numbers = {"now": NOW, "lease_until": LEASE, "max_attempts": 8, "limit": 64}
        numbers |= {"window": 4, "worker": "w"}
        kept: dict[str, tuple[str, list[Any]]] = {}
        for key, compiled in backend._claims._compiled.items():
            assert compiled.names is not None
            values = {**compiled.constants, **numbers}
            shop = ["shop" if values[name] == "nobody" else values[name] for name in compiled.names]
            kept[f"claim {key}"] = compiled.text, shop
        settle = backend._compiled["settle_many_owned"]
        text, names = _numbered(settle.text)
        _, items = _settle_many(store)
        values = {**settle.constants, **items}
        kept["settle_many_owned"] = text, [values[name] for name in names]
        assert len(kept) == 5
        found: dict[str, list[str]] = {}
        async with backend.engine.connect() as connection:  # autocommitting
            for name, (text, args) in kept.items():
                plan = await _generic_plan(connection, store, text, args)
                if scans(plan, "postgresql"):
                    found[name] = plan
            # The control: a generic plan over an unindexed column must be seen as a scan.
            control = "SELECT bot FROM telegram_updates WHERE body = $1"
            assert scans(await _generic_plan(connection, store, control, ["{}"]), "postgresql")
        assert found == {}, "\n".join(f"{k}: {v}" for k, v in found.items())
    finally:
        await store.close()
