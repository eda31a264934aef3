"""The SQLite writer's transactions (`app/store/backends/sqlite_writer.py`): a COMMIT that fails
arrives as a failing statement does, and leaves the connection with no transaction open."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import exc, text

from app.store.backends.sqlite_writer import Transaction, Writer


async def test_a_commit_that_fails_arrives_as_a_statement_s_error_would(tmp_path: Path) -> None:
    # A deferred constraint fails at COMMIT, as a full disk does: before, the driver's own
    # error escaped the store's translation (nobody retried or logged it).
    path = tmp_path / "writer.db"

    def connect() -> sqlite3.Connection:
        connection = sqlite3.connect(path, isolation_level=None)
        connection.execute("PRAGMA foreign_keys = ON")
        return connection

    setup = connect()
    setup.execute("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
    setup.execute(
        "CREATE TABLE child (parent INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED)"
    )
    setup.close()

    def orphan(transaction: Transaction) -> None:
        transaction.execute(text("INSERT INTO child VALUES (7)"))

    def children(transaction: Transaction) -> int:
        return int(transaction.execute(text("SELECT count(*) AS n FROM child"))[0].n)

    writer = Writer(connect)
    try:
        with pytest.raises(exc.IntegrityError, match="FOREIGN KEY") as raised:
            await writer.run(orphan)
        assert "COMMIT" in str(raised.value)
        assert await writer.run(children) == 0  # rolled back; the connection goes on
    finally:
        await writer.close()
