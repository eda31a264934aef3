"""The store's footing: the live schema's capability, argument checks, and the transactions
every method runs its statements in (through the database's `Backend`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from sqlalchemy import Row, Table, Update, literal, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.expression import Executable

from app.store import audit as audit_statements
from app.store import history, validate
from app.store import outbox as outbox_statements
from app.store.backend import Backend, History
from app.store.codec import PLAIN, Codec, audit_at
from app.store.errors import (
    UPGRADE_HINT,
    SchemaError,
    StorageFull,
    StoreError,
    StoreUnavailable,
    translated_errors,
)
from app.store.planner import PlannerStatistics
from app.store.revision import _LEVELS, capability_of, read_revision
from app.store.schema import (
    Revision,
    attempts_table_name,
    audit_bots_table_name,
    audit_table_name,
    bots_table_name,
    deliveries_table_name,
    delivery_attempts_table_name,
    destinations_table_name,
    erasures_table_name,
    events_table_name,
    keys_table_name,
    make_metadata,
    samples_table_name,
    sessions_table_name,
)
from app.store.sealing import Sealing
from app.store.storage import PROBE_SECONDS, Episode, StorageWatch
from app.store.types import (
    DEFAULT_DESTINATION,
    Capability,
    ClaimIdentity,
    DeliveryRow,
    NewUpdate,
    RecordedRow,
)


class SqlCore(Sealing, PlannerStatistics):
    """What every method stands on: the table, the live capability, the backend, and the
    kinds of transaction a statement runs in."""

    def __init__(
        self,
        engine: AsyncEngine,
        table: str,
        revision: Revision,
        *,
        history: bool = True,
        worker: str | None = None,
        events: bool = False,
        codec: Codec = PLAIN,
    ) -> None:
        """`engine` as `create_store_engine` makes it (on PostgreSQL: AUTOCOMMIT). `history`:
        record every attempt (revision 0004), as run by `worker` (default: host:pid).
        `events`: record the operational events (revision 0004; `operations_url` set).
        `codec`: what personal data is stored as (`app.store.codec`; PLAIN: as it is)."""
        self.codec = codec
        self.keeps_history = history
        self.records_events = events
        self.worker = worker or f"{socket.gethostname()}:{os.getpid()}"
        self._tables(table, revision)
        # Per bot filter: the next chat claim's window and the claims left to skip it
        # (`app.store.claims.chat_order.next_window`).
        self._chat_windows: dict[tuple[str, tuple[str, ...] | None], tuple[int, int]] = {}
        # The re-encryption's place in each table, by name (`app.store.keys.methods`): a pass
        # walks each in key order to its end (None: walked to its end in this pass).
        self._reencrypt_after: dict[str, tuple[Any, ...] | None] = {}
        self.revision: Revision = revision
        self._capability: Capability = capability_of(revision)
        self._backend: Backend = self._connect(engine)
        # Public, and what `transaction` opens: a real transaction on either backend.
        self.engine = self._backend.transactions
        self._backend.prepare(self.table, self.wake_channel, self._history(), self._outbox())
        # Whether it can write (`app.store.storage`), and the probe that runs while it cannot.
        self.storage = StorageWatch()
        self._probe: asyncio.Task[None] | None = None

    def _connect(self, engine: AsyncEngine) -> Backend:
        """The database's backend for `engine`: chosen by the composed store
        (`app.store.store`), which alone knows the backends."""
        raise NotImplementedError("a store composed over SqlCore chooses its backend")

    def _tables(self, table: str, revision: Revision) -> None:
        tables = make_metadata(table, revision).tables
        self.table: Table = tables[table]
        # The operator tables of revision 0004 (None below it).
        self.attempts_table: Table | None = tables.get(attempts_table_name(table))
        self.bots_table: Table | None = tables.get(bots_table_name(table))
        self.audit_table: Table | None = tables.get(audit_table_name(table))
        self.events_table: Table | None = tables.get(events_table_name(table))
        # Revision 0005's (None below it): the bots of audit entries, the console's sessions.
        self.audit_bots_table: Table | None = tables.get(audit_bots_table_name(table))
        self.sessions_table: Table | None = tables.get(sessions_table_name(table))
        # Revision 0009's (None below it): erasure jobs and the key registry.
        self.erasures_table: Table | None = tables.get(erasures_table_name(table))
        self.keys_table: Table | None = tables.get(keys_table_name(table))
        # Revision 0010's (None below it): the deliveries beside `default`'s, their history,
        # and each destination's control (docs/design.md decision 7).
        self.deliveries_table: Table | None = tables.get(deliveries_table_name(table))
        self.delivery_attempts_table: Table | None = tables.get(delivery_attempts_table_name(table))
        self.destinations_table: Table | None = tables.get(destinations_table_name(table))
        # Revision 0011's (None below it): the console's minute samples (decision 8).
        self.samples_table: Table | None = tables.get(samples_table_name(table))

    def _history(self) -> History | None:
        if self.attempts_table is None or not self.keeps_history:
            return None
        return History(self.attempts_table, self.worker)

    def _outbox(self) -> Table | None:
        """The events table, when this store records operational events."""
        return self.events_table if self.records_events else None

    async def _emit(
        self, connection: AsyncConnection, made: Sequence[outbox_statements.Made]
    ) -> None:
        """Write operational events in the caller's transaction, so they are sent if and only
        if what they tell of commits; nothing when events are off."""
        outbox = self._outbox()
        if outbox is not None and made:
            await connection.execute(outbox_statements.record(outbox, made, self.codec))

    @property
    def capability(self) -> Capability:
        return self._capability

    @property
    def dialect(self) -> str:
        return self._backend.name

    async def close(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            await asyncio.gather(self._probe, return_exceptions=True)
        await self._backend.close()
        await self.engine.dispose()

    async def refresh_capability(self) -> Capability:
        """Read the live schema again (after `alembic upgrade head` on a running service)."""
        self.revision = await read_revision(self.engine, self.table.name)
        self._capability = capability_of(self.revision)
        self._tables(self.table.name, self.revision)
        self._backend.prepare(self.table, self.wake_channel, self._history(), self._outbox())
        return self._capability

    def _needing(self, table: Table | None, feature: str, revision: Revision) -> Table:
        """`table`, one of those `revision` adds; SchemaError naming the upgrade when the live
        schema is below it."""
        if table is None:
            raise SchemaError(
                f"{feature} needs revision {revision} but table {self.table.name!r} is at "
                f"revision {self.revision}; {UPGRADE_HINT}"
            )
        return table

    def _delivery_table(self, destination: str) -> Table:
        """Where `destination`'s deliveries are: the update's table for `default`, the
        deliveries table (revision 0010; SchemaError below it) for any other."""
        if destination == DEFAULT_DESTINATION:
            return self.table
        validate.destination_name(destination)
        return self._needing(self.deliveries_table, f"destination {destination!r}", "0010")

    def _recordable(self, rows: Sequence[NewUpdate]) -> tuple[list[RecordedRow], list[DeliveryRow]]:
        """New rows and their deliveries as stored (`Sealing._stored_rows`); SchemaError when
        some go elsewhere than `default` and the live schema is below revision 0010."""
        stored, deliveries = self._stored_rows(rows)
        if deliveries or any(row.state != "pending" for row in stored):
            self._needing(self.deliveries_table, "routing updates to destinations", "0010")
        return stored, deliveries

    def require(self, level: Capability, feature: str) -> None:
        """Stop with SchemaError when the live schema is below `level`."""
        if _LEVELS[self._capability] < _LEVELS[level]:
            raise SchemaError(
                f"{feature} needs a {level} store but table {self.table.name!r} is at "
                f"revision {self.revision} ({self._capability}); {UPGRADE_HINT}"
            )

    @property
    def wake_channel(self) -> str:
        """The PostgreSQL channel notified by every commit that adds updates."""
        return f"{self.table.name}_added"

    async def ping(self) -> None:
        async with self._read() as connection:
            await connection.execute(select(literal(1)))

    async def database_time(self) -> int:
        """The database's clock, epoch ms. SQLite's file is on this host: its clock is ours."""
        with translated_errors(self.table.name):
            return await self._backend.database_time()

    async def listen(
        self, wake: Callable[[], None], *, listening: asyncio.Event | None = None
    ) -> None:
        """Call `wake` on every commit of another process that adds updates (PostgreSQL
        LISTEN), until cancelled; returns at once on SQLite."""
        await self._backend.listen(wake, listening=listening)

    async def announce(self) -> None:
        """Wake the workers of other processes now (the NOTIFY that `add_many` sends on its
        own); a no-op on SQLite, which has no listeners."""
        with translated_errors(self.table.name):
            await self._backend.announce()

    # -- transactions --------------------------------------------------------------------------

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """Around every write: the driver's errors translated, and the storage watch told how
        it went; a full disk begins an episode and the probe that ends it."""
        try:
            with translated_errors(self.table.name):
                yield
        except StorageFull as error:
            if self.storage.failed(error) and (self._probe is None or self._probe.done()):
                self._probe = asyncio.get_running_loop().create_task(self._probe_storage())
            raise
        except StoreUnavailable as error:
            error.during_full_disk = self.storage.full
            raise
        self.storage.wrote()

    async def _probe_storage(self) -> None:
        """While an episode of a full disk lasts, and until its events are written: give back
        what room the database can (SQLite's WAL), write its events, try a write of its own."""
        while self.storage.full or self.storage.untold:
            await asyncio.sleep(PROBE_SECONDS)
            with contextlib.suppress(StoreError):
                with translated_errors(self.table.name):  # no write of its own
                    await self._backend.give_back_room()
                for episode in list(self.storage.untold):
                    await self._tell(episode)
                if self.storage.full:
                    with self._writing():
                        await self._backend.probe_write()

    async def _tell(self, episode: Episode) -> None:
        """Write what is still unwritten of `episode`'s events (storage.full, and once it
        ended storage.recovered), when this store records events."""
        data: dict[str, Any] = {
            "worker": self.worker,
            "cause": episode.cause,
            "began_at": episode.began_at,
        }
        made = []
        if not episode.full_told:
            made.append(outbox_statements.Made("storage.full", episode.began_at, data))
        if episode.ended_at is not None:
            data = data | {
                "ended_at": episode.ended_at,
                "full_ms": episode.ended_at - episode.began_at,
            }
            made.append(outbox_statements.Made("storage.recovered", episode.ended_at, data))
        if self._outbox() is not None and made:
            async with self.transaction() as connection:
                await self._emit(connection, made)
        episode.full_told = True
        if episode.ended_at is not None:
            episode.recovered_told = True
            self.storage.told(episode)

    @asynccontextmanager
    async def _write(self) -> AsyncIterator[AsyncConnection]:
        """One write. On SQLite a transaction (BEGIN IMMEDIATE); on PostgreSQL the connection
        autocommits, so each statement is its own transaction: a method that needs several
        statements to commit together must use `transaction()` instead."""
        with self._writing():
            async with self._backend.write() as connection:
                yield connection

    async def _changed(self, statement: Executable) -> bool:
        """Run one transition in its own write transaction; whether it matched a row."""
        async with self._write() as connection:
            return (await connection.execute(statement)).first() is not None

    async def _ended(
        self,
        statement: Update,
        identity: ClaimIdentity,
        *,
        event: Callable[[Row[Any]], outbox_statements.Made] | None = None,
        **end: Any,
    ) -> bool:
        """Run a transition that ends the attempt of `identity` and, when it matched, end that
        attempt in its history (`history.ended`, with `end`), both in one write, and write
        the `event` the matched row makes (when events are on) in the same transaction;
        whether it matched."""
        follow = None
        kept = self._backend.history_of(self._delivery_table(identity.destination))
        if kept is not None:
            follow = history.ended(kept.attempts, identity, **end)
        if event is None or self._outbox() is None:
            async with self._write() as connection:
                return await self._backend.transition(connection, statement, follow) is not None
        async with self.transaction() as connection:
            row = await self._backend.transition(connection, statement, follow)
            if row is not None:
                await self._emit(connection, [event(row)])
        return row is not None

    @asynccontextmanager
    async def _read(self) -> AsyncIterator[AsyncConnection]:
        try:
            with translated_errors(self.table.name):
                async with self._backend.read() as connection:
                    yield connection
        except StoreUnavailable as error:
            error.during_full_disk = self.storage.full
            raise

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection]:
        """A write transaction for the caller's own statements in this database, committed on
        exit. Pass it to `owns(..., connection=)` to make the check and a domain write atomic;
        on SQLite it holds the write lock from its start. Call no other store method inside
        it: they would wait for this very transaction. Database errors raised inside it,
        the caller's own included, arrive as store errors."""
        with self._writing():
            async with self._backend.transaction() as connection:
                yield connection

    def _operator_tables(self, feature: str) -> tuple[Table, Table, Table]:
        if self.bots_table is None or self.audit_table is None or self.attempts_table is None:
            raise SchemaError(
                f"{feature} needs revision 0004 (operator control) but table "
                f"{self.table.name!r} is at revision {self.revision}; {UPGRADE_HINT}"
            )
        return self.bots_table, self.audit_table, self.attempts_table

    async def _record(
        self,
        connection: AsyncConnection,
        *,
        at: int,
        by: str,
        action: str,
        target: str,
        bots: Sequence[str] | None,
        detail: dict[str, Any] | None = None,
        matched: int | None = None,
        changed: int | None = None,
    ) -> None:
        """Write one audit entry in the acting transaction, with the bots it concerns (None:
        every bot, as a filter that names none)."""
        _, audit, _ = self._operator_tables("the audit log")
        statement = audit_statements.record_action(
            audit,
            at=at,
            key_name=by,
            action=action,
            target=target,
            detail=self.codec.seal_optional(
                None if detail is None else json.dumps(detail, sort_keys=True),
                audit_at(action, at),
            ),
            matched=matched,
            changed=changed,
        )
        entry = (await connection.execute(statement)).scalar_one()
        # Below revision 0005 (an old table a newer process writes during an upgrade) the entry
        # concerns no bot: it is shown only to keys of every bot, never too widely.
        if bots and self.audit_bots_table is not None:
            records = audit_statements.record_action_bots(
                self.audit_bots_table, entry, sorted(set(bots))
            )
            await connection.execute(records)
