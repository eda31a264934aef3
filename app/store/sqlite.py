"""SQLite: one file, one writer.

- Engines: WAL with `synchronous=FULL` (an acknowledged commit survives a power cut), a busy
  timeout, and write transactions that take the write lock up front (`BEGIN IMMEDIATE`), so
  two writers never deadlock upgrading read locks. Reads begin DEFERRED.
- Locking: the process queues its writers on one `asyncio.Lock`, which beats spinning in the
  busy timeout; an in-memory database is one shared connection, so its reads queue there too.
- Batches are local statements in one transaction: the cost is its single commit.
- The clock is this host's (the file is here), and there are no notifications: a worker in
  another process than the intake finds new rows by polling.
- `fencing.owns_in_transaction` (a downstream's own transaction) is a no-op write of the
  leased row here (`hold_owned`): the transaction then holds the write lock until it
  commits, so no reclaim can pass.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from sqlalchemy import (
    BigInteger,
    Engine,
    Integer,
    Row,
    Table,
    Update,
    and_,
    bindparam,
    delete,
    event,
    update,
)
from sqlalchemy.dialects.sqlite import insert
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.pool import StaticPool
from sqlalchemy.sql.dml import ReturningDelete

from app.store import events, history, queries
from app.store.backend import Backend, History, Numbers
from app.store.predicates import identity_is, in_state
from app.store.types import ClaimIdentity, NewUpdate, Ordering, Settlement

BUSY_TIMEOUT_MS = 10_000
# Execution option read by the `begin` hook: reads need no write lock.
SQLITE_BEGIN = "intake_sqlite_begin"


# -- engines -----------------------------------------------------------------------------------


def _in_memory(url: URL) -> bool:
    database = url.database or ""
    return database in ("", ":memory:") or "mode=memory" in database


def engine_options(url: URL) -> dict[str, Any]:
    """`create_engine` arguments for this database URL."""
    if _in_memory(url):
        # One shared connection, or every pooled connection would see its own empty database.
        return {"poolclass": StaticPool, "connect_args": {"check_same_thread": False}}
    database = url.database or ""
    if not database.startswith("file:"):
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    return {"connect_args": {"timeout": BUSY_TIMEOUT_MS / 1000}}


def configure(sync_engine: Engine) -> None:
    """Our pragmas on every connection, and our BEGIN on every transaction."""

    @event.listens_for(sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Hand transaction control to us: pysqlite's implicit BEGIN is deferred.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        _use_wal(cursor)
        cursor.execute("PRAGMA synchronous = FULL")
        # A page cache of 64 MiB (SQLite's default is 2 MiB): the table's eight indexes take
        # their deletes and updates at scattered places (a prune in time order touches every
        # chat's range of ix_chat), and a cache smaller than their working set rereads pages
        # for every row.
        cursor.execute("PRAGMA cache_size = -65536")
        cursor.close()

    @event.listens_for(sync_engine, "begin")
    def _on_begin(connection: Any) -> None:
        mode = connection.get_execution_options().get(SQLITE_BEGIN, "IMMEDIATE")
        if mode not in ("IMMEDIATE", "DEFERRED"):
            raise ValueError(f"SQLite begin mode {mode!r} is not IMMEDIATE or DEFERRED")
        connection.exec_driver_sql(f"BEGIN {mode}")


def _use_wal(cursor: Any) -> None:
    """Switch the file to WAL (it stays so). The switch needs the file to itself and answers
    "database is locked" at once, busy timeout or not, while another process opens the same new
    file: retry it within the busy timeout."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    pause = 0.005
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


# -- statements of SQLite only -----------------------------------------------------------------


def add(t: Table) -> Any:
    """`add_many`'s INSERT, run as executemany: new keys as pending, existing ones skipped
    (duplicates within the batch too); RETURNING names the keys that were new."""
    many = insert(t).on_conflict_do_nothing(index_elements=[t.c.bot, t.c.update_id])
    return many.returning(t.c.bot, t.c.update_id)


def add_rows(rows: Sequence[NewUpdate]) -> list[dict[str, Any]]:
    """The parameters of `add` for these rows, one dictionary a row."""
    return [
        {
            **{name: getattr(row, name) for name in queries.ADD_COLUMNS},
            "state": "pending",
            "attempts": 0,
            # A pending row's due_at is its received_at: `due` and the due-order index rely on it.
            "due_at": row.received_at,
        }
        for row in rows
    ]


