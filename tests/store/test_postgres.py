"""PostgreSQL only: many processes share one database, and downstreams share its transactions."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

import psycopg
import pytest
from sqlalchemy import Integer, Text, bindparam, literal_column, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from app.dispatch.settler import Settler
from app.store import (
    ClaimIdentity,
    Completed,
    NewUpdate,
    SqlUpdateStore,
    StoreUnavailable,
    open_store,
)
from app.store.backends.postgres_engine import async_engine
from app.store.backends.postgres_execution import Kept, direct, driver_sql
from app.store.claims import statements as claims
from tests.conftest import Storage, table_locked
from tests.store.test_query_plans import explain, postgres_store


def _now() -> int:
    return time.time_ns() // 1_000_000


async def _stores(url: str, count: int) -> list[SqlUpdateStore]:
    # Separate engines: separate pools, as separate worker processes would have.
    return [await open_store(url, pool_size=1) for _ in range(count)]


async def test_claim_across_separate_engines_has_one_winner(postgres_storage: Storage) -> None:
    url = postgres_storage.url()
    stores = await _stores(url, 8)
    try:
        for update_id in range(20):
            await stores[0].add("shop", update_id, "{}", 0)
        for update_id in range(10):
            results = await asyncio.gather(
                *(s.claim("shop", update_id, now=1, lease_until=9, max_attempts=2) for s in stores)
            )
            assert sorted(results, key=lambda r: r is None) == [1] + [None] * 7
        for update_id in range(10, 20):
            owned = await asyncio.gather(
                *(
                    s.claim_owned("shop", update_id, now=1, lease_until=9, max_attempts=2)
                    for s in stores
                )
            )
            assert len([o for o in owned if o is not None]) == 1
    finally:
        for store in stores:
            await store.close()


async def test_claim_next_owned_across_engines_takes_disjoint_batches(
    postgres_storage: Storage,
) -> None:
    stores = await _stores(postgres_storage.url(), 4)
    try:
        keys = {("shop", n) for n in range(500)}
        await stores[0].add_many([_new(bot, n, queue_key=str(n % 50)) for bot, n in sorted(keys)])

        async def drain(store: SqlUpdateStore) -> list[tuple[str, int]]:
            taken: list[tuple[str, int]] = []
            while batch := await store.claim_next_owned(
                now=1, lease_until=10**12, max_attempts=2, limit=16, ordering="none"
            ):
                taken += [(c.identity.bot, c.identity.update_id) for c in batch]
            return taken

        takes = await asyncio.gather(*(drain(s) for s in stores))
        every = [key for take in takes for key in take]
        assert len(every) == len(set(every)) == len(keys)
        assert set(every) == keys
    finally:
        for store in stores:
            await store.close()


def _new(bot: str, update_id: int, queue_key: str | None = None):  # type: ignore[no-untyped-def]
    from app.store import NewUpdate

    return NewUpdate(bot, update_id, "{}", 0, "message", queue_key)


def _libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def _claimed(store: SqlUpdateStore, lease_ms: int) -> ClaimIdentity:
    await store.add("shop", 1, '{"update_id": 1}', 0)
    now = _now()
    identity = await store.claim_owned(
        "shop", 1, now=now, lease_until=now + lease_ms, max_attempts=3
    )
    assert identity is not None
    return identity


async def test_owns_function_answers_from_the_database_clock(postgres_storage: Storage) -> None:
    url = postgres_storage.url()
    store = await open_store(url)
    try:
        identity = await _claimed(store, lease_ms=1_000)
        with psycopg.connect(_libpq(url), autocommit=True) as connection:

            def owns(bot: str, update_id: int, attempt: int, claim_id: str) -> bool:
                row = connection.execute(
                    "SELECT telegram_intake_owns(%s, %s, %s, %s)",
                    (bot, update_id, attempt, claim_id),
                ).fetchone()
                assert row is not None
                return bool(row[0])

            assert owns("shop", 1, identity.attempt, identity.claim_id) is True
            assert owns("shop", 1, identity.attempt, "another") is False
            assert owns("shop", 1, identity.attempt + 1, identity.claim_id) is False
            assert owns("shop", 2, identity.attempt, identity.claim_id) is False
            assert owns("other", 1, identity.attempt, identity.claim_id) is False
            await asyncio.sleep(1.1)  # the lease lapses by the database's clock
            assert owns("shop", 1, identity.attempt, identity.claim_id) is False
            now = _now()
            later = await store.claim_owned(
                "shop", 1, now=now, lease_until=now + 60_000, max_attempts=3
            )
            assert later is not None
            assert owns("shop", 1, later.attempt, later.claim_id) is True
            assert owns("shop", 1, identity.attempt, identity.claim_id) is False
    finally:
        await store.close()


@pytest.mark.parametrize("check", ["sql function", "store owns"])
async def test_owns_in_a_transaction_holds_off_a_reclaim_until_commit(
    postgres_storage: Storage, check: str
) -> None:
    url = postgres_storage.url()
    store, rival = await _stores(url, 2)
    try:
        identity = await _claimed(store, lease_ms=2_000)
        hold = 0.4
        async with store.transaction() as connection:
            if check == "sql function":
                result = await connection.exec_driver_sql(
                    "SELECT telegram_intake_owns(%(b)s, %(u)s, %(a)s, %(c)s)",
                    {"b": "shop", "u": 1, "a": identity.attempt, "c": identity.claim_id},
                )
                assert result.scalar() is True
            else:
                assert await store.owns(identity, _now(), connection=connection)
            started = time.monotonic()
            reclaim = asyncio.create_task(
                rival.claim_owned(
                    "shop", 1, now=_now() + 5_000, lease_until=_now() + 60_000, max_attempts=3
                )
            )
            await asyncio.sleep(hold)
            assert not reclaim.done(), "the reclaim passed the row lock"
            await connection.exec_driver_sql("SELECT 1")  # the domain write would go here
        second = await reclaim
        waited = time.monotonic() - started
        assert waited >= hold
        assert second is not None
        assert second.attempt == identity.attempt + 1
        assert not await store.owns(identity, _now())
    finally:
        await store.close()
        await rival.close()


async def test_store_recovers_by_itself_when_its_connections_are_killed(
    postgres_storage: Storage, postgres_admin: psycopg.Connection
) -> None:
    url = make_url(postgres_storage.url()).update_query_dict({"application_name": "victim"})
    store = await open_store(url.render_as_string(hide_password=False), pool_size=4)
    try:
        await asyncio.gather(*(store.add("shop", n, "{}", 0) for n in range(8)))  # fill the pool
        killed = postgres_admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = 'victim'"
        ).fetchone()
        assert killed is not None
        assert killed[0] >= 1
        failures = 0
        for update_id in range(100, 110):
            try:
                assert await store.add("shop", update_id, "{}", 0)
            except StoreUnavailable:
                failures += 1
        assert failures <= 1  # one statement meets the dead pool; it is then replaced whole
        due = await store.due(now=1, pending_before=1, limit=100)
        assert len(due) == 18 - failures
    finally:
        await store.close()


async def test_owns_function_finds_its_table_from_any_search_path(
    postgres_storage: Storage, postgres_admin: psycopg.Connection
) -> None:
    url = postgres_storage.url()
    schema = make_url(url).query["options"].removeprefix("-csearch_path=")
    store = await open_store(url)
    try:
        identity = await _claimed(store, lease_ms=60_000)
        row = postgres_admin.execute(  # the admin connection's search_path is the default
            f"SELECT {schema}.telegram_intake_owns(%s, %s, %s, %s)",
            ("shop", 1, identity.attempt, identity.claim_id),
        ).fetchone()
        assert row == (True,)
    finally:
        await store.close()


async def test_a_statement_waiting_past_the_lock_timeout_is_store_unavailable(
    postgres_storage: Storage, postgres_admin: psycopg.Connection
) -> None:
    url = postgres_storage.url()
    store = await open_store(url, lock_timeout_ms=300, statement_timeout_ms=10_000)
    try:
        async with table_locked(postgres_admin, url):
            began = time.monotonic()
            with pytest.raises(StoreUnavailable, match="did not answer in time"):
                await store.add("shop", 1, '{"update_id": 1}', _now())
            waited = time.monotonic() - began
        assert waited < 3  # the lock timeout, not the lock's holder, ended the wait
        assert await store.add("shop", 1, '{"update_id": 1}', _now()) is True  # and then works
    finally:
        await store.close()


async def test_a_statement_running_past_the_statement_timeout_is_store_unavailable(
    postgres_storage: Storage,
) -> None:
    store = await open_store(postgres_storage.url(), statement_timeout_ms=200)
    try:
        with pytest.raises(StoreUnavailable, match="did not answer in time"):
            async with store.transaction() as connection:
                await connection.exec_driver_sql("SELECT pg_sleep(5)")
        await store.ping()  # the connection is still good
    finally:
        await store.close()


async def test_the_service_s_sessions_run_without_jit(postgres_storage: Storage) -> None:
    # JIT compiles a statement's expressions at every run: a claim whose estimate crossed
    # jit_above_cost spent 66 ms compiling for 20 ms of work (docs/performance.md).
    store = await open_store(postgres_storage.url())
    try:
        async with store.transaction() as connection:
            assert (await connection.exec_driver_sql("SHOW jit")).scalar_one() == "off"
    finally:
        await store.close()


async def test_refresh_statistics_describes_the_pause_tables_once_and_after_a_change(
    postgres_storage: Storage,
) -> None:
    # Never described, `_bots` and `_destinations` are taken for ten pages of rows each, and
    # a claim's pause checks planned to keep 80 of 20,000 deliveries. Empty is what the
    # planner must know; autovacuum never gathers statistics of a table this quiet.
    url = postgres_storage.url()
    store = await open_store(url)
    # By relid, this schema's: other tests' schemas hold tables of the same names.
    analyzed = (
        "SELECT relname, analyze_count FROM pg_stat_user_tables WHERE relid IN "
        "(to_regclass('telegram_updates_bots'), to_regclass('telegram_updates_destinations'))"
    )

    async def counts() -> dict[str, int]:
        async with store.engine.connect() as connection:
            rows = (await connection.exec_driver_sql(analyzed)).all()
            return {name: count for name, count in rows}

    try:
        assert await counts() == {"telegram_updates_bots": 0, "telegram_updates_destinations": 0}
        await store.refresh_statistics(min_changes=1_000, min_age_seconds=0)
        assert await counts() == {"telegram_updates_bots": 1, "telegram_updates_destinations": 1}
        await store.refresh_statistics(min_changes=1_000, min_age_seconds=0)  # nothing changed
        assert await counts() == {"telegram_updates_bots": 1, "telegram_updates_destinations": 1}
        await store.pause("shop", at=_now(), by="ops")
        store = await _counted(store, url)
        await _wait_for_counter(
            store, "n_mod_since_analyze", lambda n: n >= 1, table="telegram_updates_bots"
        )
        await store.refresh_statistics(min_changes=1_000, min_age_seconds=0)
        assert (await counts())["telegram_updates_bots"] == 2
    finally:
        await store.close()


async def _two_claimed(store: SqlUpdateStore) -> tuple[ClaimIdentity, ClaimIdentity]:
    for update_id in (1, 2):
        await store.add("shop", update_id, f'{{"update_id": {update_id}}}', 0)
    now = _now()
    claimed = await store.claim_next_owned(
        now=now, lease_until=now + 60_000, max_attempts=3, limit=2, ordering="none"
    )
    first, second = (c.identity for c in claimed)
    return first, second


async def test_a_batch_settle_skips_a_row_another_transaction_holds_and_says_so(
    postgres_storage: Storage,
) -> None:
    """Issue 14, item 3: one locked row (here a downstream's `owns` inside its transaction)
    held up the whole batch, and with it every settle of the process, until the lock timeout."""
    store = await open_store(postgres_storage.url(), lock_timeout_ms=30_000)
    try:
        locked, free = await _two_claimed(store)
        async with store.transaction() as held:
            assert await store.owns(locked, _now(), connection=held)  # FOR UPDATE until commit
            batch = [(locked, Completed(_now())), (free, Completed(_now()))]
            async with asyncio.timeout(5):  # the lock would hold it 30 s
                assert await store.settle_many_owned(batch) == [None, True]
        assert await store.settle_many_owned([(locked, Completed(_now()))]) == [True]
        assert await store.settle_many_owned([(free, Completed(_now()))]) == [False]
    finally:
        await store.close()


async def test_the_settler_settles_a_locked_row_alone_and_the_rest_at_once(
    postgres_storage: Storage,
) -> None:
    store = await open_store(postgres_storage.url(), lock_timeout_ms=30_000)
    settler = Settler(store)
    await settler.start()
    try:
        locked, free = await _two_claimed(store)
        async with store.transaction() as held:
            assert await store.owns(locked, _now(), connection=held)
            waits = asyncio.create_task(settler.submit((locked, Completed(_now()))))
            async with asyncio.timeout(5):
                assert (await settler.submit((free, Completed(_now())))).took_effect
            assert not waits.done()  # it waits for the row, alone
        async with asyncio.timeout(5):
            assert (await waits).took_effect
    finally:
        await settler.stop()
        await store.close()


async def test_one_process_prunes_a_table_at_a_time(
    postgres_storage: Storage, postgres_admin: psycopg.Connection
) -> None:
    """Issue 14, item 5: every worker process pruned the same rows at once, each batch waiting
    on the other's row locks. While another process's batch holds the prune, a prune stops."""
    url = postgres_storage.url()
    store = await open_store(url)
    try:
        for update_id in range(1, 4):
            await store.add("shop", update_id, f'{{"update_id": {update_id}}}', 0)
        now = _now()
        claimed = await store.claim_next_owned(
            now=now, lease_until=now + 60_000, max_attempts=3, limit=3, ordering="none"
        )
        await store.settle_many_owned([(c.identity, Completed(now)) for c in claimed])
        schema = make_url(url).query["options"].removeprefix("-csearch_path=")
        table = f"{schema}.telegram_updates"
        with psycopg.connect(postgres_admin.info.dsn) as other:  # another process's batch
            held = "SELECT pg_advisory_xact_lock(hashtext('prune'), to_regclass(%s)::oid::int)"
            other.execute(held, (table,))
            assert await store.prune(now + 1) == 0
            other.rollback()
        assert await store.prune(now + 1) == 3
    finally:
        await store.close()


async def _fill_as_the_intake_does(store: SqlUpdateStore, count: int, first: int = 1) -> None:
    """Pending rows in batched inserts, as the group commit writes them: no ANALYZE."""
    now = _now()
    for start in range(first, first + count, 500):
        await store.add_many(
            [
                NewUpdate(
                    "shop", n, f'{{"update_id": {n}}}', now - count + n, "message", f"c{n % 500}"
                )
                for n in range(start, min(start + 500, first + count))
            ]
        )


async def _claim_plan(store: SqlUpdateStore) -> list[str]:
    statement = claims.claim_next_owned(
        store.table,
        now=_now(),
        lease_until=_now() + 60_000,
        max_attempts=8,
        limit=64,
        ordering="chat",
        bots=["shop"],
        durable_exhaustion=True,
        lateral=True,
    )
    async with store.engine.connect() as connection:
        return await explain(connection, store, statement)


async def _counted(store: SqlUpdateStore, url: str) -> SqlUpdateStore:
    """`store` closed, and the database opened again. PostgreSQL 15 counts a backend's writes
    when the backend flushes its counters: at once when it exits, but up to 10 s late when it
    flushed less than a second before and then stays idle (PGSTAT_IDLE_INTERVAL). Closing
    ends the store's backends, so the counters below show their writes within moments."""
    await store.close()
    return await open_store(url)


async def _wait_for_counted_changes(
    store: SqlUpdateStore, url: str, at_least: int
) -> SqlUpdateStore:
    """The store, opened again once the counters show `at_least` changes since the last
    ANALYZE (`_counted`)."""
    store = await _counted(store, url)
    await _wait_for_counter(store, "n_mod_since_analyze", lambda n: n >= at_least)
    return store


async def _wait_for_counter(
    store: SqlUpdateStore,
    counter: str,
    holds: Callable[[int], bool],
    table: str = "telegram_updates",
) -> None:
    deadline = time.monotonic() + 30
    while True:
        async with store.engine.connect() as connection:
            row = (
                await connection.exec_driver_sql(
                    f"SELECT {counter} FROM pg_stat_user_tables "
                    f"WHERE relid = to_regclass('{table}')"
                )
            ).first()
        if row is not None and holds(row[0]):
            return
        assert time.monotonic() < deadline, f"the counters show {counter} {row}"
        await asyncio.sleep(0.2)


async def _table_bytes(store: SqlUpdateStore) -> int:
    async with store.engine.connect() as connection:
        statement = "SELECT pg_table_size(to_regclass('telegram_updates'))"
        return int((await connection.exec_driver_sql(statement)).scalar_one())


async def _delete_all(store: SqlUpdateStore, url: str, rows: int) -> SqlUpdateStore:
    """Delete every row, as prune deletes; the store opened again once the counters show
    them dead (`_counted`) and a vacuum may remove them (`_older_snapshots_ended`)."""
    async with store.transaction() as connection:
        await connection.exec_driver_sql("DELETE FROM telegram_updates")
    await _older_snapshots_ended(store)
    store = await _counted(store, url)
    await _wait_for_counter(store, "n_dead_tup", lambda n: n >= rows)
    return store


async def _older_snapshots_ended(store: SqlUpdateStore) -> None:
    """Until no transaction of the database began before now: the suite's other tests share
    it, and a vacuum keeps every row version that an older transaction may still read."""
    older = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid() AND xact_start < %(now)s "
        "AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)"
    )
    async with store.engine.connect() as connection:
        now = (await connection.exec_driver_sql("SELECT clock_timestamp()")).scalar_one()
    deadline = time.monotonic() + 60
    while True:
        async with store.engine.connect() as connection:
            count = (await connection.exec_driver_sql(older, {"now": now})).scalar_one()
        if count == 0:
            return
        assert time.monotonic() < deadline, f"{count} transactions older than {now} still run"
        await asyncio.sleep(0.1)


