"""What differs between SQLite and PostgreSQL, behind one small interface.

`SqlUpdateStore` (`app.store.store`) is written once: it checks arguments, builds the
statements of each family's `statements` and maps rows. Where the two databases need different
work it asks its `Backend`: how connections are taken and queued (SQLite's one writer,
PostgreSQL's pool), how the batch statements run (one executemany in a transaction against
parameter arrays in binary, compiled once), the clock, and the wake-ups across processes. Each
backend is one module (`app.store.backends.sqlite`, `app.store.backends.postgres`), beside its
statements and its engine.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row, Table, Update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.dml import ReturningDelete

from app.store.predicates import Upsert
from app.store.schema import beside_deliveries, delivery_attempts_table_name, updates_of
from app.store.types import ClaimIdentity, DeliveryRow, Ordering, RecordedRow, Settlement

Numbers = dict[str, int]  # claim_next_owned's now, lease_until, max_attempts, limit and window


@dataclass(frozen=True)
class History:
    """Where the attempts a store starts are recorded (`app.store.history`), and as whose."""

    attempts: Table
    worker: str


def history_beside(table: Table, history: History | None) -> History | None:
    """`history` (the update's table's) as it stands for `table`: for the deliveries table,
    the same worker's, recorded in `_delivery_attempts`."""
    if history is None or not beside_deliveries(table):
        return history
    name = delivery_attempts_table_name(updates_of(table).name)
    return History(table.metadata.tables[name], history.worker)


@dataclass(frozen=True, slots=True)
class StatisticsAge:
    """How far the planner's statistics of a table lag behind it, as the database counts."""

    changes: int  # rows written since they were last gathered (or since ever)
    seconds: float | None  # since they were gathered; None: never
    rows: float  # the rows the table held then
    live: int  # the rows it holds now


