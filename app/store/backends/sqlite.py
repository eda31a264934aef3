"""SQLite: one file, one writer.

- Engines: WAL with `synchronous=FULL` (an acknowledged commit survives a power cut), a busy
  timeout, and write transactions that take the write lock up front (`BEGIN IMMEDIATE`), so
  two writers never deadlock upgrading read locks. Reads begin DEFERRED. A file only: an
  in-memory database would lose every update at exit, and is refused.
- The writes run most often (the batch insert, the claims, the batch settle) run whole on
  the writer's thread in one hand-off (`app.store.backends.sqlite_writer`); the others go through
  the engine. The process queues both kinds of writer on one `asyncio.Lock`, which beats
  spinning in the busy timeout.
- Batches are one statement over `json_each()` of one JSON array, as PostgreSQL's are over
  `unnest()` of parameter arrays.
- The clock is this host's (the file is here), and there are no notifications: a worker in
  another process than the intake finds new rows by polling.
- `fencing.owns_in_transaction` (a downstream's own transaction) is a no-op write of the
  leased row here (`hold_owned`): the transaction then holds the write lock until it
  commits, so no reclaim can pass."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any, cast

from sqlalchemy import (
    Row,
    Table,
    Update,
    bindparam,
    delete,
    text,
)
from sqlalchemy.dialects import sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.dml import ReturningDelete

from app.store import history, outbox
from app.store.backend import Backend, History, Numbers, StatisticsAge
from app.store.backends.claim_shapes import ClaimShapes
from app.store.backends.sqlite_engine import SQLITE_BEGIN, connector
from app.store.backends.sqlite_statements import (
    _json_batch,
    add,
    add_deliveries,
    add_rows,
    delivery_rows,
    history_insert,
    inserted,
    json_batch,
    settle_many_owned,
)
from app.store.backends.sqlite_writer import Prepared, Result, Transaction, Writer
from app.store.claims import statements as claims
from app.store.history import ended_many
from app.store.schema import beside_deliveries, deliveries_table_name
from app.store.settles import statements as settles
from app.store.types import ClaimIdentity, DeliveryRow, Ordering, RecordedRow, Settlement


class SqliteBackend(Backend):
    upsert = staticmethod(sqlite.insert)
    name = "sqlite"

    def __init__(self, engine: AsyncEngine) -> None:
        super().__init__(engine)
        self.writes = self.transactions = engine
        self.reads = engine.execution_options(**{SQLITE_BEGIN: "DEFERRED"})
        # One writer at a time, the engine's or the writer's; queueing ours here beats
        # spinning in busy_timeout.
        self.write_lock = asyncio.Lock()
        self.read_lock = nullcontext()
        self._writer = Writer(connector(engine))
        self._add: Prepared | None = None
        self._inserted: Prepared | None = None
        self._add_deliveries: Prepared | None = None
        self._claims = ClaimShapes(Prepared.of)
        self._started: dict[str, Prepared] = {}  # by history table
        self._settle: Prepared | None = None
        self._ended: Prepared | None = None
        self._beside: tuple[Prepared, Prepared | None] | None = None  # `_settles_beside`

    def prepare(
        self, table: Table, channel: str, history: History | None, outbox: Table | None
    ) -> None:
        self._add = Prepared.of(add(table))
        self._inserted = Prepared.of(inserted(table))
        deliveries = table.metadata.tables.get(deliveries_table_name(table.name))
        self._add_deliveries = (
            None if deliveries is None else Prepared.of(add_deliveries(deliveries))
        )
        self._claims = ClaimShapes(Prepared.of)
        self._history = history
        self._started = {}
        self._outbox = outbox
        fenced = "uncounted" in table.c  # the fenced methods' revision
        self._settle = Prepared.of(settle_many_owned(table)) if fenced else None
        self._beside = None
        batch = _json_batch(settles.SETTLE_COLUMNS)
        self._ended = None if history is None else Prepared.of(ended_many(history.attempts, batch))

    async def _write_whole(self, work: Callable[[Transaction], Result]) -> Result:
        """One write transaction run whole by the writer (`sqlite_writer`)."""
        async with self.write_lock:
            return await self._writer.run(work)

    async def close(self) -> None:
        await self._writer.close()

    def _record_claim(
        self, transaction: Transaction, rows: Sequence[Any], now: int, durable: bool, table: Table
    ) -> None:
        """In the claim's transaction (of `table`'s rows): the attempts it started enter their
        history, and the exhaustions it made (attempts spent) the outbox."""
        kept = self.history_of(table)
        if kept is not None:
            started = history.start_rows(rows, now=now, worker=kept.worker)
            if started:
                transaction.execute_many(self._started_in(kept.attempts), started)
        if self._outbox is not None and durable:
            spent = outbox.spent_rows(rows, now=now)
            if spent:
                transaction.execute(outbox.record(self._outbox, spent))

    def _started_in(self, attempts: Table) -> Prepared:
        """The insert of the attempts a claim started, into `attempts`, prepared once."""
        prepared = self._started.get(attempts.name)
        if prepared is None:
            prepared = self._started[attempts.name] = Prepared.of(history_insert(attempts))
        return prepared

    async def add_many(
        self,
        rows: Sequence[RecordedRow],
        deliveries: Sequence[DeliveryRow] = (),
        *,
        guard: Update | None = None,
    ) -> Sequence[Any] | None:
        statement, inserted, batch = self._add, self._inserted, add_rows(rows)
        assert statement is not None, "prepare() first"
        assert inserted is not None
        routed = self._add_deliveries
        assert routed is not None or not deliveries, "deliveries need revision 0010"

        def work(transaction: Transaction) -> Sequence[Any] | None:
            if guard is not None and not transaction.execute(guard):
                return None
            if not rows:
                return []
            new = recorded(transaction)
            if deliveries and new and routed is not None:
                keys = {(row.bot, row.update_id) for row in new}
                given = [d for d in deliveries if (d.bot, d.update_id) in keys]
                if given:
                    transaction.insert(routed, delivery_rows(given))
            return new

        def recorded(transaction: Transaction) -> Sequence[Any]:
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
        destination: str | None = None,
    ) -> Sequence[Any]:
        claim = self._claims.get(
            table,
            ordering=ordering,
            bots=bots,
            durable_exhaustion=durable_exhaustion,
            lateral=False,
            destination=destination,
        )

        def work(transaction: Transaction) -> Sequence[Any]:
            rows = transaction.execute(claim, numbers)
            self._record_claim(transaction, rows, numbers["now"], durable_exhaustion, table)
            return rows

        return await self._write_whole(work)

    async def claim_recorded(self, statement: Update, now: int, *, durable: bool) -> Sequence[Any]:
        def work(transaction: Transaction) -> Sequence[Any]:
            rows = transaction.execute(statement)
            self._record_claim(transaction, rows, now, durable, cast(Table, statement.table))
            return rows

        return await self._write_whole(work)

    async def settle_many_owned(
        self, table: Table, items: Sequence[tuple[ClaimIdentity, Settlement]]
    ) -> dict[tuple[str, int], bool | None]:
        # One statement for the batch and one for the history of the settled ones. No row is
        # ever busy: this transaction holds the one write lock.
        settle, end = self._settle, self._ended
        assert settle is not None, "settle_many_owned needs the fenced revision"
        if beside_deliveries(table):  # revision 0010: prepared once, at the first settle
            settle, end = self._settles_beside(table)
        rows = settles.settle_rows(items)

        def work(transaction: Transaction) -> dict[tuple[str, int], bool | None]:
            returned = transaction.execute(settle, json_batch(settles.SETTLE_COLUMNS, rows))
            settled: dict[tuple[str, int], bool | None] = {
                (row.bot, row.update_id): bool(row.waiting) for row in returned
            }
            if end is not None and settled:
                ended = [row for row in rows if (row["bot"], row["update_id"]) in settled]
                transaction.execute(end, json_batch(settles.SETTLE_COLUMNS, ended))
            return settled

        return await self._write_whole(work)

    def _settles_beside(self, table: Table) -> tuple[Prepared, Prepared | None]:
        """The batch settle of the deliveries table and the end of its attempts' history."""
        if self._beside is None:
            kept = self.history_of(table)
            batch = _json_batch(settles.SETTLE_COLUMNS)
            ended = None if kept is None else Prepared.of(ended_many(kept.attempts, batch))
            self._beside = (Prepared.of(settle_many_owned(table)), ended)
        return self._beside

    async def transition(
        self, connection: AsyncConnection, statement: Update, follow: Update | None
    ) -> Row[Any] | None:
        # The caller's transaction holds the write lock: the two statements commit together.
        row: Row[Any] | None = (await connection.execute(statement)).first()
        if row is not None and follow is not None:
            await connection.execute(follow)
        return row

    async def delete_recorded(
        self, connection: AsyncConnection, statement: ReturningDelete[Any], beside: Sequence[Table]
    ) -> int:
        keys = (await connection.execute(statement)).all()
        for table in beside if keys else ():
            forget = delete(table).where(
                table.c.bot == bindparam("k_bot"), table.c.update_id == bindparam("k_id")
            )
            await connection.execute(forget, [{"k_bot": b, "k_id": u} for b, u in keys])
        return len(keys)

    async def owns(
        self, connection: AsyncConnection, table: Table, identity: ClaimIdentity, at: int
    ) -> Row[Any] | None:
        statement = claims.owns(table, identity=identity, at=at, lock=False)
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
            statement = claims.renew_owned(
                table, identity=identity, lease_until=lease_until, now=now
            )
            row = (await connection.execute(statement)).first()
            if row is not None:
                leases[identity] = int(row.due_at)
        return leases

    async def exclusive(self, connection: AsyncConnection, table: Table, purpose: str) -> bool:
        return True  # the transaction holds the file's one write lock already

    async def statistics_age(self, connection: AsyncConnection, table: Table) -> StatisticsAge:
        # SQLite counts no changes, and needs none: its statements name the index each walk
        # reads (INDEXED BY, a unary + where an index must not serve), whatever the statistics.
        return StatisticsAge(0, 0.0, 0.0, 0)

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

    async def give_back_room(self) -> None:
        """Checkpoint the WAL into the file and truncate it to nothing (the writer does it as
        a full disk begins too, and keeps the WAL small from then on: `sqlite_writer`). It
        fails, with SQLite's full-disk error, while the file cannot grow."""

        async with self.write_lock:
            await self._writer.make_room()

    async def probe_write(self) -> None:
        """Rewrite the file's header (its user_version, unchanged, which nothing reads): a page
        the WAL must take."""

        def rewrite_header(transaction: Transaction) -> None:
            [row] = transaction.execute(text("PRAGMA user_version"))
            transaction.execute(text(f"PRAGMA user_version = {int(row[0])}"))

        await self._write_whole(rewrite_header)