async def test_reclaim_space_vacuums_once_enough_rows_are_dead_and_their_space_is_reused(
    postgres_storage: Storage,
) -> None:
    url = postgres_storage.url()
    store = await open_store(url)
    try:
        await _fill_as_the_intake_does(store, 2_000)
        assert await store.reclaim_space() is False  # nothing dead
        full = await _table_bytes(store)
        store = await _delete_all(store, url, 2_000)
        assert await store.reclaim_space(min_dead_rows=5_000) is False  # not enough dead
        assert await store.reclaim_space() is True  # never vacuumed, 2,000 dead
        await _wait_for_counter(store, "n_dead_tup", lambda n: n == 0)
        # The same rows again fit in the space the deleted ones left.
        await _fill_as_the_intake_does(store, 2_000, first=10_000)
        assert await _table_bytes(store) == full
        store = await _delete_all(store, url, 2_000)
        # Vacuumed moments ago: not again before the age.
        assert await store.reclaim_space(min_age_seconds=60) is False
        # Another vacuum holding the table (here, its lock held by hand): this one skips it
        # and says so, rather than reporting a vacuum that did nothing.
        async with store.transaction() as holder:
            await holder.exec_driver_sql(
                "LOCK TABLE telegram_updates IN SHARE UPDATE EXCLUSIVE MODE"
            )
            assert await store.reclaim_space(min_age_seconds=0) is False
        assert await store.reclaim_space(min_age_seconds=0) is True
        with pytest.raises(ValueError, match="min_dead_rows"):
            await store.reclaim_space(min_dead_rows=0)
    finally:
        await store.close()


