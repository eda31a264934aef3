"""Same-database fencing (app.store.fencing): a downstream checks ownership inside the
transaction of its own domain write, on its own SQLAlchemy engine, so no reclaim can pass
between the check and the commit. Run on both backends; the downstream's engines are plain
`create_engine` / `create_async_engine` with their defaults, none of the store's set-up."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace

import pytest
from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Integer,
    MetaData,
    Table,
    Text,
    create_engine,
    exc,
    insert,
    select,
    text,
)
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from app.store import DEFAULT_TABLE, ClaimIdentity, Completed, NewUpdate, SqlUpdateStore, open_store
from app.store.fencing import owns_in_transaction, owns_in_transaction_sync
from app.store.migrate import upgrade
from app.store.schema import make_table
from app.store.types import Route
from tests.conftest import Storage

BODY = '{"update_id": 1}'
HOLD = 0.4  # how long a rival is seen waiting
# The downstream's own table, written in the same transaction as the check.
EFFECTS = Table(
    "effects",
    MetaData(),
    Column("bot", Text, primary_key=True),
    Column("update_id", BigInteger, primary_key=True),
    Column("attempt", Integer, nullable=False),
)


def _now() -> int:
    return time.time_ns() // 1_000_000


def own_url(url: str, *, sync: bool) -> str:
    """The storage URL for the downstream's own engine: pysqlite or aiosqlite, psycopg."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        driver = "sqlite+pysqlite" if sync else "sqlite+aiosqlite"
    else:
        driver = "postgresql+psycopg"  # SQLAlchemy takes its async variant for an async engine
    return parsed.set(drivername=driver).render_as_string(hide_password=False)


@dataclass
class OwnTransaction:
    """One transaction of the downstream, on an async or a sync connection."""

    connection: AsyncConnection | Connection

    async def owns(self, identity: ClaimIdentity, *, table: str = DEFAULT_TABLE) -> bool:
        if isinstance(self.connection, AsyncConnection):
            return await owns_in_transaction(self.connection, identity, table=table)
        return owns_in_transaction_sync(self.connection, identity, table=table)

    async def reads_as_owner(self, identity: ClaimIdentity) -> bool:
        """The naive check, for controls: read the row, compare, lock nothing."""
        t = make_table()
        query = select(t.c.attempts, t.c.claim_id, t.c.state).where(
            t.c.bot == identity.bot, t.c.update_id == identity.update_id
        )
        if isinstance(self.connection, AsyncConnection):
            row = (await self.connection.execute(query)).first()
        else:
            row = self.connection.execute(query).first()
        return row is not None and tuple(row) == (identity.attempt, identity.claim_id, "processing")

    async def record_effect(self, identity: ClaimIdentity) -> None:
        values = {"bot": identity.bot, "update_id": identity.update_id}
        statement = insert(EFFECTS).values(**values, attempt=identity.attempt)
        if isinstance(self.connection, AsyncConnection):
            await self.connection.execute(statement)
        else:
            self.connection.execute(statement)


@asynccontextmanager
async def own_transaction(url: str, flavour: str) -> AsyncIterator[OwnTransaction]:
    """A transaction on a fresh engine of the downstream's own; commits when the block ends."""
    if flavour == "async":
        engine = create_async_engine(own_url(url, sync=False))
        try:
            async with engine.begin() as connection:
                yield OwnTransaction(connection)
        finally:
            await engine.dispose()
    else:
        sync_engine = create_engine(own_url(url, sync=True))
        try:
            with sync_engine.begin() as connection:
                yield OwnTransaction(connection)
        finally:
            sync_engine.dispose()


async def owns_alone(
    url: str, identity: ClaimIdentity, flavour: str, *, table: str = DEFAULT_TABLE
) -> bool:
    """One transaction that only checks. The sync flavour runs in a thread of its own, so it
    may wait for a lock without stopping the test's event loop."""
    if flavour == "async":
        async with own_transaction(url, "async") as transaction:
            return await transaction.owns(identity, table=table)

    def check() -> bool:
        engine = create_engine(own_url(url, sync=True))
        try:
            with engine.begin() as connection:
                return owns_in_transaction_sync(connection, identity, table=table)
        finally:
            engine.dispose()

    return await asyncio.to_thread(check)


