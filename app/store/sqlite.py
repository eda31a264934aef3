"""SQLite: one file, one writer.

- Engines: WAL with `synchronous=FULL` (an acknowledged commit survives a power cut), a busy
  timeout, and write transactions that take the write lock up front (`BEGIN IMMEDIATE`), so
  two writers never deadlock upgrading read locks. Reads begin DEFERRED. A file only: an
  in-memory database would lose every update at exit, and is refused.
- The writes run most often (the batch insert, the claims, the batch settle) run whole on
  the writer's thread in one hand-off (`app.store.sqlite_writer`); the others go through
  the engine. The process queues both kinds of writer on one `asyncio.Lock`, which beats
  spinning in the busy timeout.
- Batches are one statement over `json_each()` of one JSON array, as PostgreSQL's are over
  `unnest()` of parameter arrays.
- The clock is this host's (the file is here), and there are no notifications: a worker in
  another process than the intake finds new rows by polling.
- `fencing.owns_in_transaction` (a downstream's own transaction) is a no-op write of the
  leased row here (`hold_owned`): the transaction then holds the write lock until it
  commits, so no reclaim can pass.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from sqlalchemy import (
    BigInteger,
    Engine,
    Insert,
    Row,
    Select,
    Table,
    Text,
    Update,
    and_,
    bindparam,
    delete,
    event,
    func,
    literal_column,
    select,
    type_coerce,
    update,
)
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.dml import ReturningDelete
from sqlalchemy.sql.expression import FromClause

from app.store import events, history, queries
from app.store.backend import Backend, ClaimShapes, History, Numbers
from app.store.history import ended_many
from app.store.predicates import identity_is, in_state
from app.store.sqlite_writer import Prepared, Result, Transaction, Writer
from app.store.types import ClaimIdentity, NewUpdate, Ordering, Settlement

BUSY_TIMEOUT_MS = 10_000
# Execution option read by the `begin` hook: reads need no write lock.
SQLITE_BEGIN = "intake_sqlite_begin"


# -- engines -----------------------------------------------------------------------------------


def _in_memory(url: URL) -> bool:
    database = url.database or ""
    memory = database in ("", ":memory:") or "mode=memory" in database
    return memory or url.query.get("mode") == "memory"


def engine_options(url: URL) -> dict[str, Any]:
    """`create_engine` arguments for this database URL."""
    if _in_memory(url):
        raise ValueError(
            f"database URL {url.render_as_string()!r} is an in-memory SQLite database, which "
            "loses every recorded update when the process ends: name a file"
        )
    database = url.database or ""
    if not database.startswith("file:"):
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    return {"connect_args": {"timeout": BUSY_TIMEOUT_MS / 1000}}


def set_up(dbapi_connection: Any) -> None:
    """Our pragmas, on the engine's connections and the writer's alike."""
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


def configure(sync_engine: Engine) -> None:
    """Our pragmas on every connection, and our BEGIN on every transaction."""

    @event.listens_for(sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        set_up(dbapi_connection)

    @event.listens_for(sync_engine, "begin")
    def _on_begin(connection: Any) -> None:
        mode = connection.get_execution_options().get(SQLITE_BEGIN, "IMMEDIATE")
        if mode not in ("IMMEDIATE", "DEFERRED"):
            raise ValueError(f"SQLite begin mode {mode!r} is not IMMEDIATE or DEFERRED")
        connection.exec_driver_sql(f"BEGIN {mode}")


def _connector(engine: AsyncEngine) -> Callable[[], sqlite3.Connection]:
    """How the writer opens its connection: the engine's file and options, our pragmas."""
    args, options = engine.dialect.create_connect_args(engine.url)

    def connect() -> sqlite3.Connection:
        connection: sqlite3.Connection = sqlite3.connect(  # type: ignore[call-overload]
            *args, **{**options, "timeout": BUSY_TIMEOUT_MS / 1000}
        )
        try:
            set_up(connection)
        except BaseException:
            connection.close()
            raise
        return connection

    return connect


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