async def test_reclaim_space_vacuums_the_attempt_history_too(postgres_storage: Storage) -> None:
    """Every attempt inserts its history row and its settle supersedes it: on a server whose
    autovacuum is off (this machine's) the history would grow by every attempt ever made."""
    url = postgres_storage.url()
    store = await open_store(url)
    try:
        await _fill_as_the_intake_does(store, 2_000)
        now = _now()
        claimed = await store.claim_next_owned(
            now=now, lease_until=now + 60_000, max_attempts=8, limit=2_000, ordering="none"
        )
        assert len(claimed) == 2_000
        settled = [(c.identity, Completed(_now())) for c in claimed]
        for start in range(0, 2_000, 250):
            assert all(await store.settle_many_owned(settled[start : start + 250]))
        history = "telegram_updates_attempts"
        await _older_snapshots_ended(store)
        store = await _counted(store, url)
        # Its settles' updates are HOT (no indexed column changes), and page pruning takes
        # some of the old versions away without a vacuum: not every one is left dead.
        await _wait_for_counter(store, "n_dead_tup", lambda n: n >= 500, table=history)
        await _wait_for_counter(store, "vacuum_count", lambda n: n == 0, table=history)
        assert await store.reclaim_space(min_dead_rows=100, min_age_seconds=0) is True
        await _wait_for_counter(store, "vacuum_count", lambda n: n == 1, table=history)
        # Not the dead-row count after it: backends report their writes to the counters up to
        # a second late, so updates made before the vacuum may still be added after it.
    finally:
        await store.close()