def history_insert(attempts: Table) -> Any:
    """The executemany insert of the attempts a claim started (`history.start_rows`)."""
    return history.insert_started(attempts, "sqlite")


def hold_owned(t: Table, *, identity: ClaimIdentity) -> Update:
    """`owns` inside a caller's transaction: a no-op write of the identity's leased row, which
    takes the one write lock until that transaction ends (a SELECT would take none). It returns
    the lease; `held` compares it with the clock read after the statement, so time spent
    waiting for the lock counts against the lease (as in the PostgreSQL function)."""
    leased = and_(identity_is(t, identity), in_state(t.c.state, "processing"))
    return update(t).where(leased).values(due_at=t.c.due_at).returning(t.c.due_at)


def held(row: Any) -> bool:
    """Whether `hold_owned`'s row proves a live lease now (live at exactly due_at)."""
    return row is not None and row[0] >= time.time_ns() // 1_000_000


# -- the backend -------------------------------------------------------------------------------


class SqliteBackend(Backend):
    name = "sqlite"

    def __init__(self, engine: AsyncEngine) -> None:
        super().__init__(engine)
        self.writes = self.transactions = engine
        self.reads = engine.execution_options(**{SQLITE_BEGIN: "DEFERRED"})
        # One writer at a time; queueing ours here beats spinning in busy_timeout.
        self.write_lock = asyncio.Lock()
        # An in-memory database is one shared connection: a read must not overlap a write.
        shared = isinstance(engine.pool, StaticPool)
        self.read_lock = self.write_lock if shared else nullcontext()
        self._add: Any = None
        self._claims: dict[tuple[Any, ...], Update] = {}
        self._history: History | None = None
        self._started: Any = None

    def prepare(
        self, table: Table, channel: str, history: History | None, outbox: Table | None
    ) -> None:
        self._add = add(table)
        self._claims = {}
        self._history = history
        self._started = None if history is None else history_insert(history.attempts)
        self._outbox = outbox

    async def _record_claim(
        self, connection: AsyncConnection, rows: Sequence[Row[Any]], now: int, durable: bool
    ) -> None:
        """In the claim's transaction: the attempts it started enter their history, and the
        exhaustions it made (attempts spent) the outbox."""
        if self._history is not None:
            started = history.start_rows(rows, now=now, worker=self._history.worker)
            if started:
                await connection.execute(self._started, started)
        if self._outbox is not None and durable:
            spent = events.spent_rows(rows, now=now)
            if spent:
                await connection.execute(events.record(self._outbox, spent))

    async def add_many(
        self, connection: AsyncConnection, rows: Sequence[NewUpdate]
    ) -> Sequence[Row[Any]]:
        return (await connection.execute(self._add, add_rows(rows))).all()

    async def claim_next_owned(
        self,
        connection: AsyncConnection,
        table: Table,
        numbers: Numbers,
        *,
        ordering: Ordering,
        bots: list[str] | None,
        durable_exhaustion: bool,
    ) -> Sequence[Row[Any]]:
        # Built once per shape, its numbers bound at each run: building the chat-ordered
        # statement costs milliseconds of Python, more than SQLite takes to run it.
        key = (ordering, None if bots is None else tuple(bots), durable_exhaustion)
        statement = self._claims.get(key)
        if statement is None:
            if len(self._claims) >= 64:  # shapes are few; callers listing ever new bots are not
                self._claims.clear()
            statement = self._claims[key] = queries.claim_next_owned(
                table,
                now=bindparam("now", type_=BigInteger),
                lease_until=bindparam("lease_until", type_=BigInteger),
                max_attempts=bindparam("max_attempts", type_=Integer),
                limit=bindparam("limit", type_=Integer),
                window=bindparam("window", type_=Integer),
                ordering=ordering,
                bots=bots,
                durable_exhaustion=durable_exhaustion,
                lateral=False,
            )
        rows = (await connection.execute(statement, dict(numbers))).all()
        await self._record_claim(connection, rows, numbers["now"], durable_exhaustion)
        return rows

    async def transition(
        self, connection: AsyncConnection, statement: Update, follow: Update | None
    ) -> Row[Any] | None:
        # The caller's transaction holds the write lock: the two statements commit together.
        row: Row[Any] | None = (await connection.execute(statement)).first()
        if row is not None and follow is not None:
            await connection.execute(follow)
        return row

    async def claim_recorded(
        self, connection: AsyncConnection, statement: Update, now: int, *, durable: bool
    ) -> Sequence[Row[Any]]:
        rows = (await connection.execute(statement)).all()
        await self._record_claim(connection, rows, now, durable)
        return rows

    async def delete_recorded(
        self, connection: AsyncConnection, statement: ReturningDelete[Any], attempts: Table | None
    ) -> int:
        keys = (await connection.execute(statement)).all()
        if attempts is not None and keys:
            forget = delete(attempts).where(
                attempts.c.bot == bindparam("k_bot"), attempts.c.update_id == bindparam("k_id")
            )
            await connection.execute(forget, [{"k_bot": b, "k_id": u} for b, u in keys])
        return len(keys)

    async def owns(
        self, connection: AsyncConnection, table: Table, identity: ClaimIdentity, at: int
    ) -> Row[Any] | None:
        statement = queries.owns(table, identity=identity, at=at, lock=False)
        row: Row[Any] | None = (await connection.execute(statement)).first()
        return row

    async def owned_leases(
        self,
        connection: AsyncConnection,
        table: Table,
        identities: Sequence[ClaimIdentity],
        at: int,
    ) -> dict[ClaimIdentity, int]:
        # One read transaction of the local file: a statement each costs no round trip.
        leases = {}
        for identity in identities:
            row = await self.owns(connection, table, identity, at)
            if row is not None:
                leases[identity] = int(row.due_at)
        return leases

    async def renewed_leases(
        self,
        connection: AsyncConnection,
        table: Table,
        renewals: Sequence[tuple[ClaimIdentity, int]],
        now: int,
    ) -> dict[ClaimIdentity, int]:
        # One write transaction of the local file: a statement each costs no round trip.
        leases = {}
        for identity, lease_until in renewals:
            statement = queries.renew_owned(
                table, identity=identity, lease_until=lease_until, now=now
            )
            row = (await connection.execute(statement)).first()
            if row is not None:
                leases[identity] = int(row.due_at)
        return leases

    async def settle_many_owned(
        self,
        connection: AsyncConnection,
        table: Table,
        items: Sequence[tuple[ClaimIdentity, Settlement]],
    ) -> dict[tuple[str, int], bool | None]:
        # Every settled key counts as waiting: asking would cost a query, and misses none. No
        # row is ever busy: this transaction holds the one write lock.
        settled: dict[tuple[str, int], bool | None] = {}
        for identity, settlement in items:
            statement = queries.settle_owned(table, identity=identity, settlement=settlement)
            follow = (
                None
                if self._history is None
                else history.ended_by_settle(self._history.attempts, identity, settlement)
            )
            if await self.transition(connection, statement, follow) is not None:
                settled[(identity.bot, identity.update_id)] = True
        return settled

    async def exclusive(self, connection: AsyncConnection, table: Table, purpose: str) -> bool:
        return True  # the transaction holds the file's one write lock already

    async def statistics_age(
        self, connection: AsyncConnection, table: Table
    ) -> tuple[int, float, float] | None:
        # SQLite counts no changes, and needs none: its statements name the index each walk
        # reads (INDEXED BY, a unary + where an index must not serve), whatever the statistics.
        return 0, 0.0, 0.0

    async def analyze(self, connection: AsyncConnection, table: Table) -> None:
        return

    async def dead_rows(
        self, connection: AsyncConnection, table: Table
    ) -> tuple[int, int, float | None]:
        # None to reclaim: a deleted row's pages go to the file's free list, and the next
        # inserts take them (VACUUM would rewrite the whole file under the one write lock).
        return 0, 0, None

    async def vacuum(self, connection: AsyncConnection, table: Table) -> None:
        return

    async def database_time(self) -> int:
        return time.time_ns() // 1_000_000

    async def listen(
        self, wake: Callable[[], None], *, listening: asyncio.Event | None = None
    ) -> None:
        return

    async def announce(self) -> None:
        return
