"""The table, as SQLAlchemy Core metadata: the one source of truth that Alembic compares against.

Revision 0001 is the base shape; revision 0002 (the fenced claim, docs/design.md) adds `claim_id`,
`exhausted_at`, `acknowledged_at`, the exhaustion index and the due-order index that batch claims
walk; revision 0003 adds `uncounted` (attempts that spend no budget: hand-backs), and
`delivery_due_at` and `deliveries` (an open exhaustion's next delivery to `exhaustion_url`
and the failed ones so far, shared by every process) with their index; revision 0004 (operator
control, docs/contract.md section 9) adds four tables beside it, each named after it: `_attempts`
(every attempt's history), `_bots` (pause, the rate limit and its shared token bucket, what the
workers report of their breaker, the state of the backlog and webhook watches), `_audit`
(every operator action) and `_events` (the outbox of operational events), and the indexes
that operators' searches walk; revision 0005 (who may see what) adds `_audit_bots` (the bots each
audit entry concerns, which a key limited to some bots is shown by) and `_sessions` (the
console's sessions, which end at sign-out, after an idle time, or with their key); revision 0006
(Telegram's queues) adds `queue_rule`; revision 0007 (tracing, docs/contract.md section 15)
adds `trace_context`, the W3C `traceparent` of the span that recorded the update; revision 0008
adds the same column to `_events`, so that an event about an update (exhaustion.created) joins
its trace when it is delivered. `make_metadata(table, revision=...)` draws any of them.

Invariants every statement of the store keeps (its queries lean on them for index use; a
process writing the table by other means must keep them too):
- a pending row's `due_at` is its `received_at`;
- a row with `settled_at` has `due_at == settled_at`;
- `exhausted_at` is set only on `abandoned` rows, which no statement moves to another state;
- an open exhaustion (`exhausted_at` set, `acknowledged_at` NULL) has `delivery_due_at` set;
- every attempt a fenced claim starts has its row in `_attempts` (when history is kept), and a
  row of `_attempts` lives exactly as long as its update's row.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    text,
)

from app.store import validate
from app.store.schema_beside import (
    DELIVERY_CHECK as DELIVERY_CHECK,
)
from app.store.schema_beside import (
    ERASURE_KINDS as ERASURE_KINDS,
)
from app.store.schema_beside import (
    ERASURE_STATES as ERASURE_STATES,
)
from app.store.schema_beside import (
    NON_TERMINAL as NON_TERMINAL,
)
from app.store.schema_beside import (
    OUTCOME_CHECK as OUTCOME_CHECK,
)
from app.store.schema_beside import (  # the tables beside the updates table
    OUTCOMES as OUTCOMES,
)
from app.store.schema_beside import (
    UNACKNOWLEDGED as UNACKNOWLEDGED,
)
from app.store.schema_beside import (
    add_access_tables as add_access_tables,
)
from app.store.schema_beside import (
    add_destination_tables as add_destination_tables,
)
from app.store.schema_beside import (
    add_operator_tables as add_operator_tables,
)
from app.store.schema_beside import (
    add_privacy_tables as add_privacy_tables,
)
from app.store.schema_beside import (
    attempts_table_name as attempts_table_name,
)
from app.store.schema_beside import (
    audit_bots_table_name as audit_bots_table_name,
)
from app.store.schema_beside import (
    audit_table_name as audit_table_name,
)
from app.store.schema_beside import (
    beside_deliveries as beside_deliveries,
)
from app.store.schema_beside import (
    bots_table_name as bots_table_name,
)
from app.store.schema_beside import (
    deliveries_table_name as deliveries_table_name,
)
from app.store.schema_beside import (
    delivery_attempts_table_name as delivery_attempts_table_name,
)
from app.store.schema_beside import (
    destinations_table_name as destinations_table_name,
)
from app.store.schema_beside import (
    erasures_table_name as erasures_table_name,
)
from app.store.schema_beside import (
    events_table_name as events_table_name,
)
from app.store.schema_beside import (
    keys_table_name as keys_table_name,
)
from app.store.schema_beside import (
    partial_index as partial_index,
)
from app.store.schema_beside import (
    sessions_table_name as sessions_table_name,
)
from app.store.schema_beside import (
    updates_of as updates_of,
)
from app.store.schema_samples import (
    add_sample_table as add_sample_table,
)
from app.store.schema_samples import (
    samples_table_name as samples_table_name,
)
from app.store.types import STATES

DEFAULT_TABLE = "telegram_updates"
Revision = Literal[
    "0001", "0002", "0003", "0004", "0005", "0006", "0007", "0008", "0009", "0010", "0011"
]  # fmt: skip
HEAD: Revision = "0011"
# What each revision adds, in order: `revision_of` reads a live schema by it (the columns of
# the updates table, the tables beside it by their suffix, and their columns).
ADDED_COLUMNS: dict[Revision, tuple[str, ...]] = {
    "0002": ("claim_id", "exhausted_at", "acknowledged_at"),
    "0003": ("uncounted", "delivery_due_at", "deliveries"),
    "0004": (),
    "0005": (),
    "0006": ("queue_rule",),
    "0007": ("trace_context",),
    "0008": (),
    "0009": ("subjects", "erased_at"),
    "0010": (),
    "0011": (),
}
ADDED_TABLES: dict[Revision, tuple[str, ...]] = {
    "0004": ("_attempts", "_bots", "_audit", "_events"),
    "0005": ("_audit_bots", "_sessions"),
    "0009": ("_erasures", "_keys"),
    "0010": ("_deliveries", "_delivery_attempts", "_destinations"),
    "0011": ("_samples",),
}
ADDED_COLUMNS_BESIDE: dict[Revision, dict[str, tuple[str, ...]]] = {
    "0008": {"_events": ("trace_context",)},
    "0009": {"_events": ("bot", "update_id")},
}
# The tables beside it whose columns a later revision widened: what `revision_of` reads.
BESIDE_WIDENED = sorted({suffix for added in ADDED_COLUMNS_BESIDE.values() for suffix in added})
# queue_rule of a row whose queue_key this code computed: Telegram's queues as `app.queues`
# reads them (Bot API 10.0). A later table that moves a queue takes the next number.
QUEUE_RULE = 1
STATE_CHECK = "state IN (" + ", ".join(f"'{s}'" for s in STATES) + ")"


def state_check(revision: Revision) -> str:
    """The updates table's CHECK on `state` at `revision`."""
    return STATE_CHECK if revision >= "0010" else DELIVERY_CHECK


