"""How PostgreSQL's hot statements run: compiled once to psycopg's SQL, then executed through
SQLAlchemy's connection (`execute`) or, for the three run most often (the intake's batch
insert, the workers' claim and batch settle), by psycopg itself (`direct`), on a connection of
the pool kept out between uses (`Kept`)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg.rows import namedtuple_row
from sqlalchemy.engine import CursorResult
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.elements import ClauseElement

__all__ = ["Compiled", "Kept", "direct", "driver_sql", "execute"]

Compiled = tuple[str, dict[str, Any]]  # psycopg's SQL text and its constant parameters
READ_ONLY_TRANSACTION = "25006"  # SQLSTATE read_only_sql_transaction


def driver_sql(
    engine: AsyncEngine, statement: ClauseElement, *, expanded: bool = False
) -> Compiled:
    """A statement as psycopg's SQL text and its constant parameters, to run many times
    with `execute` or `direct`. `expanded` renders IN-lists into the text. Batch arrays travel
    in binary (psycopg's `%b`): dumping a text array escapes every quote of every JSON body,
    about 17 us a body, against well under one in binary."""
    options = {"render_postcompile": True} if expanded else {}
    compiled = statement.compile(dialect=engine.dialect, compile_kwargs=options)
    text = re.sub(r"%\((batch_\w+)\)s", r"%(\1)b", compiled.string)
    return text, dict(compiled.params)


async def execute(
    connection: AsyncConnection, compiled: Compiled, values: dict[str, Any]
) -> CursorResult[Any]:
    text, constants = compiled
    return await connection.exec_driver_sql(text, {**constants, **values})


async def direct(
    connection: AsyncConnection, compiled: Compiled, values: dict[str, Any]
) -> list[Any]:
    """One autocommitted statement run by psycopg itself on `connection`, its rows as named
    tuples (`row.bot`, as SQLAlchemy's rows read). For the intake's group commit SQLAlchemy's
    execution around the driver's (its context, its result, a greenlet each way) cost half of
    the batch's own time in the process, and an eighth of a worker's. What SQLAlchemy would do
    on failure is done here: the driver's error wrapped as SQLAlchemy wraps it (so
    `translated_errors` reads it alike), and after a broken connection the pool's older ones
    replaced, not returned to callers."""
    text, constants = compiled
    raw = await connection.get_raw_connection()
    driver: psycopg.AsyncConnection[Any] = raw.driver_connection  # type: ignore[assignment]
    try:
        # The engine autocommits, but a connection does not always come out of the pool
        # autocommitting at the driver (seen on a new one, and after a READ COMMITTED
        # transaction's reset); SQLAlchemy's own execution would then wrap the statement in
        # BEGIN and COMMIT. Here it is set, as the engine means it: one statement, one round
        # trip, committed when it ends.
        if not driver.autocommit:
            await driver.set_autocommit(True)
        async with driver.cursor(row_factory=namedtuple_row) as cursor:
            await cursor.execute(text, {**constants, **values})
            return await cursor.fetchall()
    except psycopg.Error as error:
        # A server that answers "read-only" is a standby now (a failover demoted it): its
        # connection is of no more use than a dropped one.
        read_only = error.sqlstate == READ_ONLY_TRANSACTION
        broken = driver.closed or read_only or isinstance(error, psycopg.OperationalError)
        if broken:
            # As SQLAlchemy treats a disconnect: each connection the pool made before now is
            # replaced at its next checkout (the server may have dropped them all), and this
            # one is discarded at once.
            connection.sync_engine.pool._invalidate(raw, error, _checkin=False)
            await connection.invalidate(error)
        raise DBAPIError.instance(
            text, None, error, psycopg.Error, connection_invalidated=broken
        ) from error


class Kept:
    """One connection of the pool kept checked out between uses, for the statements a process
    runs most often, each one at a time (the group commit's insert, a worker's claim and
    settle): checking a connection out and back in cost a third of an insert's time in the
    process. A caller that finds it in use
    takes a connection from the pool as any statement does. It holds one of `permits` (the
    pool's connections) while it lives, and lets its connection go when it breaks (the next
    use keeps a fresh one) and at close. A pool of one connection keeps none."""

    def __init__(self, engine: AsyncEngine, permits: asyncio.Semaphore) -> None:
        self._engine = engine
        self._permits = permits
        self._enabled = engine.pool.size() > 1  # type: ignore[attr-defined]
        self._lock = asyncio.Lock()
        self._connection: AsyncConnection | None = None

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection]:
        if not self._enabled or self._lock.locked():
            async with self._permits, self._engine.connect() as connection:
                yield connection
            return
        async with self._lock:
            if self._connection is None:
                await self._permits.acquire()
                try:
                    self._connection = await self._engine.connect()
                except BaseException:
                    self._permits.release()
                    raise
            try:
                yield self._connection
            except DBAPIError as error:
                if error.connection_invalidated:
                    await self._let_go()
                raise

    async def close(self) -> None:
        async with self._lock:
            await self._let_go()

    async def _let_go(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            try:
                await connection.close()
            finally:
                self._permits.release()