async def test_refresh_statistics_gathers_them_when_never_gathered_grown_or_stale_and_old(
    postgres_storage: Storage,
) -> None:
    url = postgres_storage.url()
    store = await open_store(url)
    try:
        await _fill_as_the_intake_does(store, 100)
        store = await _wait_for_counted_changes(store, url, 100)
        assert await store.refresh_statistics() is False  # never gathered, but 100 < 1,000
        assert await store.refresh_statistics(min_changes=100) is True  # never gathered
        assert await store.refresh_statistics(min_changes=1, min_age_seconds=0) is False
        await _fill_as_the_intake_does(store, 1_200, first=1_000)
        store = await _wait_for_counted_changes(store, url, 1_200)
        # Gathered moments ago, but the table has seen more writes than it had rows (100): a
        # burst into a small table does not wait for the age.
        assert await store.refresh_statistics(min_changes=1_000, min_age_seconds=60) is True
        await _fill_as_the_intake_does(store, 1_200, first=3_000)
        store = await _wait_for_counted_changes(store, url, 1_200)
        # 1,200 writes into a table of 1,300 rows: enough changes, not yet old enough.
        assert await store.refresh_statistics(min_changes=1_000, min_age_seconds=60) is False
        assert await store.refresh_statistics(min_changes=5_000, min_age_seconds=0) is False
        assert await store.refresh_statistics(min_changes=1_000, min_age_seconds=0) is True
    finally:
        await store.close()