def owns_function_name(table: str) -> str:
    """The PostgreSQL ownership function: `telegram_intake_owns` for the default table."""
    return "telegram_intake_owns" if table == DEFAULT_TABLE else f"{table}_owns"


def version_table_name(table: str) -> str:
    """Alembic's version table: our own, so a downstream's Alembic in the same database is safe."""
    return f"{table}_alembic_version"


def make_metadata(table: str = DEFAULT_TABLE, revision: Revision = HEAD) -> MetaData:
    """Metadata holding the updates table (and, from 0004, the tables beside it) as they stand
    at `revision`."""
    validate.table_name(table)
    metadata = MetaData()
    columns: list[Column[Any]] = [
        Column("bot", Text, nullable=False),
        Column("update_id", BigInteger, nullable=False),
        Column("body", Text, nullable=False),
        Column("update_type", Text, nullable=True),
        Column("queue_key", Text, nullable=True),
        Column("state", Text, nullable=False),
        Column("attempts", Integer, nullable=False),
        Column("due_at", BigInteger, nullable=False),
        Column("received_at", BigInteger, nullable=False),
        Column("settled_at", BigInteger, nullable=True),
        Column("error", Text, nullable=True),
    ]
    if revision >= "0002":
        columns += [
            Column("claim_id", Text, nullable=True),
            Column("exhausted_at", BigInteger, nullable=True),
            Column("acknowledged_at", BigInteger, nullable=True),
        ]
    if revision >= "0003":
        columns += [
            Column("uncounted", Integer, nullable=False, server_default=text("0")),
            Column("delivery_due_at", BigInteger, nullable=True),
            Column("deliveries", Integer, nullable=False, server_default=text("0")),
        ]
    if revision >= "0006":
        # Which table computed queue_key: NULL for a row recorded by code older than 0006 (the
        # database keys it on insert, app/store/rekey.py), QUEUE_RULE for Telegram's queues.
        columns.append(Column("queue_rule", Integer, nullable=True))
    if revision >= "0007":
        # The trace the update belongs to: the W3C traceparent of the intake's span for the
        # request that recorded it; NULL when tracing was off there (docs/contract.md 15).
        columns.append(Column("trace_context", Text, nullable=True))
    if revision >= "0009":
        # Personal data (docs/privacy.md): every user and chat id the update names, each as
        # stored (a keyed digest with a key ring), space-separated between spaces, which an
        # erasure and a search by user match; NULL for a row recorded before this revision.
        # erased_at: when its body (and its history's errors) were erased, by retention or
        # on request; the row stays for dedupe and history.
        columns.append(Column("subjects", Text, nullable=True))
        columns.append(Column("erased_at", BigInteger, nullable=True))
    updates = Table(
        table,
        metadata,
        *columns,
        PrimaryKeyConstraint("bot", "update_id", name=f"pk_{table}"),
        CheckConstraint(state_check(revision), name=f"ck_{table}_state"),
    )
    Index(f"ix_{table}_state_due", updates.c.state, updates.c.due_at)
    partial_index(
        f"ix_{table}_queue",
        updates.c.bot,
        updates.c.queue_key,
        updates.c.update_id,
        where=NON_TERMINAL,
    )
    if revision >= "0002":
        # claim_next_owned walks due rows in due_at order and stops at its limit.
        partial_index(f"ix_{table}_due", updates.c.due_at, where=NON_TERMINAL)
        partial_index(
            f"ix_{table}_unacknowledged",
            updates.c.bot,
            updates.c.update_id,
            where=UNACKNOWLEDGED,
        )
    if revision >= "0003":
        # Exhaustion delivery takes the open exhaustions that are due, in due order.
        partial_index(f"ix_{table}_delivery_due", updates.c.delivery_due_at, where=UNACKNOWLEDGED)
    if revision >= "0004":
        # Operators' searches (`search_updates`): newest first within a bot, by chat, by type.
        Index(f"ix_{table}_received", updates.c.bot, updates.c.received_at, updates.c.update_id)
        Index(
            f"ix_{table}_chat",
            updates.c.bot,
            updates.c.queue_key,
            updates.c.received_at,
            updates.c.update_id,
        )
        Index(
            f"ix_{table}_type",
            updates.c.bot,
            updates.c.update_type,
            updates.c.received_at,
            updates.c.update_id,
        )
        add_operator_tables(metadata, table, traced=revision >= "0008", keyed=revision >= "0009")
    if revision >= "0005":
        add_access_tables(metadata, table)
    if revision >= "0009":
        add_privacy_tables(metadata, table)
    if revision >= "0010":
        add_destination_tables(metadata, table)
    if revision >= "0011":
        add_sample_table(metadata, table)
    return metadata


def revision_of(
    columns: set[str],
    tables: set[str] | None = None,
    table: str = "",
    beside: Mapping[str, set[str]] | None = None,
) -> Revision:
    """The revision whose columns the live table has, and whose tables stand beside it with
    their columns (the highest complete one). `tables`: the names in its schema; None reads
    columns only. `beside`: the columns of the tables beside it, by their suffix."""
    present: Revision = "0001"
    for revision, added in ADDED_COLUMNS.items():
        if not set(added) <= columns:
            break
        names = {table + suffix for suffix in ADDED_TABLES.get(revision, ())}
        if names and (tables is None or not names <= tables):
            break
        widened = ADDED_COLUMNS_BESIDE.get(revision, {}).items()
        if any(not set(more) <= (beside or {}).get(suffix, set()) for suffix, more in widened):
            break
        present = revision
    return present


def make_table(table: str = DEFAULT_TABLE, revision: Revision = HEAD) -> Table:
    return make_metadata(table, revision).tables[table]
