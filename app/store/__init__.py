"""The update store: record once, claim under a fenced lease, settle, exhaust, acknowledge.

The contract is `app.store.contract`; its SQL is `app.store.queries`; the implementation over
SQLAlchemy Core is `app.store.sqlstore`; `app.store.conformance` checks any store against it.
"""

from app.store.contract import DurableUpdateStore, FencedUpdateStore, UpdateStore
from app.store.errors import SchemaError, StoreBusy, StoreError, StoreUnavailable
from app.store.schema import DEFAULT_TABLE
from app.store.sqlstore import SqlUpdateStore, open_store
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
    HandedBack,
    NewUpdate,
    Ordering,
    Settlement,
    State,
    StoredUpdate,
)

__all__ = [
    "DEFAULT_TABLE",
    "Abandoned",
    "BotStats",
    "Capability",
    "ClaimIdentity",
    "Claimed",
    "Completed",
    "DueUpdate",
    "DurableUpdateStore",
    "Exhaustion",
    "Failed",
    "FencedUpdateStore",
    "HandedBack",
    "NewUpdate",
    "Ordering",
    "SchemaError",
    "Settlement",
    "SqlUpdateStore",
    "State",
    "StoreBusy",
    "StoreError",
    "StoreUnavailable",
    "StoredUpdate",
    "UpdateStore",
    "open_store",
]