async def test_refresh_statistics_never_gathers_them_from_an_empty_table(
    postgres_storage: Storage,
) -> None:
    # Gathered from an empty table, statistics say each index has no entries however far it
    # grows (reltuples 0 over the metapage); none at all let the planner scale each index by
    # its size. Workers starting on an empty table gathered them so, and four of them then
    # drained a burst at a quarter of their pace.
    url = postgres_storage.url()
    store = await open_store(url)
    try:
        assert await store.refresh_statistics(min_changes=1, min_age_seconds=0) is False
        await _fill_as_the_intake_does(store, 1_200)
        # Counted before the deletes are:
        store = await _wait_for_counted_changes(store, url, 1_200)
        store = await _delete_all(store, url, 1_200)
        await _wait_for_counter(store, "n_mod_since_analyze", lambda n: n >= 2_400)
        await _wait_for_counter(store, "n_live_tup", lambda n: n == 0)
        # 2,400 changes since ever, and nothing left to describe.
        assert await store.refresh_statistics(min_changes=1_000, min_age_seconds=0) is False
        async with store.engine.connect() as connection:
            gathered = (
                await connection.exec_driver_sql(
                    "SELECT last_analyze FROM pg_stat_user_tables "
                    "WHERE relid = 'telegram_updates'::regclass"
                )
            ).scalar_one()
        assert gathered is None
        await _fill_as_the_intake_does(store, 1_200, first=5_000)
        store = await _counted(store, url)
        await _wait_for_counter(store, "n_live_tup", lambda n: n == 1_200)
        assert await store.refresh_statistics(min_changes=1_000, min_age_seconds=0) is True
    finally:
        await store.close()


