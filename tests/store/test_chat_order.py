"""A chat-ordered claim costs what the chats cost, never what queues behind a blocked head.

The work of one claim is counted, not timed: on PostgreSQL the tuples its scans read (the
transaction's own `pg_stat_xact_*` counters), on SQLite the virtual machine instructions it
runs (a progress handler). Before the head walk, a chat whose head waits in backoff with N
rows behind it cost every claim about N steps of the due-order walk.
"""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store import NewUpdate, SqlUpdateStore, open_store
from app.store.claims import chat_order
from app.store.claims import statements as claims
from tests.conftest import Storage

NOW = 2_000_000_000_000
CHATS = 50  # flowing chats, four rows each, all due after the blocked backlog
LIMIT = 16
RETAINED = 20_000
SERIES = {
    "postgresql": "SELECT g AS n FROM generate_series(1, :count) AS g",
    "sqlite": (
        "WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < :count) "
        "SELECT n FROM s"
    ),
}
# queue_rule 1: rows as this code records them (without it, revision 0006's trigger keys them).
COLUMNS = (
    "bot, update_id, body, queue_key, state, attempts, due_at, received_at, claim_id, queue_rule"
)


async def fill(engine: AsyncEngine, backlog: int, chats: int = CHATS) -> None:
    """Chat "hot": its head failed, retried an hour from now, and `backlog` pending rows behind
    it, due before anything else. Then `chats` flowing chats, four pending rows each, and
    RETAINED completed rows, so that the planner reads keys by index on every shape."""
    series = SERIES[engine.dialect.name]
    async with engine.begin() as connection:
        await connection.execute(
            text(
                f"INSERT INTO telegram_updates ({COLUMNS}) VALUES ('shop', 1, '{{}}', 'hot', "
                f"'failed', 1, {NOW + 3_600_000}, {NOW - 10**8}, 'a-claim-id', 1)"
            )
        )
        rows = [
            ("1 + n", "'hot'", "'pending'", f"{NOW} - 10000000 + n", backlog),
            (
                "1000000 + n",
                f"'c' || (n % {chats})",
                "'pending'",
                f"{NOW} - 1000000 + n",
                chats * 4,
            ),
            ("2000000 + n", "'done'", "'completed'", f"{NOW} - 20000000 + n", RETAINED),
        ]
        for update_id, queue_key, state, due_at, count in rows:
            await connection.execute(
                text(
                    f"INSERT INTO telegram_updates ({COLUMNS}) SELECT 'shop', {update_id}, "
                    f"'{{}}', {queue_key}, {state}, 0, {due_at}, {due_at}, NULL, 1 "
                    f"FROM ({series}) AS s"
                ),
                {"count": count},
            )
        await connection.execute(text("ANALYZE telegram_updates"))


def claim(store: SqlUpdateStore, window: int = chat_order.WINDOW) -> Any:
    """The statement `claim_next_owned` runs for one bot, as the workers call it."""
    return claims.claim_next_owned(
        store.table,
        now=NOW,
        lease_until=NOW + 60_000,
        max_attempts=8,
        limit=LIMIT,
        window=window,
        ordering="chat",
        bots=["shop"],
        durable_exhaustion=False,
        lateral=store.dialect == "postgresql",
    )


async def claim_work(
    store: SqlUpdateStore, window: int = chat_order.WINDOW
) -> tuple[int, list[int], set[bool]]:
    """The work of one claim (see the module docstring), the update_ids it took and what its
    rows say of the head walk (`walked_heads`); the claim is rolled back."""
    if store.dialect == "postgresql":
        engine = store.engine.execution_options(isolation_level="READ COMMITTED")
        async with engine.connect() as connection:
            transaction = await connection.begin()
            rows = (await connection.execute(claim(store, window))).all()
            # Tuples read by the transaction so far: heap scans and every index of the table.
            read = await connection.execute(
                text(
                    "SELECT pg_stat_get_xact_tuples_returned('telegram_updates'::regclass) "
                    "+ (SELECT sum(pg_stat_get_xact_tuples_returned(indexrelid)) FROM pg_index "
                    "   WHERE indrelid = 'telegram_updates'::regclass)"
                )
            )
            work = int(read.scalar_one())
            await transaction.rollback()
        return work, sorted(row.update_id for row in rows), {row.walked_heads for row in rows}
    sql = str(
        claim(store, window).compile(
            dialect=store.engine.dialect, compile_kwargs={"literal_binds": True}
        )
    )
    connection = sqlite3.connect(str(store.engine.url.database))
    try:
        steps = 0

        def count() -> int:
            nonlocal steps
            steps += 1
            return 0

        connection.set_progress_handler(count, 100)
        connection.execute("BEGIN")  # the module begins none before a statement led by WITH
        rows = connection.execute(sql).fetchall()
        connection.rollback()
    finally:
        connection.close()
    return steps * 100, sorted(row[2] for row in rows), {bool(row[-1]) for row in rows}


