"""The store's errors. Driver exceptions never cross the store boundary: `translated_errors`
turns them into these.

    StoreError
    ├── SchemaError            the table is missing or older than the feature asked for
    │                          (the message names `alembic upgrade head`)
    ├── Undecryptable          a stored value's key is not in the ring, or the value was
    │                          altered: never read as plaintext (docs/privacy.md)
    ├── MissingKeys            the ring lacks keys that stored values may be sealed under:
    │                          a process refuses to start rather than fail on each value
    └── StoreUnavailable       the database cannot be reached or cannot write; the caller
        │                      may retry (every write is idempotent or fenced)
        ├── StorageFull        its disk is full (the data or the WAL): it cannot write until
        │                      space is freed (`app.store.storage` watches the episode)
        └── StoreTimedOut      it did not answer in time: a lock or statement timeout, no
            │                  pooled connection free
            └── StoreBusy      SQLite: another process held the write lock past the busy timeout

Bad arguments are not store errors: they raise ValueError before any statement runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import exc

UPGRADE_HINT = "run `alembic upgrade head` (or `telegram-intake migrate`)"
# SQLite: how long a writer waits for the file's write lock before StoreBusy (the engine sets
# it on every connection, `app.store.backends.sqlite_engine`).
BUSY_TIMEOUT_MS = 10_000


class StoreError(Exception):
    """Base of every error the store raises."""


class SchemaError(StoreError):
    """The live schema cannot serve the request."""


class Undecryptable(StoreError):
    """A stored value that the key ring cannot open: its key id is not in the ring, or the
    value, its row or its column was altered (AES-GCM's tag says which is unknowable)."""


class MissingKeys(StoreError):
    """The key ring lacks keys that the key registry says may still hold values."""


class StoreUnavailable(StoreError):
    """The database is unreachable or timed out.

    If the connection dropped during a commit, the change may or may not be durable. Repeating
    a write is safe (adds are idempotent, transitions fenced) but may answer differently: a
    claim whose answer was lost holds the row until its lease lapses, and a repeated
    acknowledgement that had succeeded answers False.

    `during_full_disk`: raised while the store's episode of a full disk lasts (a server that
    stopped for its full WAL refuses connections meanwhile): part of that episode, which its
    own lines tell (`app.store.storage`).
    """

    during_full_disk = False


class StorageFull(StoreUnavailable):
    """The database could not write for want of space: SQLite's `SQLITE_FULL`, PostgreSQL's
    `disk_full` (53100: "could not extend file", or its WAL's "No space left on device").
    The message quotes the database's own words."""


class StoreTimedOut(StoreUnavailable):
    """The database did not answer in time: a wait ran out, on a lock, a statement or the
    pool. Unlike a lost connection or a full disk, it says nothing of the next statement."""


class StoreBusy(StoreTimedOut):
    """SQLite's write lock stayed taken past the busy timeout."""


_SCHEMA_SQLSTATES = {"42P01", "42703", "42883"}  # undefined table, column, function
_TIMEOUT_SQLSTATES = {"55P03", "57014"}  # lock_timeout, statement_timeout (query canceled)
_FULL_SQLSTATES = {"53100"}  # disk_full
# SQLite's SQLITE_FULL, and the operating system's words where a server quotes them (a
# PostgreSQL PANIC on its WAL volume reaches the client with no SQLSTATE of its own).
_FULL_MESSAGES = ("database or disk is full", "No space left on device")
_SCHEMA_MESSAGES = ("no such table", "no such column", "has no column named")
# What a transaction pooler does to a client that keeps session state: a prepared statement
# met again on another client's server session (or missing on this one), the `options` of
# the timeouts refused at connect.
_POOLER_SQLSTATES = {"42P05", "26000"}  # duplicate prepared statement, no such statement
_POOLER_MESSAGES = ("unsupported startup parameter",)
POOLER_HINT = (
    "behind PgBouncer in transaction pooling mode? set INTAKE_DATABASE_PGBOUNCER=true "
    "(docs/operations.md)"
)


@contextmanager
def translated_errors(table: str) -> Iterator[None]:
    """Turn driver exceptions into the store's error tree (see `app.store.errors`)."""
    try:
        yield
    except exc.DBAPIError as error:
        raise _translate(error, table) from error
    except exc.TimeoutError as error:  # no pooled connection came free in time
        raise StoreTimedOut(f"database unavailable: {error}") from error
    except (ConnectionError, TimeoutError) as error:
        raise StoreUnavailable(f"database unavailable: {error}") from error


def _translate(error: exc.DBAPIError, table: str) -> StoreError:
    original = error.orig
    message = str(original).strip().splitlines()[0] if original is not None else str(error)
    sqlstate = getattr(original, "sqlstate", None)
    if sqlstate in _POOLER_SQLSTATES or any(m in message for m in _POOLER_MESSAGES):
        message = f"{message}; {POOLER_HINT}"
    if sqlstate in _SCHEMA_SQLSTATES or any(m in message for m in _SCHEMA_MESSAGES):
        return SchemaError(f"table {table!r} is not as expected ({message}); {UPGRADE_HINT}")
    if sqlstate in _FULL_SQLSTATES or any(m in message for m in _FULL_MESSAGES):
        return StorageFull(f"database storage is full: {message}")
    if sqlstate in _TIMEOUT_SQLSTATES:
        return StoreTimedOut(f"database did not answer in time: {message}")
    if "database is locked" in message:
        return StoreBusy(f"SQLite write lock still taken after {BUSY_TIMEOUT_MS} ms: {message}")
    if error.connection_invalidated or isinstance(error, exc.OperationalError | exc.InterfaceError):
        return StoreUnavailable(f"database unavailable: {message}")
    return StoreError(f"database error: {message}")