async def test_after_refresh_statistics_the_claim_walks_the_due_order_index(
    postgres_storage: Storage,
) -> None:
    # A table filled by the intake and never analysed: the planner may believe it holds a
    # handful of open rows and read all of them into a sort (a bitmap scan), or walk the bot's
    # rows by another index. With statistics, the claim walks ix_due in due order.
    url = postgres_storage.url()
    store = await open_store(url)
    try:
        await _fill_as_the_intake_does(store, 20_000)
        store = await _wait_for_counted_changes(store, url, 20_000)
        assert await store.refresh_statistics() is True
        plan = await _claim_plan(store)
    finally:
        await store.close()
    assert "Index Scan telegram_updates ix_telegram_updates_due" in plan, plan
    # The pause table, described as empty, is read whole: its one page (or none).
    scans = [line for line in plan if line.startswith(("Bitmap", "Seq Scan"))]
    assert scans in ([], ["Seq Scan telegram_updates_bots"]), plan


def _inserting_backends(admin: psycopg.Connection, name: str) -> list[int]:
    """The pids of `name`'s connections whose last statement was the batch insert."""
    rows = admin.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s "
        "AND query LIKE 'WITH added AS%%'",
        (name,),
    ).fetchall()
    return sorted(row[0] for row in rows)


async def test_the_batch_insert_keeps_one_connection_and_lets_a_broken_one_go(
    postgres_storage: Storage, postgres_admin: psycopg.Connection
) -> None:
    url = make_url(postgres_storage.url()).update_query_dict({"application_name": "kept"})
    store = await open_store(url.render_as_string(hide_password=False), pool_size=4)
    try:
        for update_id in range(5):
            assert await store.add("shop", update_id, "{}", 0)
        kept = _inserting_backends(postgres_admin, "kept")
        assert len(kept) == 1  # five batches, one connection
        # While it is in use, others take the pool's connections: nobody waits for it.
        added = await asyncio.gather(*(store.add("shop", n, "{}", 0) for n in range(10, 20)))
        assert all(added)
        postgres_admin.execute("SELECT pg_terminate_backend(%s)", (kept[0],))
        with pytest.raises(StoreUnavailable):
            await store.add("shop", 30, "{}", 0)
        assert await store.add("shop", 31, "{}", 0)  # a fresh one kept in its place
        assert kept[0] not in _inserting_backends(postgres_admin, "kept")
        due = await store.due(now=1, pending_before=1, limit=100)
        assert len(due) == 5 + 10 + 1
    finally:
        await store.close()
    # Closed: the kept connection went back and the pool with it (a server process ends a
    # moment after its client hangs up).
    for _ in range(100):
        if not _inserting_backends(postgres_admin, "kept"):
            break
        await asyncio.sleep(0.05)
    assert _inserting_backends(postgres_admin, "kept") == []