def add(t: Table) -> Insert:
    """`add_many`'s INSERT over json_each() of the rows (`json_batch`): new keys as pending,
    existing ones skipped (duplicates within the batch too, the first one kept). It returns
    nothing (each row RETURNING gave was a step of the driver's own): the count it inserted
    tells when every key was new, and `inserted` which ones when some were not."""
    return queries.add_many(t, _json_batch(queries.ADD_COLUMNS), "sqlite")


def inserted(t: Table) -> Select[Any]:
    """The keys of `add`'s rows (the same parameter) whose rows have a rowid above `after`.
    SQLite gives a new row the rowid one above the table's largest, so the rows one INSERT adds
    (holding the write lock) are the last `count` rowids up to `last_insert_rowid()`: with
    `after` their first minus one, these are the keys the INSERT recorded."""
    rowid = literal_column(f"{t.name}.rowid", BigInteger)
    after = bindparam("after", type_=BigInteger)
    return queries.recorded(t, _json_batch(queries.KEY_COLUMNS)).where(rowid > after)


def add_rows(rows: Sequence[NewUpdate]) -> dict[str, str]:
    """The parameter of `add` for these rows."""
    columns = queries.ADD_COLUMNS
    return json_batch(columns, [{name: getattr(row, name) for name in columns} for row in rows])


def _json_batch(columns: dict[str, Any]) -> FromClause:
    """Rows passed as one JSON array of arrays (the parameter `batch`, `json_batch`), as the
    derived table `batch(columns...)`: SQLite's unnest(). One statement, whatever the size."""
    each = func.json_each(bindparam("batch", "[]", Text)).table_valued("value")
    return select(
        *(
            type_coerce(func.json_extract(each.c.value, f"$[{i}]"), kind).label(name)
            for i, (name, kind) in enumerate(columns.items())
        )
    ).subquery("batch")


def settle_many_owned(t: Table) -> Update:
    """`queries.settle_many_owned` over json_each() of the settlements (`json_batch` of
    `queries.settle_rows`)."""
    return queries.settle_many_owned(t, _json_batch(queries.SETTLE_COLUMNS))