class Backend(ABC):
    """One database's way of running the store's statements.

    The writes run most often (`add_many`, the claims, `settle_many_owned`) open their own
    transaction: SQLite runs each whole in one hand-off to its writer thread.

    Subclasses set, in `__init__`: `writes` (the engine a single write runs on), `reads`
    (the engine for reads), `transactions` (the engine for a caller's multi-statement
    transaction), `write_lock` and `read_lock` (what a caller queues on first)."""

    name: str
    # The dialect's INSERT, the one that knows ON CONFLICT, for the shared statements.
    upsert: Upsert
    writes: AsyncEngine
    reads: AsyncEngine
    transactions: AsyncEngine
    write_lock: AbstractAsyncContextManager[Any]
    read_lock: AbstractAsyncContextManager[Any]

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._history: History | None = None

    def history_of(self, table: Table) -> History | None:
        """Where the attempts of `table`'s deliveries are recorded: the `history` given to
        `prepare` for the update's table, `_delivery_attempts` beside it for the deliveries
        table (revision 0010); None when the store keeps none."""
        return history_beside(table, self._history)

    @abstractmethod
    def prepare(
        self, table: Table, channel: str, history: History | None, outbox: Table | None
    ) -> None:
        """(Re)build what depends on the table's shape: at start and after a migration.
        With `history`, the claims and batch settles record each attempt in it; with `outbox`
        (the events table, when operational events are on), a durable claim that ends a row
        whose attempts are spent writes its exhaustion.created there
        (`app.store.outbox`)."""

    @abstractmethod
    async def transition(
        self, connection: AsyncConnection, statement: Update, follow: Update | None
    ) -> Row[Any] | None:
        """Run one conditional transition (an UPDATE ... RETURNING) and, only when it matched
        a row, `follow` (its history), as one statement where the database can (PostgreSQL:
        a data-modifying CTE), else in this transaction; the transition's first row."""

    @abstractmethod
    async def claim_recorded(self, statement: Update, now: int, *, durable: bool) -> Sequence[Any]:
        """In a write transaction of its own: run a claim (an UPDATE ... RETURNING bot,
        update_id, attempts, claim_id, state, update_type, queue_key) and record the attempts
        it started in the history (when kept), started at `now`, and (`durable`) the
        exhaustions it made in the outbox."""

    @abstractmethod
    async def delete_recorded(
        self, connection: AsyncConnection, statement: ReturningDelete[Any], beside: Sequence[Table]
    ) -> int:
        """Run a DELETE of updates (its RETURNING names bot and update_id) and delete what
        `beside` holds of them (their history, their deliveries and theirs) with them; the
        count of updates deleted."""

    @asynccontextmanager
    async def write(self) -> AsyncIterator[AsyncConnection]:
        """One write transaction (on PostgreSQL: one autocommitted statement at a time)."""
        async with self.write_lock, self.writes.begin() as connection:
            yield connection

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        async with self.read_lock, self.reads.connect() as connection:
            yield connection

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection]:
        """A real transaction for several statements, committed on exit."""
        async with self.write_lock, self.transactions.begin() as connection:
            yield connection

    @abstractmethod
    async def add_many(
        self,
        rows: Sequence[RecordedRow],
        deliveries: Sequence[DeliveryRow] = (),
        *,
        guard: Update | None = None,
    ) -> Sequence[Any] | None:
        """In a write transaction of its own: insert new keys as their rows say (pending or
        unrouted), and the `deliveries` of the new ones beside them (revision 0010); the rows
        (bot, update_id) that were new. With `guard` (an UPDATE ... RETURNING), run it first in
        the same transaction, and record nothing (None) unless it matched a row."""

    @abstractmethod
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
        """In a write transaction of its own: the rows `claims.claim_next_owned` returns (on
        the deliveries table, `destination`'s), their attempts recorded as `claim_recorded`
        records them."""

    @abstractmethod
    async def owns(
        self, connection: AsyncConnection, table: Table, identity: ClaimIdentity, at: int
    ) -> Row[Any] | None:
        """The lease (`due_at`) of the exact live claim, read without a lock, or None."""

    @abstractmethod
    async def owned_leases(
        self,
        connection: AsyncConnection,
        table: Table,
        identities: Sequence[ClaimIdentity],
        at: int,
    ) -> dict[ClaimIdentity, int]:
        """The lease (`due_at`) of each identity that is the exact live claim at `at`, read
        without a lock; the others are absent."""

    @abstractmethod
    async def renewed_leases(
        self,
        connection: AsyncConnection,
        table: Table,
        renewals: Sequence[tuple[ClaimIdentity, int]],
        now: int,
    ) -> dict[ClaimIdentity, int]:
        """Renew each identity (distinct ones) that holds a live lease at `now` to its
        `lease_until`, never shortening, in this transaction; the leases after it. A renewal
        left out was refused or (PostgreSQL) skipped because another transaction holds its
        row: the caller asks again alone."""

    @abstractmethod
    async def settle_many_owned(
        self, table: Table, items: Sequence[tuple[ClaimIdentity, Settlement]]
    ) -> dict[tuple[str, int], bool | None]:
        """In a write transaction of its own: settle each item fenced; for each key that took
        effect, whether a later update of its chat may still be waiting; None for a key still
        owned whose row another transaction held locked, skipped rather than waited for."""

    async def close(self) -> None:  # noqa: B027 - most backends hold nothing beside the engine
        """Release what the backend holds beside the engine."""

    @abstractmethod
    async def exclusive(self, connection: AsyncConnection, table: Table, purpose: str) -> bool:
        """Inside a `transaction`: whether this transaction is now the only one of any
        process doing `purpose` to `table` (held until it ends); False at once when another
        transaction holds it."""

    @abstractmethod
    async def statistics_age(self, connection: AsyncConnection, table: Table) -> StatisticsAge:
        """How far the planner's statistics of `table` lag behind it."""

    @abstractmethod
    async def analyze(self, connection: AsyncConnection, table: Table) -> None:
        """Gather the planner's statistics of `table` (sampled, bounded in time)."""

    @abstractmethod
    async def dead_rows(
        self, connection: AsyncConnection, table: Table
    ) -> tuple[int, int, float | None]:
        """Dead rows in `table` as the database counts them, live rows, and the seconds since it
        was last vacuumed (None: never)."""

    @abstractmethod
    async def vacuum(self, connection: AsyncConnection, table: Table) -> None:
        """Make the dead rows' space reusable, on a connection outside any transaction; at once
        when another vacuum holds the table."""

    @abstractmethod
    async def database_time(self) -> int:
        """The database's clock, epoch ms."""

    @abstractmethod
    async def listen(
        self, wake: Callable[[], None], *, listening: asyncio.Event | None = None
    ) -> None:
        """Call `wake` on every commit of another process that adds updates, until
        cancelled; return at once where there are no notifications."""

    @abstractmethod
    async def announce(self) -> None:
        """Wake the listeners of other processes now."""

    async def give_back_room(self) -> None:  # noqa: B027 - only SQLite keeps room to give back
        """After a full disk: return to the volume what the database holds beyond its data
        (SQLite's WAL), so that writes resume once the volume has room."""

    @abstractmethod
    async def probe_write(self) -> None:
        """A small write of no consequence that needs new room on the database's volume: it
        fails with the database's own full-disk error while there is none."""