async def test_a_pool_of_one_keeps_no_connection_for_the_insert(
    postgres_storage: Storage,
) -> None:
    store = await open_store(postgres_storage.url(), pool_size=1)
    try:
        await store.add("shop", 1, "{}", 0)
        # Were the one connection kept for the insert, this read would wait for ever.
        async with asyncio.timeout(10):
            assert len(await store.due(now=1, pending_before=1, limit=10)) == 1
    finally:
        await store.close()


async def test_a_connection_that_answers_read_only_is_not_kept_for_the_insert(
    postgres_storage: Storage, postgres_admin: psycopg.Connection
) -> None:
    # What a demoted primary answers: a role whose sessions are read-only stands in for one.
    url = make_url(postgres_storage.url())
    schema = url.query["options"].removeprefix("-csearch_path=")
    role = f"ro_{schema}"
    postgres_admin.execute(f"CREATE ROLE {role} LOGIN")
    try:
        postgres_admin.execute(f"GRANT ALL ON SCHEMA {schema} TO {role}")
        postgres_admin.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA {schema} TO {role}")
        postgres_admin.execute(f"ALTER ROLE {role} SET default_transaction_read_only = on")
        as_role = url.set(username=role).update_query_dict({"application_name": role})
        store = await open_store(as_role.render_as_string(hide_password=False), pool_size=4)
        try:
            pids = []
            for update_id in (1, 2):
                with pytest.raises(StoreUnavailable, match="read-only"):
                    await store.add("shop", update_id, "{}", 0)
                # A server process ends a moment after its client hangs up.
                for _ in range(100):
                    if not _inserting_backends(postgres_admin, role):
                        break
                    await asyncio.sleep(0.05)
                pids.append(_inserting_backends(postgres_admin, role))
        finally:
            await store.close()
        # Each try met a fresh connection: the one that answered read-only was let go.
        assert pids[0] == []
        assert pids[1] == []
    finally:
        postgres_admin.execute(f"DROP OWNED BY {role}")
        postgres_admin.execute(f"DROP ROLE {role}")


async def test_the_claim_and_the_settle_are_planned_once_on_kept_connections(
    postgres_storage: Storage,
) -> None:
    # PostgreSQL's own choice planned the claim anew at every run, and the batch settle at
    # almost every one: the kept connections force the generic plan; the pool's other
    # connections keep their own mode. The settle has a kept connection of its own.
    store, backend = await postgres_store(postgres_storage.url())
    try:
        for update_id in range(1, 41):
            await store.add("shop", update_id, "{}", 0)
        now = _now()
        for _ in range(20):  # twenty claims and settles of two rows
            claimed = await store.claim_next_owned(
                now=now, lease_until=now + 60_000, max_attempts=3, limit=2, ordering="chat"
            )
            assert await store.settle_many_owned(
                [(c.identity, Completed(now)) for c in claimed]
            ) == [True, True]
        plans = {}
        for name, kept, marker in (
            ("claim", backend._kept, "%%window_rows%%"),
            ("settle", backend._settling, "%%unnest%%"),
        ):
            async with kept.connection() as connection:
                mode = (await connection.exec_driver_sql("SHOW plan_cache_mode")).scalar_one()
                plans[name] = (
                    mode,
                    (
                        await connection.exec_driver_sql(
                            "SELECT sum(generic_plans), sum(custom_plans) "
                            f"FROM pg_prepared_statements WHERE statement ILIKE '{marker}'"
                        )
                    ).one(),
                )
        async with store.transaction() as connection:
            other = (await connection.exec_driver_sql("SHOW plan_cache_mode")).scalar_one()
    finally:
        await store.close()
    for name, (mode, (generic, custom)) in plans.items():
        assert mode == "force_generic_plan", name
        assert generic is not None, f"the {name} was never prepared"
        assert generic >= 10, name
        assert custom == 0, name
    assert other == "auto"