def make_effects(url: str) -> None:
    engine = create_engine(own_url(url, sync=True))
    try:
        EFFECTS.metadata.create_all(engine)
    finally:
        engine.dispose()


def effects(url: str) -> list[tuple[object, ...]]:
    engine = create_engine(own_url(url, sync=True))
    try:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.execute(select(EFFECTS))]
    finally:
        engine.dispose()


@pytest.fixture
async def store(storage: Storage) -> AsyncIterator[SqlUpdateStore]:
    opened = await open_store(storage.url())
    yield opened
    await opened.close()


def _url(store: SqlUpdateStore) -> str:
    return store.engine.url.render_as_string(hide_password=False)


async def _claim(store: SqlUpdateStore, *, now: int, lease_until: int) -> ClaimIdentity:
    await store.add("shop", 1, BODY, 0)
    identity = await store.claim_owned("shop", 1, now=now, lease_until=lease_until, max_attempts=3)
    assert identity is not None
    return identity


@pytest.mark.parametrize("flavour", ["async", "sync"])
async def test_owns_in_transaction_answers_for_the_exact_live_claim(
    store: SqlUpdateStore, flavour: str
) -> None:
    url = _url(store)
    identity = await _claim(store, now=_now(), lease_until=_now() + 60_000)
    assert await owns_alone(url, identity, flavour)
    others = [
        replace(identity, bot="cafe"),
        replace(identity, update_id=2),
        replace(identity, attempt=2),
        replace(identity, claim_id=identity.claim_id.upper()),
    ]
    for other in others:
        assert not await owns_alone(url, other, flavour), other
    assert await owns_alone(url, identity, flavour)  # the checks changed nothing


@pytest.mark.parametrize("flavour", ["async", "sync"])
async def test_owns_in_transaction_answers_for_a_destination_s_delivery(
    store: SqlUpdateStore, flavour: str
) -> None:
    """A delivery beside the row (revision 0010): the five-argument SQL function on
    PostgreSQL, its own row's write lock on SQLite; default's identity is not its."""
    url, now = _url(store), _now()
    await store.add_many([NewUpdate("shop", 3, BODY, 0, routes=(Route("payments"),))])
    (paying,) = await store.claim_next_owned(
        now=now, lease_until=now + 60_000, max_attempts=3, limit=1, destination="payments"
    )
    identity = paying.identity
    assert identity.destination == "payments"
    assert await owns_alone(url, identity, flavour)
    for other in (replace(identity, destination="default"), replace(identity, attempt=2)):
        assert not await owns_alone(url, other, flavour), other
    assert await store.settle_owned(identity, Completed(at=_now()))
    assert not await owns_alone(url, identity, flavour)


@pytest.mark.parametrize("flavour", ["async", "sync"])
async def test_owns_in_transaction_is_false_once_the_lease_has_lapsed(
    store: SqlUpdateStore, flavour: str
) -> None:
    now = _now()
    identity = await _claim(store, now=now - 60_000, lease_until=now - 1_000)
    assert not await owns_alone(_url(store), identity, flavour)


@pytest.mark.parametrize("flavour", ["async", "sync"])
async def test_owns_in_transaction_is_false_once_the_claim_is_settled(
    store: SqlUpdateStore, flavour: str
) -> None:
    identity = await _claim(store, now=_now(), lease_until=_now() + 60_000)
    assert await store.settle_owned(identity, Completed(at=_now()))
    assert not await owns_alone(_url(store), identity, flavour)


