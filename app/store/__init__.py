"""The update store: record once, claim under a fenced lease, settle, exhaust, acknowledge.

The contract is `app.store.contract`, its three levels composed of the roles each family
offers. Each family is a package holding its `roles`, `statements` (the SQL), `methods` and
`conformance` rules: `records`, `claims`, `settles`, `exhaustions`, `control`, `views`, `events`,
`polling`, `sessions`, `erasures`, `keys`; personal data crosses one seam, `app.store.sealing`
over `app.store.codec`. `app.store.store` composes the families' methods flat over
`app.store.core`; what differs between SQLite and PostgreSQL is `app.store.backends`;
`app.store.conformance.check` checks any store against the contract.
"""

from app.store.contract import (
    DurableUpdateStore,
    FencedUpdateStore,
    OperatorStore,
    UpdateStore,
)
from app.store.errors import (
    SchemaError,
    StorageFull,
    StoreBusy,
    StoreError,
    StoreTimedOut,
    StoreUnavailable,
)
from app.store.operator_types import (
    ActivitySlot,
    AttemptRecord,
    AuditEntry,
    BotControl,
    BulkOutcome,
    EventType,
    ExhaustionFilter,
    OperationalEvent,
    SearchCursor,
    SearchPage,
    UpdateFilter,
    WebhookInfo,
)
from app.store.schema import DEFAULT_TABLE
from app.store.store import SqlUpdateStore, open_store, open_store_waiting
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
    StoredDelivery,
    StoredUpdate,
)

__all__ = [
    "DEFAULT_TABLE",
    "Abandoned",
    "ActivitySlot",
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
    "StorageFull",
    "StoreBusy",
    "StoreError",
    "StoreTimedOut",
    "StoreUnavailable",
    "StoredDelivery",
    "StoredUpdate",
    "UpdateFilter",
    "UpdateStore",
    "WebhookInfo",
    "open_store",
    "open_store_waiting",
]
