"""The update store: record once, claim under a fenced lease, settle, exhaust, acknowledge.

The contract is `app.store.contract`; its SQL is `app.store.queries`; the implementation over
SQLAlchemy Core is `app.store.sqlstore`; `app.store.conformance` checks any store against it.
"""

from app.store.contract import (
    DurableUpdateStore,
    FencedUpdateStore,
    OperatorStore,
    UpdateStore,
)
from app.store.errors import SchemaError, StoreBusy, StoreError, StoreUnavailable
from app.store.schema import DEFAULT_TABLE
from app.store.sqlstore import SqlUpdateStore, open_store
from app.store.types import (
    Abandoned,
    AttemptRecord,
    AuditEntry,
    BotControl,
    BotStats,
    BulkOutcome,
    Capability,
    Claimed,
    ClaimIdentity,
    Completed,
    DueUpdate,
    EventType,
    Exhaustion,
    ExhaustionFilter,
    Failed,
    HandedBack,
    NewUpdate,
    OperationalEvent,
    Ordering,
    SearchCursor,
    SearchPage,
    Settlement,
    State,
    StoredUpdate,
    UpdateFilter,
    WebhookInfo,
)

__all__ = [
    "DEFAULT_TABLE",
    "Abandoned",
    "AttemptRecord",
    "AuditEntry",
    "BotControl",
    "BotStats",
    "BulkOutcome",
    "Capability",
    "ClaimIdentity",
    "Claimed",
    "Completed",
    "DueUpdate",
    "DurableUpdateStore",
    "EventType",
    "Exhaustion",
    "ExhaustionFilter",
    "Failed",
    "FencedUpdateStore",
    "HandedBack",
    "NewUpdate",
    "OperationalEvent",
    "OperatorStore",
    "Ordering",
    "SchemaError",
    "SearchCursor",
    "SearchPage",
    "Settlement",
    "SqlUpdateStore",
    "State",
    "StoreBusy",
    "StoreError",
    "StoreUnavailable",
    "StoredUpdate",
    "UpdateFilter",
    "UpdateStore",
    "WebhookInfo",
    "open_store",
]
