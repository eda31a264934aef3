"""The store over SQLAlchemy Core, written once for SQLite and PostgreSQL: one class composed
flat from each family's methods, every one standing on `SqlCore` (`app.store.core`: the
schema, the checks, the transactions) and nothing else.

Statements come from each family's `statements`; the store checks arguments, runs each
statement in the right kind of transaction and maps rows to the types of `app.store.types`.
What the two databases do differently is each one's `Backend` (`app.store.backends`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from app.store import validate
from app.store.backend import Backend
from app.store.backends.postgres import PostgresBackend
from app.store.backends.sqlite import SqliteBackend
from app.store.claims.methods import ClaimMethods
from app.store.codec import PLAIN, Codec
from app.store.control.methods import ControlMethods
from app.store.engine import create_store_engine
from app.store.erasures.methods import ErasureMethods
from app.store.errors import StoreUnavailable
from app.store.events.methods import EventMethods
from app.store.exhaustions.methods import ExhaustionMethods
from app.store.keys.methods import KeyMethods
from app.store.polling.methods import PollingMethods
from app.store.records.methods import RecordMethods
from app.store.revision import read_capability, read_revision
from app.store.samples.methods import SampleMethods
from app.store.schema import DEFAULT_TABLE
from app.store.sessions.methods import SessionMethods
from app.store.settles.methods import SettleMethods
from app.store.views.methods import ViewMethods

__all__ = ["SqlUpdateStore", "open_store", "open_store_waiting", "read_capability"]

log = logging.getLogger(__name__)


class SqlUpdateStore(
    RecordMethods,
    ClaimMethods,
    SettleMethods,
    ExhaustionMethods,
    ControlMethods,
    ViewMethods,
    EventMethods,
    PollingMethods,
    SessionMethods,
    ErasureMethods,
    KeyMethods,
    SampleMethods,
):
    """A durable store on SQLite or PostgreSQL; `capability` follows the live schema. Each
    family's methods stand on `SqlCore` alone: none calls another family's."""

    def _connect(self, engine: AsyncEngine) -> Backend:
        if engine.dialect.name == "sqlite":
            return SqliteBackend(engine)
        return PostgresBackend(engine)


async def open_store(
    url: str,
    *,
    table: str = DEFAULT_TABLE,
    pool_size: int = 10,
    statement_timeout_ms: int = 0,
    lock_timeout_ms: int = 0,
    pgbouncer: bool = False,
    listen_url: str | None = None,
    history: bool = True,
    worker: str | None = None,
    events: bool = False,
    codec: Codec = PLAIN,
) -> SqlUpdateStore:
    """Open a store on a migrated database; `capability` is read from the live schema. On
    PostgreSQL, nonzero timeouts bound every statement of its connections (a statement past
    either raises StoreUnavailable). `pgbouncer`: `url` is PgBouncer in transaction pooling
    mode; `listen_url`: a direct URL for the wake-ups' LISTEN (see
    `app.store.backends.postgres`); `codec`: what personal data is stored as (a key ring's
    `Codec` encrypts it: docs/privacy.md)."""
    validate.table_name(table)
    engine = create_store_engine(
        url,
        pool_size=pool_size,
        statement_timeout_ms=statement_timeout_ms,
        lock_timeout_ms=lock_timeout_ms,
        pgbouncer=pgbouncer,
        listen_url=listen_url,
    )
    try:
        revision = await read_revision(engine, table)
    except BaseException:
        await engine.dispose()
        raise
    return SqlUpdateStore(
        engine, table, revision, history=history, worker=worker, events=events, codec=codec
    )


# What a server answers a connection with that no wait changes: a missing database or role,
# a wrong password, a pg_hba.conf that turns the client away (libpq gives these no SQLSTATE;
# a server speaking another language is waited for, as long as the wait lasts).
REFUSED_FOR_GOOD = (
    "does not exist",
    "password authentication failed",
    "no pg_hba.conf entry",
    "authentication failed",
)


async def open_store_waiting(
    url: str, *, wait: float, stopping: Callable[[], bool] = lambda: False, **options: Any
) -> SqlUpdateStore:
    """`open_store`, retried while the database is unavailable, for up to about `wait`
    seconds (the try under way when it ends runs its course): a process that starts in a
    failover's gap (or before its database) finds it once it is up, rather than exiting. A
    refusal that no wait changes, every other error, and the last unavailability are
    raised, and so is the unavailability of the moment once `stopping()` (a SIGTERM meanwhile:
    a process asked to stop does not wait out the minute)."""
    deadline = time.monotonic() + wait
    pause = 0.2
    while True:
        try:
            return await open_store(url, **options)
        except StoreUnavailable as error:
            left = deadline - time.monotonic()
            if left <= 0 or any(words in str(error) for words in REFUSED_FOR_GOOD):
                raise
            pause = min(pause, left)
            log.warning("%s; trying again in %.1f s (for %.0f s more)", error, pause, left)
            resume = time.monotonic() + pause
            while (step := resume - time.monotonic()) > 0:
                if stopping():
                    raise
                await asyncio.sleep(min(step, 0.1))
            pause = min(pause * 2, 5.0)