async def test_a_kept_connection_goes_back_to_the_pool_planning_as_before(
    postgres_storage: Storage,
) -> None:
    engine = async_engine(make_url(postgres_storage.url()), pool_size=3)
    kept = Kept(engine, asyncio.Semaphore(3))
    try:
        async with kept.connection() as connection:
            before = (await connection.exec_driver_sql("SHOW plan_cache_mode")).scalar_one()
            pid = (await connection.exec_driver_sql("SELECT pg_backend_pid()")).scalar_one()
        await kept.close()
        async with engine.connect() as connection:  # the one connection the pool has made
            after = (await connection.exec_driver_sql("SHOW plan_cache_mode")).scalar_one()
            again = (await connection.exec_driver_sql("SELECT pg_backend_pid()")).scalar_one()
    finally:
        await engine.dispose()
    assert before == "force_generic_plan"
    assert again == pid
    assert after == "auto"


async def test_the_positional_form_reads_what_the_named_form_reads(
    postgres_storage: Storage,
) -> None:
    # A name used twice binds one `$n`; SQLAlchemy's escaped percent sign is a percent sign.
    engine = async_engine(make_url(postgres_storage.url()), pool_size=1)
    statement = select(
        literal_column("'50%'").label("percent"),
        bindparam("a", type_=Integer).label("a"),
        (bindparam("a", type_=Integer) + bindparam("b", 3, type_=Integer)).label("sum"),
        bindparam("text", type_=Text).label("text"),
    )
    named = driver_sql(engine, statement)
    positional = driver_sql(engine, statement, positional=True)
    try:
        async with engine.connect() as connection:
            values = {"a": 4, "text": "x %(a)s $1"}
            by_name = await direct(connection, named, values)
            by_number = await direct(connection, positional, values)
    finally:
        await engine.dispose()
    assert named.names is None
    assert positional.names == ("a", "b", "text")
    assert "%" not in positional.text.replace("'50%'", "")
    assert by_number == by_name == [("50%", 4, 7, "x %(a)s $1")]


async def test_the_claim_runs_in_positional_form_and_the_settle_in_named_form(
    postgres_storage: Storage,
) -> None:
    store, backend = await postgres_store(postgres_storage.url())
    try:
        await store.add("shop", 1, "{}", 0)
        now = _now()
        [claimed] = await store.claim_next_owned(
            now=now, lease_until=now + 60_000, max_attempts=3, limit=8, ordering="chat"
        )
        assert claimed.identity.update_id == 1
        shapes = list(backend._claims._compiled.values())
        assert shapes
        assert all(shape.names is not None and "$1" in shape.text for shape in shapes)
        assert backend._compiled["settle_many_owned"].names is None  # its arrays go in binary
    finally:
        await store.close()


async def test_a_kept_connection_that_cannot_connect_holds_no_permit() -> None:
    # While the database is down every try to keep a connection fails: none may keep one of
    # the pool's permits, or a database that comes back finds a process that can never
    # again run a statement (the chaos run hung so, on a crash of PostgreSQL).
    url = make_url(f"postgresql+psycopg://postgres@127.0.0.1:{_dead_port()}/x")
    engine = async_engine(url, pool_size=2)
    permits = asyncio.Semaphore(2)
    kept = Kept(engine, permits)
    try:
        async with asyncio.timeout(10):  # a leaked permit: the third try waits for ever
            for _ in range(3):
                with pytest.raises(DBAPIError):
                    async with kept.connection():
                        raise AssertionError("no connection was to be had")
            for _ in range(2):
                await permits.acquire()
    finally:
        await kept.close()
        await engine.dispose()


def _dead_port() -> int:
    with socket.socket() as probe:  # bound and closed: nothing listens there
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