@pytest.mark.parametrize(
    ("check", "flavour"),
    [("owns", "async"), ("owns", "sync"), ("plain read", "async")],
    ids=["owns_in_transaction", "owns_in_transaction_sync", "control: a plain read"],
)
async def test_owns_in_transaction_holds_off_a_reclaim_until_commit(
    store: SqlUpdateStore, check: str, flavour: str
) -> None:
    url = _url(store)
    make_effects(url)
    lease_until = _now() + 60_000
    identity = await _claim(store, now=_now(), lease_until=lease_until)
    # SQLite: the rival waits for the write lock (busy timeout); PostgreSQL: for the row lock.
    async with own_transaction(url, flavour) as transaction:
        if check == "owns":
            assert await transaction.owns(identity)
        else:
            assert await transaction.reads_as_owner(identity)
        rival = asyncio.create_task(
            store.claim_owned(
                "shop", 1, now=lease_until + 1, lease_until=lease_until + 60_000, max_attempts=3
            )
        )
        if check == "owns":
            await asyncio.sleep(HOLD)
            assert not rival.done(), "the reclaim passed the check's lock"
        else:
            # A read locks nothing: the reclaim passes, and the write below would land for an
            # attempt that no longer owns the update. This is what fencing is for.
            await asyncio.wait_for(asyncio.shield(rival), 5)
        await transaction.record_effect(identity)
    second = await rival
    assert second is not None
    assert second.attempt == identity.attempt + 1
    assert effects(url) == [("shop", 1, identity.attempt)]
    assert not await owns_alone(url, identity, flavour)


@pytest.mark.parametrize("flavour", ["async", "sync"])
async def test_owns_in_transaction_counts_the_wait_for_the_lock_against_the_lease(
    store: SqlUpdateStore, flavour: str
) -> None:
    # Two transactions check the same attempt (a duplicated delivery, say). The second waits
    # for the first's lock; the lease lapses meanwhile, so the second must answer False, as
    # the PostgreSQL function does: it takes the lock first, then reads the clock.
    url = _url(store)
    lease_until = _now() + 1_000
    identity = await _claim(store, now=_now(), lease_until=lease_until)
    async with own_transaction(url, "async") as first:
        assert await first.owns(identity)
        second = asyncio.create_task(owns_alone(url, identity, flavour))
        await asyncio.sleep((lease_until - _now()) / 1000 + HOLD)
        assert not second.done(), "the second check did not wait for the first"
    assert await second is False


async def test_owns_in_transaction_works_on_a_table_of_another_name(storage: Storage) -> None:
    url = storage.url(revision=None)
    upgrade(url, table="shop_updates")
    store = await open_store(url, table="shop_updates")
    try:
        identity = await _claim(store, now=_now(), lease_until=_now() + 60_000)
        for flavour in ("async", "sync"):
            assert await owns_alone(url, identity, flavour, table="shop_updates")
            other = replace(identity, attempt=2)
            assert not await owns_alone(url, other, flavour, table="shop_updates")
            # The default name points at nothing here: the table argument is what is used.
            with pytest.raises(exc.DBAPIError):
                await owns_alone(url, identity, flavour)
        if storage.backend == "postgresql":
            # Revision 0006's key function and its trigger's are named after the table too,
            # and 0010's five-argument owns beside the four-argument one.
            assert _functions(url) == [
                "shop_updates_owns",
                "shop_updates_owns",
                "shop_updates_queue_key",
                "shop_updates_queue_key_on_insert",
            ]
    finally:
        await store.close()


def _functions(url: str) -> list[str]:
    """The functions of the test's own schema."""
    engine = create_engine(own_url(url, sync=True))
    try:
        with engine.connect() as connection:
            query = text(
                "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                "WHERE n.nspname = current_schema() ORDER BY p.proname"
            )
            return [str(name) for name in connection.scalars(query)]
    finally:
        engine.dispose()


async def test_owns_in_transaction_refuses_a_table_name_it_cannot_trust(
    store: SqlUpdateStore,
) -> None:
    identity = ClaimIdentity("shop", 1, 1, "c")
    with pytest.raises(ValueError, match="table name"):
        await owns_alone(_url(store), identity, "async", table="effects; DROP TABLE effects")
