"""SQLite's engine: one file in WAL with synchronous=FULL, a busy timeout, and transactions
that begin as the store asks (IMMEDIATE for a write)."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Engine,
    event,
)
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.errors import BUSY_TIMEOUT_MS

DEFAULT_WAL_PAGES = 1_000  # SQLite's own wal_autocheckpoint
MIN_WAL_PAGES = 16

# Execution option read by the `begin` hook: reads need no write lock.
SQLITE_BEGIN = "intake_sqlite_begin"


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
    # hide_parameters: an error's text names no body (docs/privacy.md).
    return {"connect_args": {"timeout": BUSY_TIMEOUT_MS / 1000}, "hide_parameters": True}


def set_up(dbapi_connection: Any) -> None:
    """Our pragmas, on the engine's connections and the writer's alike."""
    # Hand transaction control to us: pysqlite's implicit BEGIN is deferred.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    _use_wal(cursor)
    cursor.execute("PRAGMA synchronous = FULL")
    # SQLite checkpoints its WAL once it holds 1,000 pages (4 MiB): on a volume with less room
    # than four times that, the WAL would fill the volume before its first checkpoint. Keep it
    # to a quarter of the room there is (`sqlite_writer` lowers it again if a write ever finds
    # the disk full).
    room = _room_in_pages(cursor)
    if room is not None and room // 4 < DEFAULT_WAL_PAGES:
        cursor.execute(f"PRAGMA wal_autocheckpoint = {max(MIN_WAL_PAGES, room // 4)}")
    # A page cache of 64 MiB (SQLite's default is 2 MiB): the table's eight indexes take
    # their deletes and updates at scattered places (a prune in time order touches every
    # chat's range of ix_chat), and a cache smaller than their working set rereads pages
    # for every row.
    cursor.execute("PRAGMA cache_size = -65536")
    # What a delete or an update frees (an erasure, a retention, a re-encryption, a prune) is
    # overwritten with zeros, not left in free space for a reader of the file to find
    # (docs/privacy.md); the WAL keeps old pages until its next checkpoint.
    cursor.execute("PRAGMA secure_delete = ON")
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


def connector(engine: AsyncEngine) -> Callable[[], sqlite3.Connection]:
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


def _room_in_pages(cursor: Any) -> int | None:
    """The pages the database's volume has room for now; None for a database with no file."""
    cursor.execute("PRAGMA database_list")
    paths = [row[2] for row in cursor.fetchall() if row[1] == "main"]
    if not paths or not paths[0]:
        return None
    cursor.execute("PRAGMA page_size")
    [(page_size,)] = cursor.fetchall()
    try:
        volume = os.statvfs(os.path.dirname(paths[0]) or ".")
    except OSError:
        return None
    return int(volume.f_bavail * volume.f_frsize // int(page_size))


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
