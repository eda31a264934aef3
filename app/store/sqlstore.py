"""The store over SQLAlchemy Core, written once for SQLite and PostgreSQL.

Statements come from `app.store.queries`; this module checks arguments, runs each statement in
the right kind of transaction and maps rows to the types of `app.store.types`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from typing import Any

from sqlalchemy import BigInteger, Integer, Table, bindparam, inspect
from sqlalchemy.engine import Connection, CursorResult
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.pool import StaticPool
from sqlalchemy.sql.elements import ClauseElement
from sqlalchemy.sql.expression import Executable

from app.store import queries, validate, wakeups
from app.store.engine import SQLITE_BEGIN, create_store_engine, translated_errors
from app.store.errors import UPGRADE_HINT, SchemaError
from app.store.schema import DEFAULT_TABLE, make_table
from app.store.types import (
    Abandoned,
    BotStats,
    Capability,
    Claimed,
    ClaimIdentity,
    Completed,
    DueUpdate,
    Exhaustion,
    Failed,
    NewUpdate,
    Ordering,
    Settlement,
    StoredUpdate,
)

_LEVELS: dict[Capability, int] = {"base": 0, "fenced": 1, "durable": 2}
_UNDELIVERED = ("pending", "processing", "failed")
_BASE_COLUMNS = frozenset(make_table(revision="0001").c.keys())


def _capability_of(columns: set[str]) -> Capability:
    if {"claim_id", "exhausted_at", "acknowledged_at"} <= columns:
        return "durable"
    return "fenced" if "claim_id" in columns else "base"


def _inspect_columns(connection: Connection, table: str) -> set[str]:
    inspector = inspect(connection)
    if not inspector.has_table(table):
        raise SchemaError(f"table {table!r} does not exist; {UPGRADE_HINT}")
    columns = {column["name"] for column in inspector.get_columns(table)}
    missing = _BASE_COLUMNS - columns
    if missing:
        raise SchemaError(f"table {table!r} lacks {sorted(missing)}; {UPGRADE_HINT}")
    return columns


def _settlement(value: Settlement) -> Settlement:
    if not isinstance(value, Completed | Failed | Abandoned):
        raise ValueError(f"settlement {value!r} is not Completed, Failed or Abandoned")
    return value


def _identity(value: ClaimIdentity) -> ClaimIdentity:
    if not isinstance(value, ClaimIdentity):
        raise ValueError(f"identity {value!r} is not a ClaimIdentity")
    return value


def _lease(now: int, lease_until: int) -> tuple[int, int]:
    validate.millis("now", now)
    validate.millis("lease_until", lease_until)
    if lease_until <= now:
        raise ValueError(f"lease_until {lease_until} is not after now {now}: a lease is positive")
    return now, lease_until


def _bots(bots: Sequence[str] | None) -> list[str] | None:
    if bots is None:
        return None
    if isinstance(bots, str):
        raise ValueError(f"bots {bots!r} must be a sequence of bot names, not one string")
    return [validate.bot_name(bot) for bot in bots]


class SqlUpdateStore:
    """A durable store on SQLite or PostgreSQL; `capability` follows the live schema."""

    def __init__(self, engine: AsyncEngine, table: str, capability: Capability) -> None:
        """`engine` as `create_store_engine` makes it (on PostgreSQL: AUTOCOMMIT)."""
        self.engine = engine
        self.table: Table = make_table(table, revision="0002" if capability != "base" else "0001")
        self._capability: Capability = capability
        self._dialect = engine.dialect.name
        self._sqlite = self._dialect == "sqlite"
        self._write_lock: AbstractAsyncContextManager[Any]
        self._read_lock: AbstractAsyncContextManager[Any]
        if self._sqlite:
            # One writer at a time; queueing ours here beats spinning in busy_timeout.
            self._write_lock = asyncio.Lock()
            # An in-memory database is one shared connection: a read must not overlap a write.
            shared = isinstance(engine.pool, StaticPool)
            self._read_lock = self._write_lock if shared else nullcontext()
        else:
            # Callers queue for the pool's connections in arrival order. The pool's own queue
            # lets a newcomer take a connection that was handed to a waiter, and under load
            # some requests then wait seconds while most wait milliseconds.
            self._write_lock = self._read_lock = asyncio.Semaphore(engine.pool.size())  # type: ignore[attr-defined]
        if self._sqlite:
            self._single = engine
            self._reader = engine.execution_options(**{SQLITE_BEGIN: "DEFERRED"})
        else:
            # The engine autocommits: one statement is its own transaction, with no BEGIN and
            # COMMIT round trips. `engine` (public, and `transaction`) is a view of it that
            # opens real transactions.
            self._single = self._reader = engine
            self.engine = engine.execution_options(isolation_level="READ COMMITTED")
        self._compile_batches()

    def _compile_batches(self) -> None:
        """PostgreSQL: the statements run most often (the two batches, owns), compiled once."""
        self._batches: dict[str, tuple[str, dict[str, Any]]] = {}
        self._claims: dict[tuple[Any, ...], tuple[str, dict[str, Any]]] = {}
        if self._sqlite:
            return
        statements: dict[str, ClauseElement] = {
            "add": queries.add(self.table, self._dialect, channel=self.wake_channel)
        }
        if "claim_id" in self.table.c:
            statements["settle_many_owned"] = queries.settle_many_owned(self.table)
            statements["owns"] = queries.owns(
                self.table, identity=None, at=bindparam("at", type_=BigInteger), lock=False
            )
        for name, statement in statements.items():
            self._batches[name] = self._driver_sql(statement)

    def _compiled_claim(
        self, ordering: Ordering, bots: list[str] | None, durable: bool
    ) -> tuple[str, dict[str, Any]]:
        """PostgreSQL: `claim_next_owned` compiled once per shape (a dispatcher claims for the
        same bots over and over); building and compiling it each time cost a fifth of a
        claim's time in the worker."""
        key = (ordering, None if bots is None else tuple(bots), durable)
        compiled = self._claims.get(key)
        if compiled is None:
            if len(self._claims) >= 64:  # shapes are few; callers listing ever new bots are not
                self._claims.clear()
            statement = queries.claim_next_owned(
                self.table,
                now=bindparam("now", 0, BigInteger),
                lease_until=bindparam("lease_until", 0, BigInteger),
                max_attempts=bindparam("max_attempts", 0, Integer),
                limit=bindparam("limit", 0, Integer),
                ordering=ordering,
                bots=bots,
                durable_exhaustion=durable,
            )
            compiled = self._claims[key] = self._driver_sql(statement, expanded=True)
        return compiled

    def _driver_sql(
        self, statement: ClauseElement, *, expanded: bool = False
    ) -> tuple[str, dict[str, Any]]:
        """PostgreSQL: a statement as psycopg's SQL text and its constant parameters, to run
        many times with `_execute`. `expanded` renders IN-lists into the text. Batch arrays
        travel in binary (psycopg's `%b`): dumping a text array escapes every quote of every
        JSON body, about 17 us a body, against well under one in binary."""
        options = {"render_postcompile": True} if expanded else {}
        compiled = statement.compile(dialect=self.engine.dialect, compile_kwargs=options)
        sql = re.sub(r"%\((batch_\w+)\)s", r"%(\1)b", compiled.string)
        return sql, dict(compiled.params)

    @staticmethod
    async def _execute(
        connection: AsyncConnection, compiled: tuple[str, dict[str, Any]], values: dict[str, Any]
    ) -> CursorResult[Any]:
        sql, constants = compiled
        return await connection.exec_driver_sql(sql, {**constants, **values})

    @property
    def capability(self) -> Capability:
        return self._capability

    @property
    def dialect(self) -> str:
        return self._dialect

    async def close(self) -> None:
        await self.engine.dispose()

    async def refresh_capability(self) -> Capability:
        """Read the live schema again (after `alembic upgrade head` on a running service)."""
        self._capability = await read_capability(self.engine, self.table.name)
        self.table = make_table(self.table.name, "0002" if self._capability != "base" else "0001")
        self._compile_batches()
        return self._capability

    def require(self, level: Capability, feature: str) -> None:
        """Stop with SchemaError when the live schema is below `level`."""
        if _LEVELS[self._capability] < _LEVELS[level]:
            raise SchemaError(
                f"{feature} needs a {level} store but table {self.table.name!r} is at "
                f"revision 0001 ({self._capability}); {UPGRADE_HINT}"
            )

    @property
    def wake_channel(self) -> str:
        """The PostgreSQL channel notified by every commit that adds updates."""
        return f"{self.table.name}_added"

    async def ping(self) -> None:
        async with self._read() as connection:
            await connection.execute(queries.ping())

    async def database_time(self) -> int:
        """The database's clock, epoch ms. SQLite's file is on this host: its clock is ours."""
        if self._sqlite:
            return time.time_ns() // 1_000_000
        async with self._read() as connection:
            return int((await connection.execute(queries.database_time())).scalar_one())

    async def listen(
        self, wake: Callable[[], None], *, listening: asyncio.Event | None = None
    ) -> None:
        """Call `wake` on every commit of another process that adds updates (PostgreSQL
        LISTEN, `app.store.wakeups`), until cancelled; returns at once on SQLite."""
        await wakeups.listen(self, wake, listening=listening)

    async def announce(self) -> None:
        """Wake the workers of other processes now (the NOTIFY that `add_many` sends on its
        own); a no-op on SQLite, which has no listeners."""
        if not self._sqlite:
            async with self._write() as connection:
                await connection.execute(queries.announce(self.wake_channel))

    # -- transactions --------------------------------------------------------------------------

    @asynccontextmanager
    async def _write(self) -> AsyncIterator[AsyncConnection]:
        """One write. On SQLite a transaction (BEGIN IMMEDIATE); on PostgreSQL the connection
        autocommits, so each statement is its own transaction: a method that needs several
        statements to commit together must use `transaction()` instead."""
        with translated_errors(self.table.name):
            async with self._write_lock, self._single.begin() as connection:
                yield connection

    async def _changed(self, statement: Executable) -> bool:
        """Run one transition in its own write transaction; whether it matched a row."""
        async with self._write() as connection:
            return (await connection.execute(statement)).first() is not None

    @asynccontextmanager
    async def _read(self) -> AsyncIterator[AsyncConnection]:
        with translated_errors(self.table.name):
            async with self._read_lock, self._reader.connect() as connection:
                yield connection

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection]:
        """A write transaction for the caller's own statements in this database, committed on
        exit. Pass it to `owns(..., connection=)` to make the check and a domain write atomic;
        on SQLite it holds the write lock from its start. Call no other store method inside
        it: they would wait for this very transaction. Database errors raised inside it,
        the caller's own included, arrive as store errors."""
        with translated_errors(self.table.name):
            async with self._write_lock, self.engine.begin() as connection:
                yield connection

    # -- base ----------------------------------------------------------------------------------

    async def add(
        self,
        bot: str,
        update_id: int,
        body: str,
        received_at: int,
        *,
        update_type: str | None = None,
        queue_key: str | None = None,
    ) -> bool:
        row = NewUpdate(bot, update_id, body, received_at, update_type, queue_key)
        return bool(await self.add_many([row]))

    async def add_many(self, rows: Sequence[NewUpdate]) -> set[tuple[str, int]]:
        """Record many updates in one statement and one commit; the keys that were new."""
        for row in rows:
            if not isinstance(row, NewUpdate):
                raise ValueError(f"row {row!r} is not a NewUpdate")
        if not rows:
            return set()
        async with self._write() as connection:
            if self._sqlite:
                statement = queries.add(self.table, self._dialect)
                result = await connection.execute(statement, queries.add_rows(rows))
            else:
                result = await self._execute(
                    connection, self._batches["add"], queries.add_arrays(rows)
                )
            return {(row.bot, row.update_id) for row in result.all()}

    async def claim(
        self,
        bot: str,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> int | None:
        if validate.flag("durable_exhaustion", durable_exhaustion):
            self.require("durable", "claim(durable_exhaustion=True)")
        now, lease_until = _lease(now, lease_until)
        statement = queries.claim(
            self.table,
            bot=validate.bot_name(bot),
            update_id=validate.update_id(update_id),
            now=now,
            lease_until=lease_until,
            max_attempts=validate.attempts("max_attempts", max_attempts),
            durable_exhaustion=durable_exhaustion,
        )
        async with self._write() as connection:
            row = (await connection.execute(statement)).first()
        return int(row.attempts) if row is not None and row.state == "processing" else None

    async def renew(
        self, bot: str, update_id: int, attempt: int, lease_until: int, now: int | None = None
    ) -> bool:
        statement = queries.renew(
            self.table,
            bot=validate.bot_name(bot),
            update_id=validate.update_id(update_id),
            attempt=validate.attempts("attempt", attempt),
            lease_until=validate.millis("lease_until", lease_until),
            now=None if now is None else validate.millis("now", now),
        )
        return await self._changed(statement)

    async def settle(self, bot: str, update_id: int, attempt: int, settlement: Settlement) -> None:
        statement = queries.settle(
            self.table,
            bot=validate.bot_name(bot),
            update_id=validate.update_id(update_id),
            attempt=validate.attempts("attempt", attempt),
            settlement=_settlement(settlement),
        )
        await self._changed(statement)

    async def due(
        self,
        *,
        now: int,
        pending_before: int,
        limit: int,
        bots: Sequence[str] | None = None,
    ) -> list[DueUpdate]:
        names = _bots(bots)
        if names == []:
            return []
        statement = queries.due(
            self.table,
            now=validate.millis("now", now),
            pending_before=validate.millis("pending_before", pending_before),
            limit=validate.positive("limit", limit),
            bots=names,
        )
        async with self._read() as connection:
            rows = (await connection.execute(statement)).all()
        return [
            DueUpdate(row.bot, row.update_id, row.body, row.update_type, row.received_at)
            for row in rows
        ]

    async def prune(self, before: int) -> int:
        statement = queries.prune(self.table, before=validate.millis("before", before))
        async with self._write() as connection:
            return (await connection.execute(statement)).rowcount

    # -- operators' views (beyond SPEC section 4; base level) --------------------------------

    async def get_update(self, bot: str, update_id: int) -> StoredUpdate | None:
        """The row of `(bot, update_id)` as it stands, or None."""
        statement = queries.get_update(
            self.table, bot=validate.bot_name(bot), update_id=validate.update_id(update_id)
        )
        async with self._read() as connection:
            row = (await connection.execute(statement)).first()
        if row is None:
            return None
        fields = row._mapping
        return StoredUpdate(
            **{name: fields.get(name) for name in StoredUpdate.__dataclass_fields__}
        )

    async def stats(self) -> list[BotStats]:
        """Rows by bot and state, in bot order (one scan of the table: an operator's call)."""
        async with self._read() as connection:
            rows = (await connection.execute(queries.stats(self.table))).all()
        durable = "exhausted_at" in self.table.c
        result: list[BotStats] = []
        for bot, group in itertools.groupby(rows, key=lambda row: row.bot):
            states = list(group)
            undelivered = [row.oldest for row in states if row.state in _UNDELIVERED]
            result.append(
                BotStats(
                    bot=bot,
                    states={row.state: int(row.rows) for row in states},
                    oldest_undelivered_at=min(undelivered, default=None),
                    unacknowledged_exhaustions=(
                        sum(int(row.unacknowledged or 0) for row in states) if durable else None
                    ),
                )
            )
        return result

    # -- fenced --------------------------------------------------------------------------------

    async def claim_owned(
        self,
        bot: str,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> ClaimIdentity | None:
        durable = validate.flag("durable_exhaustion", durable_exhaustion)
        self.require("durable" if durable else "fenced", "claim_owned")
        now, lease_until = _lease(now, lease_until)
        statement = queries.claim_owned(
            self.table,
            bot=validate.bot_name(bot),
            update_id=validate.update_id(update_id),
            now=now,
            lease_until=lease_until,
            max_attempts=validate.attempts("max_attempts", max_attempts),
            durable_exhaustion=durable_exhaustion,
        )
        async with self._write() as connection:
            row = (await connection.execute(statement)).first()
        if row is None or row.state != "processing":
            return None
        return ClaimIdentity(bot, update_id, row.attempts, row.claim_id)

    async def claim_next_owned(
        self,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        limit: int,
        ordering: Ordering = "chat",
        bots: Sequence[str] | None = None,
        durable_exhaustion: bool = False,
    ) -> list[Claimed]:
        durable = validate.flag("durable_exhaustion", durable_exhaustion)
        self.require("durable" if durable else "fenced", "claim_next_owned")
        now, lease_until = _lease(now, lease_until)
        if ordering not in ("chat", "none"):
            raise ValueError(f"ordering {ordering!r} is not 'chat' or 'none'")
        names = _bots(bots)
        if names == []:
            return []
        numbers = {
            "now": now,
            "lease_until": lease_until,
            "max_attempts": validate.attempts("max_attempts", max_attempts),
            "limit": validate.positive("limit", limit),
        }
        async with self._write() as connection:
            if self._sqlite:
                statement = queries.claim_next_owned(
                    self.table,
                    **numbers,
                    ordering=ordering,
                    bots=names,
                    durable_exhaustion=durable_exhaustion,
                )
                rows = (await connection.execute(statement)).all()
            else:
                compiled = self._compiled_claim(ordering, names, durable_exhaustion)
                rows = (await self._execute(connection, compiled, numbers)).all()
        claimed = [
            Claimed(
                identity=ClaimIdentity(row.bot, row.update_id, row.attempts, row.claim_id),
                body=row.body,
                update_type=row.update_type,
                queue_key=row.queue_key,
                received_at=row.received_at,
            )
            for row in rows
            if row.state == "processing"
        ]
        claimed.sort(key=lambda c: (c.identity.bot, c.identity.update_id))
        return claimed

    async def renew_owned(
        self, identity: ClaimIdentity, lease_until: int, now: int | None = None
    ) -> bool:
        return await self.renewed_lease(identity, lease_until, now) is not None

    async def renewed_lease(
        self, identity: ClaimIdentity, lease_until: int, now: int | None = None
    ) -> int | None:
        """`renew_owned`, answering with the lease's expiry after it (epoch ms; a renewal
        never shortens) instead of True."""
        self.require("fenced", "renew_owned")
        statement = queries.renew_owned(
            self.table,
            identity=_identity(identity),
            lease_until=validate.millis("lease_until", lease_until),
            now=None if now is None else validate.millis("now", now),
        )
        async with self._write() as connection:
            row = (await connection.execute(statement)).first()
        return None if row is None else int(row.due_at)

    async def owns(
        self, identity: ClaimIdentity, at: int, *, connection: AsyncConnection | None = None
    ) -> bool:
        return await self.owned_lease(identity, at, connection=connection) is not None

    async def owned_lease(
        self, identity: ClaimIdentity, at: int, *, connection: AsyncConnection | None = None
    ) -> int | None:
        """`owns`, answering with the lease's expiry (epoch ms) instead of True."""
        self.require("fenced", "owns")
        identity, at = _identity(identity), validate.millis("at", at)
        if connection is not None:
            # Inside the caller's transaction: hold the row until it commits.
            statement = queries.owns(self.table, identity=identity, at=at, lock=True)
            with translated_errors(self.table.name):
                row = (await connection.execute(statement)).first()
        else:
            # A bare answer: locking would release at once, and only wait behind other holders.
            async with self._read() as own:
                if self._sqlite:
                    statement = queries.owns(self.table, identity=identity, at=at, lock=False)
                    row = (await own.execute(statement)).first()
                else:
                    values = {**dataclasses.asdict(identity), "at": at}
                    row = (await self._execute(own, self._batches["owns"], values)).first()
        return None if row is None else int(row.due_at)

    async def settle_owned(self, identity: ClaimIdentity, settlement: Settlement) -> bool:
        self.require("fenced", "settle_owned")
        statement = queries.settle_owned(
            self.table, identity=_identity(identity), settlement=_settlement(settlement)
        )
        return await self._changed(statement)

    async def settle_many_owned(
        self,
        items: Sequence[tuple[ClaimIdentity, Settlement]],
        *,
        waiting: set[tuple[str, int]] | None = None,
    ) -> list[bool]:
        """`settle_owned` for a batch, in one transaction (one statement on PostgreSQL); for
        each item, whether it took effect. A key may appear once per batch. `waiting`, when
        given, receives the settled keys whose chat still has a later update to deliver (on
        SQLite: every settled key, which costs no query and misses none)."""
        self.require("fenced", "settle_many_owned")
        checked = [(_identity(identity), _settlement(settlement)) for identity, settlement in items]
        keys = [(identity.bot, identity.update_id) for identity, _ in checked]
        if len(set(keys)) != len(keys):
            raise ValueError(f"keys {sorted(k for k in keys if keys.count(k) > 1)} repeat")
        if not checked:
            return []
        settled: set[tuple[str, int]] = set()
        async with self._write() as connection:
            if self._sqlite:
                # Local statements in one transaction: the cost is its single commit.
                for identity, settlement in checked:
                    statement = queries.settle_owned(
                        self.table, identity=identity, settlement=settlement
                    )
                    row = (await connection.execute(statement)).first()
                    if row is not None:
                        settled.add((identity.bot, identity.update_id))
                        if waiting is not None:
                            waiting.add((identity.bot, identity.update_id))
            else:
                arrays = queries.settle_many_parameters(checked)
                result = await self._execute(connection, self._batches["settle_many_owned"], arrays)
                for row in result.all():
                    settled.add((row.bot, row.update_id))
                    if waiting is not None and row.waiting:
                        waiting.add((row.bot, row.update_id))
        return [key in settled for key in keys]

    # -- durable -------------------------------------------------------------------------------

    async def exhaust(self, identity: ClaimIdentity, at: int, error: str) -> bool:
        self.require("durable", "exhaust")
        statement = queries.exhaust(
            self.table,
            identity=_identity(identity),
            at=validate.millis("at", at),
            error=validate.text("error", error),
        )
        return await self._changed(statement)

    async def due_exhaustions(
        self,
        *,
        limit: int,
        after: tuple[str, int] | None = None,
        bots: Sequence[str] | None = None,
    ) -> list[Exhaustion]:
        self.require("durable", "due_exhaustions")
        if after is not None:
            if not isinstance(after, tuple) or len(after) != 2:
                raise ValueError(f"after {after!r} is not a (bot, update_id) cursor")
            after = (validate.bot_name(after[0]), validate.update_id(after[1]))
        names = _bots(bots)
        if names == []:
            return []
        statement = queries.due_exhaustions(
            self.table, limit=validate.positive("limit", limit), after=after, bots=names
        )
        async with self._read() as connection:
            rows = (await connection.execute(statement)).all()
        return [
            Exhaustion(
                identity=ClaimIdentity(row.bot, row.update_id, row.attempts, row.claim_id),
                body=row.body,
                error=row.error,
                exhausted_at=row.exhausted_at,
            )
            for row in rows
        ]

    async def acknowledge_exhaustion(self, identity: ClaimIdentity, at: int) -> bool:
        self.require("durable", "acknowledge_exhaustion")
        statement = queries.acknowledge_exhaustion(
            self.table, identity=_identity(identity), at=validate.millis("at", at)
        )
        return await self._changed(statement)


async def read_capability(engine: AsyncEngine, table: str) -> Capability:
    """The highest level the live table serves; SchemaError when it is missing or incomplete."""
    with translated_errors(table):
        async with engine.connect() as connection:
            columns = await connection.run_sync(_inspect_columns, table)
    return _capability_of(columns)


async def open_store(
    url: str, *, table: str = DEFAULT_TABLE, pool_size: int = 10
) -> SqlUpdateStore:
    """Open a store on a migrated database; `capability` is read from the live schema."""
    validate.table_name(table)
    engine = create_store_engine(url, pool_size=pool_size)
    try:
        capability = await read_capability(engine, table)
    except BaseException:
        await engine.dispose()
        raise
    return SqlUpdateStore(engine, table, capability)
