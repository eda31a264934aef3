"""SQLite's hot write transactions, each run whole on a thread of its own in one hand-off.

Through the async driver every step of a transaction (BEGIN, each statement's cursor, execute
and close, the fetch, COMMIT, the pool's reset) is a hand-off between its thread and the event
loop, and each waits for the loop's next turn: about nine for a batch insert. Under load a turn
of the loop takes milliseconds, so a commit that SQLite does in under one took nine, and the
intake's group commit, bounded by the commit it waits for, ran at 0.42x of its no-store
ceiling. The writer runs the whole transaction, BEGIN IMMEDIATE to COMMIT (`run`), or a write
that needs nothing around it as one autocommit statement (`run_each`), as one function on its
own connection and thread: one hand-off whatever the statements. Inside that function each
step of the driver still hands the GIL back and must take it again from the event loop, so
the hot writes keep their steps few (see `SWITCH_INTERVAL`).

It is for the writes run most often (the intake's batch insert, the claim, the batch settle);
every other method goes through the engine. Both are writers of the same file: the process
queues them on one lock (`SqliteBackend.write_lock`), other processes on SQLite's own, within
its busy timeout. The writer's connection is set up as the engine's are
(`app.store.backends.sqlite_engine`).

A full disk (`SQLITE_FULL`) is met here first: the writer then makes the WAL give its room back
(`make_room`) and keeps it a quarter of the size it had reached from then on, for the life of
the process. SQLite checkpoints its WAL only once it reaches 1,000 pages (4 MiB): on a volume
with less room than that, the WAL took back whatever was freed, filled the volume again and
never reached its checkpoint, and writes failed for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import sqlite3
import sys
from collections import namedtuple
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import exc
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import ClauseElement

from app.store.backends.sqlite_engine import MIN_WAL_PAGES

Result = TypeVar("Result")
DIALECT = sqlite_dialect.dialect(paramstyle="qmark")
# How long the event loop's thread may keep the GIL while the writer waits for it (CPython's
# default is 5 ms). The writer gives the GIL up at each step of SQLite and needs it back to go
# on; behind a busy event loop each such wait took the whole interval, which held the commit,
# and every request of its batch, for milliseconds of doing nothing.
SWITCH_INTERVAL = 0.0001
# How long a checkpoint that gives room back waits for readers: not the busy timeout's seconds
# with every writer of the process queued behind it.
CHECKPOINT_BUSY_MS = 100
WAL_FRAME_HEADER = 24  # bytes before each page in the WAL


@dataclass(frozen=True)
class Prepared:
    """A statement compiled once to SQLite's SQL: its text, the names of its positional
    parameters in order, and the values of those the statement fixes itself. Values go to the
    driver as they are, with no type's bind processing: the statements it serves bind
    integers, text and None only."""

    sql: str
    names: tuple[str, ...]
    constants: Mapping[str, Any]

    @classmethod
    def of(cls, statement: ClauseElement) -> Prepared:
        compiled = statement.compile(dialect=DIALECT, compile_kwargs={"render_postcompile": True})
        assert isinstance(compiled, SQLCompiler)
        # The values as compiled, IN-lists expanded to one parameter each (render_postcompile).
        # Those the caller gives each time (required) are left out.
        given = {bind.key: None for bind in compiled.binds.values() if bind.required}
        values = compiled.construct_params(given).items()
        constants = {name: value for name, value in values if value is not None}
        return cls(compiled.string, tuple(compiled.positiontup or ()), constants)

    def parameters(self, values: Mapping[str, Any]) -> list[Any]:
        """The positional parameters for `values` (by name), the fixed ones filled in."""
        return [values[name] if name in values else self.constants.get(name) for name in self.names]


class Transaction:
    """What a writer's function runs its statements with: inside BEGIN IMMEDIATE (`run`), or
    each statement its own transaction (`run_each`)."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection

    def execute(
        self, statement: Prepared | ClauseElement, values: Mapping[str, Any] | None = None
    ) -> list[Any]:
        """Run one statement; its rows, each with its columns by name (`row.bot`)."""
        prepared = statement if isinstance(statement, Prepared) else Prepared.of(statement)
        parameters = prepared.parameters(values or {})
        with _as_sqlalchemy(prepared.sql, parameters):
            cursor = self._connection.execute(prepared.sql, parameters)
            rows = cursor.fetchall()
        if cursor.description is None:
            return []
        kind = _row_type(tuple(column[0] for column in cursor.description))
        return [kind(*row) for row in rows]

    def insert(self, statement: Prepared, values: Mapping[str, Any]) -> tuple[int, int]:
        """Run one INSERT (without RETURNING): the rows it inserted, and the rowid of the last
        of them (SQLite's `last_insert_rowid()`, stale when it inserted none)."""
        parameters = statement.parameters(values)
        with _as_sqlalchemy(statement.sql, parameters):
            cursor = self._connection.execute(statement.sql, parameters)
        return cursor.rowcount, cursor.lastrowid or 0

    def execute_many(self, statement: Prepared, rows: Sequence[Mapping[str, Any]]) -> None:
        """Run one statement (without RETURNING) once for each of `rows`."""
        parameters = [statement.parameters(row) for row in rows]
        with _as_sqlalchemy(statement.sql, parameters):
            self._connection.executemany(statement.sql, parameters)


