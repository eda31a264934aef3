"""PostgreSQL: a pool of autocommitting connections, batches over parameter arrays, NOTIFY.

- Engines: psycopg 3, pooled without overflow and without pre-ping. The engine autocommits:
  almost every store method is one statement, its own transaction, with no BEGIN and COMMIT
  round trips. A caller's transaction (`transactions`) is a READ COMMITTED view of it.
- Locking: callers queue for the pool's connections in arrival order (a semaphore of the
  pool's size). The pool's own queue lets a newcomer take a connection handed to a waiter,
  and under load some requests then wait seconds while most wait milliseconds.
- The statements run most often (the batch insert, the batch settle, `owns`, the claim per
  shape) are compiled once to psycopg's SQL; their batch arrays travel in binary. The claim,
  longer than psycopg's cache of converted statements takes, is converted to `$n` once. They
  run on kept connections, which plan each statement once (`postgres_execution.Kept`); the
  settle on one of its own.
- The clock is the database's: the one clock the leases of every host share.
- Wake-ups across processes: every commit that adds updates NOTIFYs the table's channel, and
  `listen` holds one connection of its own, outside the pool, that LISTENs on it.
- Behind PgBouncer in transaction pooling mode (`pgbouncer=True`): consecutive transactions of
  one connection may run on different server sessions, so nothing may outlive a transaction.
  psycopg prepares no statements (a prepared statement stays on the server session, where
  another client meets its name), the timeouts are not sent at connect (PgBouncer refuses
  the `options` startup parameter; they belong to the role, and the first connection says
  when the server's differ), and LISTEN, which needs a session, uses the direct
  `listen_url` or, without one, is left to polling. Both travel as execution options of
  the engine (`PGBOUNCER`, `LISTEN_URL`).
- `fencing.owns_in_transaction` (a downstream's own transaction) is the SQL function of
  revision 0002 here (FOR UPDATE, database clock)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any
from typing import cast as typed

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Integer,
    Row,
    Select,
    Table,
    Text,
    Update,
    bindparam,
    cast,
    exists,
    func,
    literal,
    literal_column,
    select,
    text,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import OID
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.dml import ReturningDelete
from sqlalchemy.sql.elements import ClauseElement

from app.store import history, outbox
from app.store.backend import Backend, History, Numbers, StatisticsAge
from app.store.backends.claim_shapes import ClaimShapes
from app.store.backends.postgres_execution import Compiled, Kept, direct, driver_sql, execute
from app.store.backends.postgres_listener import listen_forever
from app.store.backends.postgres_statements import (
    IDENTITY_COLUMNS,
    PG_CLASS,
    PROBE,
    RENEW_COLUMNS,
    STAT_USER_TABLES,
    add,
    add_arrays,
    announce,
    arrays,
    database_time,
    fenced,
    settle_many_parameters,
)
from app.store.history import started as started_in
from app.store.schema import beside_deliveries, deliveries_table_name
from app.store.types import (
    ClaimIdentity,
    DeliveryRow,
    Ordering,
    RecordedRow,
    Settlement,
    identity_of,
)

log = logging.getLogger(__name__)


class PostgresBackend(Backend):
    upsert = staticmethod(postgresql.insert)
    name = "postgresql"

    def __init__(self, engine: AsyncEngine) -> None:
        super().__init__(engine)
        self.writes = self.reads = engine
        self.transactions = engine.execution_options(isolation_level="READ COMMITTED")
        self.write_lock = self.read_lock = asyncio.Semaphore(engine.pool.size())  # type: ignore[attr-defined]
        self._channel = ""
        self._compiled: dict[str, Compiled] = {}
        self._beside: dict[str, Compiled] = {}  # the deliveries table's (revision 0010)
        self._claims = ClaimShapes(self._claim_sql)
        self._kept = Kept(engine, self.write_lock)  # the insert's and the claim's
        self._settling = Kept(engine, self.write_lock, fewest=3)  # where the pool spares a third

    def prepare(
        self, table: Table, channel: str, history: History | None, outbox: Table | None
    ) -> None:
        self._channel = channel
        self._history = history
        self._outbox = outbox
        statements: dict[str, ClauseElement] = {"add": add(table, channel)}
        deliveries = table.metadata.tables.get(deliveries_table_name(table.name))
        if deliveries is not None:  # revision 0010: rows with deliveries beside them
            statements["add_routed"] = add(table, channel, deliveries)
        if "uncounted" in table.c:  # the fenced methods' revision
            statements.update(fenced(table, None if history is None else history.attempts))
        self._compiled = {name: driver_sql(self.engine, s) for name, s in statements.items()}
        self._beside = {}
        if deliveries is not None:
            kept = self.history_of(deliveries)
            beside = fenced(deliveries, None if kept is None else kept.attempts)
            self._beside = {name: driver_sql(self.engine, s) for name, s in beside.items()}

    def _statement(self, name: str, table: Table) -> Compiled:
        """The compiled statement `name` for `table`: the update's table's, or the deliveries
        table's (revision 0010)."""
        return (self._beside if beside_deliveries(table) else self._compiled)[name]
        self._claims = ClaimShapes(self._claim_sql)

    def _claim_sql(self, statement: ClauseElement) -> Compiled:
        return driver_sql(self.engine, statement, expanded=True, positional=True)

    async def add_many(
        self,
        rows: Sequence[RecordedRow],
        deliveries: Sequence[DeliveryRow] = (),
        *,
        guard: Update | None = None,
    ) -> Sequence[Any] | None:
        arrays = add_arrays(rows, deliveries)
        # Most batches route every update to its row alone: the statement of one INSERT.
        compiled = self._compiled["add_routed" if deliveries else "add"]
        if guard is None:
            return await self._direct(compiled, arrays)
        async with self.transaction() as connection:
            if (await connection.execute(guard)).first() is None:
                return None
            if not rows:
                return []
            return (await execute(connection, compiled, arrays)).all()

    async def _direct(self, compiled: Compiled, values: dict[str, Any]) -> list[Any]:
        """The statements run most often (the batch insert, the claim), by psycopg itself
        (`direct`), on the kept connection when it is free."""
        async with self._kept.connection() as connection:
            return await direct(connection, compiled, values)

    async def close(self) -> None:
        await self._kept.close()
        await self._settling.close()

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
        compiled = self._claims.get(
            table,
            ordering=ordering,
            bots=bots,
            durable_exhaustion=durable_exhaustion,
            lateral=True,
            destination=destination,
            record=lambda claim: self._recorded(
                claim,
                now=bindparam("now", 0, BigInteger),
                worker=bindparam("worker", "", Text),
                durable=durable_exhaustion,
                history=self.history_of(table),
            ),
        )
        values: dict[str, Any] = dict(numbers)
        if self._history is not None:
            values["worker"] = self._history.worker
        return await self._direct(compiled, values)

    async def transition(
        self, connection: AsyncConnection, statement: Update, follow: Update | None
    ) -> Row[Any] | None:
        if follow is None:
            return (await connection.execute(statement)).first()
        moved = statement.cte("moved")
        guarded = follow.where(exists(select(literal_column("1")).select_from(moved)))
        both = select(moved).add_cte(guarded.cte("followed"))
        return (await connection.execute(both)).first()

    async def claim_recorded(self, statement: Update, now: int, *, durable: bool) -> Sequence[Any]:
        worker = "" if self._history is None else self._history.worker
        recorded = self._recorded(
            statement,
            now=literal(now, BigInteger),
            worker=literal(worker, Text),
            durable=durable,
            history=self.history_of(typed(Table, statement.table)),
        )
        async with self.write() as connection:
            return (await connection.execute(recorded)).all()

    def _recorded(
        self,
        claim: Update,
        *,
        now: ColumnElement[int],
        worker: ColumnElement[str],
        durable: bool,
        history: History | None,
    ) -> Update | Select[Any]:
        """A claim that, in the same statement, enters the attempts it starts in `history`
        and (`durable`) the exhaustions it makes in the outbox: data-modifying CTEs."""
        records = history is not None or (self._outbox is not None and durable)
        if not records:
            return claim
        claimed = claim.cte("claimed")
        statement = select(claimed)
        if history is not None:
            started = started_in(
                history.attempts, claimed, now=now, worker=worker, upsert=self.upsert
            )
            statement = statement.add_cte(started.cte("started"))
        if self._outbox is not None and durable:
            spent = outbox.spent_in_claim(self._outbox, claimed, now=now)
            statement = statement.add_cte(spent.cte("spent"))
        return statement

    async def delete_recorded(
        self, connection: AsyncConnection, statement: ReturningDelete[Any], beside: Sequence[Table]
    ) -> int:
        gone = statement.cte("gone")
        counted = select(func.count()).select_from(gone)
        for index, table in enumerate(beside):
            counted = counted.add_cte(history.forget(table, gone).cte(f"forgotten_{index}"))
        return int((await connection.execute(counted)).scalar_one())

    async def owns(
        self, connection: AsyncConnection, table: Table, identity: ClaimIdentity, at: int
    ) -> Row[Any] | None:
        values = {**dataclasses.asdict(identity), "at": at}
        return (await execute(connection, self._statement("owns", table), values)).first()

    async def owned_leases(
        self,
        connection: AsyncConnection,
        table: Table,
        identities: Sequence[ClaimIdentity],
        at: int,
    ) -> dict[ClaimIdentity, int]:
        rows = [dataclasses.asdict(identity) for identity in identities]
        values = {**arrays(IDENTITY_COLUMNS, rows), "at": at}
        result = await execute(connection, self._statement("owned_leases", table), values)
        return {identity_of(row): int(row.due_at) for row in result.all()}

    async def renewed_leases(
        self,
        connection: AsyncConnection,
        table: Table,
        renewals: Sequence[tuple[ClaimIdentity, int]],
        now: int,
    ) -> dict[ClaimIdentity, int]:
        rows = [
            {**dataclasses.asdict(identity), "lease_until": lease_until}
            for identity, lease_until in renewals
        ]
        values = {**arrays(RENEW_COLUMNS, rows), "now": now}
        result = await execute(connection, self._statement("renewed_leases", table), values)
        return {identity_of(row): int(row.due_at) for row in result.all()}

    async def settle_many_owned(
        self, table: Table, items: Sequence[tuple[ClaimIdentity, Settlement]]
    ) -> dict[tuple[str, int], bool | None]:
        arrays = settle_many_parameters(items)
        async with self._settling.connection() as connection:
            rows = await direct(connection, self._statement("settle_many_owned", table), arrays)
            settled: dict[tuple[str, int], bool | None] = {
                (row.bot, row.update_id): bool(row.waiting) for row in rows
            }
            unsettled = [i for i in items if (i[0].bot, i[0].update_id) not in settled]
            if unsettled:  # refused, or skipped because locked: tell them apart
                arrays = settle_many_parameters(unsettled)
                busy = await direct(connection, self._statement("busy_owned", table), arrays)
                settled.update({(row.bot, row.update_id): None for row in busy})
        return settled

    async def exclusive(self, connection: AsyncConnection, table: Table, purpose: str) -> bool:
        # A transaction-level advisory lock, released at commit (so it holds behind a
        # transaction-pooling PgBouncer too), keyed by the purpose and the table's oid: the
        # same table name in another schema is another table.
        oid = cast(cast(func.to_regclass(table.name), OID), Integer)
        lock = select(func.pg_try_advisory_xact_lock(func.hashtext(purpose), oid))
        return bool((await connection.execute(lock)).scalar_one())

    async def statistics_age(self, connection: AsyncConnection, table: Table) -> StatisticsAge:
        stats, classes = STAT_USER_TABLES.c, PG_CLASS.c
        last = func.greatest(stats.last_analyze, stats.last_autoanalyze)  # NULLs ignored
        counters = (
            select(
                stats.n_mod_since_analyze,
                func.extract("epoch", func.clock_timestamp() - last).label("age"),
                classes.reltuples,
                stats.n_live_tup,
            )
            .join_from(STAT_USER_TABLES, PG_CLASS, classes.oid == stats.relid)
            .where(stats.relid == cast(func.to_regclass(table.name), OID))
        )
        row = (await connection.execute(counters)).first()
        if row is None:
            return StatisticsAge(0, None, 0.0, 0)
        return StatisticsAge(
            changes=int(row.n_mod_since_analyze),
            seconds=None if row.age is None else float(row.age),
            rows=max(float(row.reltuples), 0.0),
            live=int(row.n_live_tup),
        )

    async def analyze(self, connection: AsyncConnection, table: Table) -> None:
        # Sampled (300 rows per statistics target unit): its time is bounded whatever the size.
        name = connection.dialect.identifier_preparer.quote(table.name)
        await connection.exec_driver_sql(f"ANALYZE {name}")

    async def dead_rows(
        self, connection: AsyncConnection, table: Table
    ) -> tuple[int, int, float | None]:
        stats = STAT_USER_TABLES.c
        last = func.greatest(stats.last_vacuum, stats.last_autovacuum)  # NULLs ignored
        counters = select(
            stats.n_dead_tup,
            stats.n_live_tup,
            func.extract("epoch", func.clock_timestamp() - last).label("age"),
        ).where(stats.relid == cast(func.to_regclass(table.name), OID))
        row = (await connection.execute(counters)).first()
        if row is None:
            return 0, 0, None
        age = None if row.age is None else float(row.age)
        return int(row.n_dead_tup), int(row.n_live_tup), age

    async def vacuum(self, connection: AsyncConnection, table: Table) -> None:
        # The engine autocommits: VACUUM runs outside a transaction, as it must. SKIP_LOCKED:
        # a vacuum of the table already at work (another worker's, autovacuum's) holds its
        # lock, and this one returns at once instead of queueing behind it.
        name = connection.dialect.identifier_preparer.quote(table.name)
        await connection.exec_driver_sql(f"VACUUM (SKIP_LOCKED) {name}")

    async def database_time(self) -> int:
        async with self.read() as connection:
            return int((await connection.execute(database_time())).scalar_one())

    async def announce(self) -> None:
        async with self.write() as connection:
            await connection.execute(announce(self._channel))

    async def probe_write(self) -> None:
        """A sort spilled to a file in the data directory (`postgres_statements.PROBE`)."""
        async with self.transaction() as connection:
            for statement in PROBE:
                await connection.execute(text(statement))

    async def listen(
        self,
        wake: Callable[[], None],
        *,
        listening: asyncio.Event | None = None,
        max_pause: float = 5.0,
    ) -> None:
        await listen_forever(
            self.engine, self._channel, wake, listening=listening, max_pause=max_pause
        )
