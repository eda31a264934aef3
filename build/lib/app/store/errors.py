"""The store's errors. Driver exceptions never cross the store boundary; they become these.

    StoreError
    ├── SchemaError            the table is missing or older than the feature asked for
    │                          (the message names `alembic upgrade head`)
    └── StoreUnavailable       the database cannot be reached or did not answer in time;
        │                      the caller may retry (every write is idempotent or fenced)
        └── StoreBusy          SQLite: another process held the write lock past the busy timeout

Bad arguments are not store errors: they raise ValueError before any statement runs.
"""

from __future__ import annotations

UPGRADE_HINT = "run `alembic upgrade head` (or `telegram-intake migrate`)"


class StoreError(Exception):
    """Base of every error the store raises."""


class SchemaError(StoreError):
    """The live schema cannot serve the request."""


class StoreUnavailable(StoreError):
    """The database is unreachable or timed out.

    If the connection dropped during a commit, the change may or may not be durable. Repeating
    a write is safe (adds are idempotent, transitions fenced) but may answer differently: a
    claim whose answer was lost holds the row until its lease lapses, and a repeated
    acknowledgement that had succeeded answers False.
    """


class StoreBusy(StoreUnavailable):
    """SQLite's write lock stayed taken past the busy timeout."""