class Writer:
    """One connection, made by `connect` (with transactions left to us: no implicit BEGIN)
    on one thread, opened there at first use."""

    def __init__(self, connect: Callable[[], sqlite3.Connection]) -> None:
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL))  # the process's
        self._open = connect
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-writer")
        self._connection: sqlite3.Connection | None = None
        self._wal_limit: int | None = None  # pages: set once a full disk showed the room

    async def run(self, work: Callable[[Transaction], Result]) -> Result:
        """Run `work` in one write transaction, committed when it returns and rolled back when
        it raises. Cancelled, the transaction still runs to its end on the writer's thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, self._transaction, work)

    async def run_each(self, work: Callable[[Transaction], Result]) -> Result:
        """Run `work` with each statement its own transaction (SQLite's autocommit: a write
        takes the lock, waiting within the busy timeout, and commits as its one step ends).
        For a write that needs nothing around it: no BEGIN and COMMIT, each a step of the
        driver's own."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, self._each, work)

    def _transaction(self, work: Callable[[Transaction], Result]) -> Result:
        connection = self._connect()
        with _as_sqlalchemy("BEGIN IMMEDIATE", []):
            connection.execute("BEGIN IMMEDIATE")
        try:
            result = work(Transaction(connection))
            # A COMMIT fails too (a full disk, a deferred constraint): raised as the
            # statements' errors are, so that the store translates and callers retry it.
            with _as_sqlalchemy("COMMIT", []):
                connection.execute("COMMIT")
        except BaseException as error:
            if connection.in_transaction:
                # The first error tells what happened; one from the ROLLBACK would hide it.
                with contextlib.suppress(sqlite3.Error):
                    connection.execute("ROLLBACK")
            if _full(error):
                self._make_room(connection)
            raise
        return result

    def _each(self, work: Callable[[Transaction], Result]) -> Result:
        connection = self._connect()
        try:
            return work(Transaction(connection))
        except BaseException as error:
            if _full(error):
                self._make_room(connection)
            raise

    async def make_room(self) -> None:
        """Checkpoint the WAL into the file and truncate it: its room goes back to the volume.
        Raised as the statements' errors are (SQLITE_FULL while the file cannot grow)."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._thread, self._checkpoint, self._connect())

    def _make_room(self, connection: sqlite3.Connection) -> None:
        """After SQLITE_FULL: keep the WAL to a quarter of what it had reached (the room the
        volume had for it), and give back what it can now."""
        with contextlib.suppress(sqlite3.Error, exc.DBAPIError, OSError):
            if self._wal_limit is None:
                self._wal_limit = max(MIN_WAL_PAGES, _wal_pages(connection) // 4)
                connection.execute(f"PRAGMA wal_autocheckpoint = {self._wal_limit}")
            self._checkpoint(connection)

    @staticmethod
    def _checkpoint(connection: sqlite3.Connection) -> None:
        [(timeout,)] = connection.execute("PRAGMA busy_timeout").fetchall()
        connection.execute(f"PRAGMA busy_timeout = {CHECKPOINT_BUSY_MS}")
        try:
            with _as_sqlalchemy("PRAGMA wal_checkpoint(TRUNCATE)", []):
                connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        finally:
            connection.execute(f"PRAGMA busy_timeout = {int(timeout)}")

    def _connect(self) -> sqlite3.Connection:
        if self._connection is None:
            self._connection = self._open()
        return self._connection

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._thread, self._close)
        self._thread.shutdown(wait=True)

    def _close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


@functools.cache
def _row_type(names: tuple[str, ...]) -> type:
    """A row type for these column names (the statements are few, so their shapes are)."""
    return namedtuple("Row", names, rename=True)


def _wal_pages(connection: sqlite3.Connection) -> int:
    """The pages the WAL file holds now, by its size (a checkpoint that would count them may
    fail on the full disk)."""
    [path] = [row[2] for row in connection.execute("PRAGMA database_list") if row[1] == "main"]
    [(page_size,)] = connection.execute("PRAGMA page_size").fetchall()
    return os.path.getsize(f"{path}-wal") // (int(page_size) + WAL_FRAME_HEADER)


def _full(error: BaseException) -> bool:
    """Whether `error` (as `_as_sqlalchemy` raises it) is SQLite's SQLITE_FULL."""
    original = getattr(error, "orig", error)
    return getattr(original, "sqlite_errorname", None) == "SQLITE_FULL"


@contextmanager
def _as_sqlalchemy(sql: str, parameters: Any) -> Iterator[None]:
    """Driver errors raised as SQLAlchemy wraps them, so the store's translation applies to
    both."""
    try:
        yield
    except sqlite3.Error as error:
        raise exc.DBAPIError.instance(sql, parameters, error, sqlite3.Error) from error