async def measured(storage: Storage, backlog: int, chats: int = CHATS) -> int:
    """The work of one claim on a fresh table of that shape; it takes the oldest due head of
    each flowing chat: c1 to c16 (update_id 1_000_000 + n)."""
    store = await open_store(storage.url())
    try:
        await fill(store.engine, backlog, chats)
        work, taken, _ = await claim_work(store)
    finally:
        await store.close()
    assert taken == list(range(1_000_001, 1_000_001 + LIMIT))
    return work


async def test_chat_claim_work_does_not_grow_with_a_blocked_backlog(storage: Storage) -> None:
    work = {backlog: await measured(storage, backlog) for backlog in (10_000, 100_000)}
    # Ten times the backlog, the same work (before: about ten times as much).
    assert work[100_000] <= work[10_000] * 1.1, work


async def test_chat_claim_work_does_not_grow_with_the_chats_when_heads_lead(
    storage: Storage,
) -> None:
    # No backlog: the heads lie at the front of the due order, and the walk over the chat
    # heads, whose cost follows the chats, is not run at all.
    work = {chats: await measured(storage, 0, chats) for chats in (50, 500)}
    assert work[500] <= work[50] * 1.1, work


async def test_a_chat_claim_says_which_walk_took_its_rows_and_may_skip_the_window(
    storage: Storage,
) -> None:
    # A store each: PostgreSQL's transaction counters also hold a connection's earlier ones
    # until they are flushed.
    stores = [await open_store(storage.url()) for _ in range(3)]
    try:
        await fill(stores[0].engine, 0)
        _, free, free_walk = await claim_work(stores[0])
        for store in stores[1:]:
            await fill(store.engine, 20_000)  # chat "hot" blocks the front of the queue
        blocked, taken, blocked_walk = await claim_work(stores[1])
        skipping, skipped, skipping_walk = await claim_work(stores[2], window=0)
    finally:
        for store in stores:
            await store.close()
    heads = list(range(1_000_001, 1_000_001 + LIMIT))
    assert (free, free_walk) == (heads, {False})  # the window's due-order walk took them
    # Behind the blocked front the window comes up short and the head walk takes the same
    # rows; skipping the window takes them too, for less work.
    assert (taken, blocked_walk) == (heads, {True})
    assert (skipped, skipping_walk) == (heads, {True})
    assert skipping < blocked, (skipping, blocked)


def test_after_a_short_window_the_next_claims_skip_it_then_try_it_again() -> None:
    window, left = chat_order.next_window(chat_order.WINDOW, True, 0)
    windows = [window]
    for _ in range(chat_order.HEADS_FIRST):
        window, left = chat_order.next_window(window, True, left)
        windows.append(window)
    assert windows == [0] * chat_order.HEADS_FIRST + [chat_order.WINDOW]
    # A window that found its rows is kept; one that came up short again is skipped again.
    assert chat_order.next_window(chat_order.WINDOW, False, 0) == (chat_order.WINDOW, 0)
    assert chat_order.next_window(chat_order.WINDOW, True, 0) == (0, chat_order.HEADS_FIRST)


async def test_concurrent_chat_claims_behind_a_blocked_chat_take_disjoint_heads(
    storage: Storage,
) -> None:
    # Four claimers, each with its own engine (as four worker processes), all past the window:
    # each locks its heads one by one and skips the others', so together they take the 64
    # oldest due heads, each once.
    url = storage.url()
    stores = [await open_store(url, pool_size=1) for _ in range(4)]
    try:
        await fill(stores[0].engine, 2_000, chats=200)
        batches = await asyncio.gather(
            *(
                store.claim_next_owned(
                    now=NOW, lease_until=NOW + 60_000, max_attempts=8, limit=LIMIT, bots=["shop"]
                )
                for store in stores
            )
        )
    finally:
        for store in stores:
            await store.close()
    taken = [claimed.identity.update_id for batch in batches for claimed in batch]
    assert [len(batch) for batch in batches] == [LIMIT] * 4
    assert sorted(taken) == list(range(1_000_001, 1_000_001 + 4 * LIMIT))


async def test_a_chat_claim_behind_ties_locks_only_the_rows_it_takes(
    postgres_storage: Storage,
) -> None:
    # Every row due at one instant (ties past the window: the head walk answers). While one
    # claim's transaction is open, another claimer must find the next heads: the first locks
    # only the rows it takes, not every head tied with them (before: all 200, so the second
    # claimer took none). SQLite has one writer, so it is PostgreSQL's question.
    url = postgres_storage.url()
    first, second = await open_store(url), await open_store(url)
    try:
        await first.add_many(
            [
                NewUpdate("shop", n, "{}", NOW - 1_000, queue_key=f"c{n % 200}")
                for n in range(1, 801)
            ]
        )
        engine = first.engine.execution_options(isolation_level="READ COMMITTED")
        async with engine.connect() as connection:
            transaction = await connection.begin()
            held = (await connection.execute(claim(first))).all()
            taken = await second.claim_next_owned(
                now=NOW, lease_until=NOW + 60_000, max_attempts=8, limit=LIMIT, bots=["shop"]
            )
            await transaction.rollback()
    finally:
        await first.close()
        await second.close()
    assert [row.update_id for row in held] == list(range(1, LIMIT + 1))
    assert [c.identity.update_id for c in taken] == list(range(LIMIT + 1, 2 * LIMIT + 1))
