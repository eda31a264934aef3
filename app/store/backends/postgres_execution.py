"""How PostgreSQL's hot statements run: compiled once to psycopg's SQL, then executed through
SQLAlchemy's connection (`execute`) or, for the three run most often (the intake's batch
insert, the workers' claim and batch settle), by psycopg itself (`direct`), on a connection of
the pool kept out between uses (`Kept`)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import namedtuple_row
from sqlalchemy.engine import CursorResult
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.elements import ClauseElement

from app.store.backends.postgres_engine import PGBOUNCER, answered_read_only

__all__ = ["Compiled", "Kept", "direct", "driver_sql", "execute"]

PLAN_ONCE = "SET plan_cache_mode = force_generic_plan"  # while a connection is kept
PLAN_AS_USUAL = "RESET plan_cache_mode"  # before it goes back to the pool
# A named placeholder, or the escaped percent sign of psycopg's SQL.
_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")


@dataclass(frozen=True, slots=True)
class Compiled:
    """A statement as psycopg's SQL text and its constant parameters. In its positional form
    (`names` set) the text carries PostgreSQL's own `$n` placeholders, bound from `names` in
    order, and runs on psycopg's raw cursor (`direct` only)."""

    text: str
    constants: dict[str, Any] = field(default_factory=dict)
    names: tuple[str, ...] | None = None

    def parameters(self, values: dict[str, Any]) -> dict[str, Any] | list[Any]:
        merged = {**self.constants, **values}
        if self.names is None:
            return merged
        return [merged[name] for name in self.names]


def driver_sql(
    engine: AsyncEngine,
    statement: ClauseElement,
    *,
    expanded: bool = False,
    positional: bool = False,
) -> Compiled:
    """A statement as psycopg's SQL, to run many times with `execute` or `direct`. `expanded`
    renders IN-lists into the text. Batch arrays travel in binary (psycopg's `%b`): dumping a
    text array escapes every quote of every JSON body, about 17 us a body, against well under
    one in binary.

    `positional` converts the text to `$n` once, here, for `direct` alone. psycopg converts
    named placeholders at every execution and caches the conversion only for statements of up
    to 4 KB; the chat-ordered claim is longer, and converting it again at each run was a
    seventh of a worker's CPU. A statement with batch arrays keeps the named form: the raw
    cursor has no way to ask for binary (`%b`)."""
    options = {"render_postcompile": True} if expanded else {}
    compiled = statement.compile(dialect=engine.dialect, compile_kwargs=options)
    text = re.sub(r"%\((batch_\w+)\)s", r"%(\1)b", compiled.string)
    constants = dict(compiled.params)
    if not positional or text != compiled.string:
        return Compiled(text, constants)
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "%"
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    return Compiled(_PLACEHOLDER.sub(number, text), constants, tuple(names))


async def execute(
    connection: AsyncConnection, compiled: Compiled, values: dict[str, Any]
) -> CursorResult[Any]:
    if compiled.names is not None:
        raise ValueError("a statement in positional form runs only by `direct`")
    return await connection.exec_driver_sql(compiled.text, {**compiled.constants, **values})


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
        kind = psycopg.AsyncCursor if compiled.names is None else psycopg.AsyncRawCursor
        async with kind(driver, row_factory=namedtuple_row) as cursor:
            await cursor.execute(compiled.text, compiled.parameters(values))
            return await cursor.fetchall()
    except psycopg.Error as error:
        # A server that answers "read-only" is a standby now (a failover demoted it): its
        # connection is of no more use than a dropped one.
        demoted = answered_read_only(error)
        broken = driver.closed or demoted or isinstance(error, psycopg.OperationalError)
        if broken:
            # As SQLAlchemy treats a disconnect: each connection the pool made before now is
            # replaced at its next checkout (the server may have dropped them all), and this
            # one is discarded at once.
            connection.sync_engine.pool._invalidate(raw, error, _checkin=False)
            await connection.invalidate(error)
        raise DBAPIError.instance(
            compiled.text, None, error, psycopg.Error, connection_invalidated=broken
        ) from error


class Kept:
    """One connection of the pool kept checked out between uses, for the statements a process
    runs most often, each one at a time (the group commit's insert, a worker's claim and
    settle): checking a connection out and back in cost a third of an insert's time in the
    process. A caller that finds it in use takes a connection from the pool as any statement
    does. It holds one of `permits` (the pool's connections) while it lives, and lets its
    connection go when it breaks (the next use keeps a fresh one) and at close. A pool of
    fewer than `fewest` connections keeps none.

    While kept, the connection plans each prepared statement once
    (`plan_cache_mode = force_generic_plan`), and is reset before it goes back to the pool.
    PostgreSQL's own choice kept planning the kept statements anew at almost every run: the
    chat-ordered claim's bind, where it plans, took 0.49 ms of the server's time against
    0.03 ms with the generic plan, longer than the claim's own run (docs/store.md, "Planned
    once"). The generic plans walk the same indexes as the custom ones
    (tests/store/test_query_plans.py). Not behind PgBouncer, where nothing is prepared and a
    SET would outlive its transaction on a shared server session."""

    def __init__(
        self,
        engine: AsyncEngine,
        permits: asyncio.Semaphore,
        *,
        fewest: int = 2,
    ) -> None:
        self._engine = engine
        self._permits = permits
        self._enabled = engine.pool.size() >= fewest  # type: ignore[attr-defined]
        self._generic = not engine.get_execution_options().get(PGBOUNCER)
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
                await self._keep()
            assert self._connection is not None
            try:
                yield self._connection
            except DBAPIError as error:
                if error.connection_invalidated:
                    await self._let_go()
                raise

    async def close(self) -> None:
        async with self._lock:
            await self._let_go()

    async def _keep(self) -> None:
        await self._permits.acquire()
        try:
            connection = await self._engine.connect()
        except BaseException:
            self._permits.release()  # no connection: the permit is not held by anything
            raise
        self._connection = connection
        if self._generic:
            try:
                await connection.exec_driver_sql(PLAN_ONCE)
            except BaseException:
                await self._let_go()
                raise

    async def _let_go(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        try:
            if self._generic and not connection.invalidated:
                try:
                    await connection.exec_driver_sql(PLAN_AS_USUAL)
                except DBAPIError as error:  # not reset: not for the pool either
                    await connection.invalidate(error)
            await connection.close()
        finally:
            self._permits.release()