def json_batch(columns: dict[str, Any], rows: Sequence[dict[str, Any]]) -> dict[str, str]:
    """The parameter of `_json_batch` for these rows."""
    array = [[row[name] for name in columns] for row in rows]
    return {"batch": json.dumps(array, ensure_ascii=False, separators=(",", ":"))}


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
        # One writer at a time, the engine's or the writer's; queueing ours here beats
        # spinning in busy_timeout.
        self.write_lock = asyncio.Lock()
        self.read_lock = nullcontext()
        self._writer = Writer(_connector(engine))
        self._add: Prepared | None = None
        self._inserted: Prepared | None = None
        self._claims = ClaimShapes(Prepared.of)
        self._history: History | None = None
        self._started: Prepared | None = None
        self._settle: Prepared | None = None
        self._ended: Prepared | None = None

    def prepare(
        self, table: Table, channel: str, history: History | None, outbox: Table | None
    ) -> None:
        self._add = Prepared.of(add(table))
        self._inserted = Prepared.of(inserted(table))
        self._claims = ClaimShapes(Prepared.of)
        self._history = history
        self._started = None if history is None else Prepared.of(history_insert(history.attempts))
        self._outbox = outbox
        fenced = "uncounted" in table.c  # the fenced methods' revision
        self._settle = Prepared.of(settle_many_owned(table)) if fenced else None
        batch = _json_batch(queries.SETTLE_COLUMNS)
        self._ended = None if history is None else Prepared.of(ended_many(history.attempts, batch))

    async def _write_whole(self, work: Callable[[Transaction], Result]) -> Result:
        """One write transaction run whole by the writer (`app.store.sqlite_writer`)."""
        async with self.write_lock:
            return await self._writer.run(work)

    async def close(self) -> None:
        await self._writer.close()

    def _record_claim(
        self, transaction: Transaction, rows: Sequence[Any], now: int, durable: bool
    ) -> None:
        """In the claim's transaction: the attempts it started enter their history, and the
        exhaustions it made (attempts spent) the outbox."""
        if self._started is not None and self._history is not None:
            started = history.start_rows(rows, now=now, worker=self._history.worker)
            if started:
                transaction.execute_many(self._started, started)
        if self._outbox is not None and durable:
            spent = events.spent_rows(rows, now=now)
            if spent:
                transaction.execute(events.record(self._outbox, spent))

    async def add_many(
        self, rows: Sequence[NewUpdate], *, guard: Update | None = None
    ) -> Sequence[Any] | None:
        statement, inserted, batch = self._add, self._inserted, add_rows(rows)
        assert statement is not None, "prepare() first"
        assert inserted is not None

        def work(transaction: Transaction) -> Sequence[Any] | None:
            if guard is not None and not transaction.execute(guard):
                return None
            if not rows:
                return []
            # Few steps of the driver whatever the batch: at each the writer's thread hands
            # the GIL back and must take it again from the busy event loop.
            count, last = transaction.insert(statement, batch)
            keys = {(row.bot, row.update_id) for row in rows}
            if count == len(keys):
                return rows  # every key new: the common case, one step
            if not count:
                return []
            found = transaction.execute(inserted, {**batch, "after": last - count})
            new = {(row.bot, row.update_id) for row in found}
            return [row for row in rows if (row.bot, row.update_id) in new]

        if guard is not None:  # the guard and the insert commit together, or neither does
            return await self._write_whole(work)
        async with self.write_lock:
            return await self._writer.run_each(work)

    async def claim_next_owned(
        self,
        table: Table,
        numbers: Numbers,
        *,
        ordering: Ordering,
        bots: list[str] | None,
        durable_exhaustion: bool,
    ) -> Sequence[Any]:
        claim = self._claims.get(
            table,
            ordering=ordering,
            bots=bots,
            durable_exhaustion=durable_exhaustion,
            lateral=False,
        )

        def work(transaction: Transaction) -> Sequence[Any]:
            rows = transaction.execute(claim, numbers)
            self._record_claim(transaction, rows, numbers["now"], durable_exhaustion)
            return rows

        return await self._write_whole(work)

    async def claim_recorded(self, statement: Update, now: int, *, durable: bool) -> Sequence[Any]:
        def work(transaction: Transaction) -> Sequence[Any]:
            rows = transaction.execute(statement)
            self._record_claim(transaction, rows, now, durable)
            return rows

        return await self._write_whole(work)

    async def settle_many_owned(
        self, table: Table, items: Sequence[tuple[ClaimIdentity, Settlement]]
    ) -> dict[tuple[str, int], bool | None]:
        # One statement for the batch and one for the history of the settled ones. No row is
        # ever busy: this transaction holds the one write lock.
        settle, end = self._settle, self._ended
        assert settle is not None, "settle_many_owned needs the fenced revision"
        rows = queries.settle_rows(items)

        def work(transaction: Transaction) -> dict[tuple[str, int], bool | None]:
            returned = transaction.execute(settle, json_batch(queries.SETTLE_COLUMNS, rows))
            settled: dict[tuple[str, int], bool | None] = {
                (row.bot, row.update_id): bool(row.waiting) for row in returned
            }
            if end is not None and settled:
                ended = [row for row in rows if (row["bot"], row["update_id"]) in settled]
                transaction.execute(end, json_batch(queries.SETTLE_COLUMNS, ended))
            return settled

        return await self._write_whole(work)

    async def transition(
        self, connection: AsyncConnection, statement: Update, follow: Update | None
    ) -> Row[Any] | None:
        # The caller's transaction holds the write lock: the two statements commit together.
        row: Row[Any] | None = (await connection.execute(statement)).first()
        if row is not None and follow is not None:
            await connection.execute(follow)
        return row

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
