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
    Double,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    text,
)

from app.store import validate
from app.store.types import STATES

DEFAULT_TABLE = "telegram_updates"
Revision = Literal["0001", "0002", "0003", "0004", "0005", "0006", "0007", "0008", "0009"]
HEAD: Revision = "0009"
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
}
ADDED_TABLES: dict[Revision, tuple[str, ...]] = {
    "0004": ("_attempts", "_bots", "_audit", "_events"),
    "0005": ("_audit_bots", "_sessions"),
    "0009": ("_erasures", "_keys"),
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
# Attempt outcomes as `_attempts` records them (NULL while the attempt runs, and for an
# attempt whose lease lapsed before it ended: a reader calls that one "lost").
OUTCOMES = ("completed", "failed", "abandoned", "exhausted", "handed_back", "parked")
OUTCOME_CHECK = "outcome IN (" + ", ".join(f"'{o}'" for o in OUTCOMES) + ")"

# Erasure jobs (revision 0009, docs/privacy.md): what an erasure concerns, and where it is.
ERASURE_KINDS = ("user", "chat", "bot")
ERASURE_STATES = ("pending", "running", "done")

# Rows a worker may still deliver; the ordering index and chat ordering only look at these.
NON_TERMINAL = "state IN ('pending', 'processing', 'failed')"
UNACKNOWLEDGED = "exhausted_at IS NOT NULL AND acknowledged_at IS NULL"
STATE_CHECK = "state IN (" + ", ".join(f"'{s}'" for s in STATES) + ")"


def owns_function_name(table: str) -> str:
    """The PostgreSQL ownership function: `telegram_intake_owns` for the default table."""
    return "telegram_intake_owns" if table == DEFAULT_TABLE else f"{table}_owns"


def version_table_name(table: str) -> str:
    """Alembic's version table: our own, so a downstream's Alembic in the same database is safe."""
    return f"{table}_alembic_version"


def attempts_table_name(table: str) -> str:
    return f"{table}_attempts"


def bots_table_name(table: str) -> str:
    return f"{table}_bots"


def audit_table_name(table: str) -> str:
    return f"{table}_audit"


def events_table_name(table: str) -> str:
    return f"{table}_events"


def audit_bots_table_name(table: str) -> str:
    return f"{table}_audit_bots"


def sessions_table_name(table: str) -> str:
    return f"{table}_sessions"


def erasures_table_name(table: str) -> str:
    return f"{table}_erasures"


def keys_table_name(table: str) -> str:
    return f"{table}_keys"


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
        CheckConstraint(STATE_CHECK, name=f"ck_{table}_state"),
    )
    Index(f"ix_{table}_state_due", updates.c.state, updates.c.due_at)
    Index(
        f"ix_{table}_queue",
        updates.c.bot,
        updates.c.queue_key,
        updates.c.update_id,
        postgresql_where=text(NON_TERMINAL),
        sqlite_where=text(NON_TERMINAL),
    )
    if revision >= "0002":
        # claim_next_owned walks due rows in due_at order and stops at its limit.
        Index(
            f"ix_{table}_due",
            updates.c.due_at,
            postgresql_where=text(NON_TERMINAL),
            sqlite_where=text(NON_TERMINAL),
        )
        Index(
            f"ix_{table}_unacknowledged",
            updates.c.bot,
            updates.c.update_id,
            postgresql_where=text(UNACKNOWLEDGED),
            sqlite_where=text(UNACKNOWLEDGED),
        )
    if revision >= "0003":
        # Exhaustion delivery takes the open exhaustions that are due, in due order.
        Index(
            f"ix_{table}_delivery_due",
            updates.c.delivery_due_at,
            postgresql_where=text(UNACKNOWLEDGED),
            sqlite_where=text(UNACKNOWLEDGED),
        )
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
        _add_operator_tables(metadata, table, revision)
    if revision >= "0005":
        _add_access_tables(metadata, table)
    if revision >= "0009":
        _add_privacy_tables(metadata, table)
    return metadata


def _add_operator_tables(metadata: MetaData, table: str, revision: Revision) -> None:
    attempts = attempts_table_name(table)
    Table(
        attempts,
        metadata,
        Column("bot", Text, nullable=False),
        Column("update_id", BigInteger, nullable=False),
        Column("attempt", Integer, nullable=False),
        Column("claim_id", Text, nullable=False),
        Column("started_at", BigInteger, nullable=False),
        Column("ended_at", BigInteger, nullable=True),
        Column("outcome", Text, nullable=True),
        Column("status_code", Integer, nullable=True),
        Column("error", Text, nullable=True),
        Column("worker", Text, nullable=True),
        PrimaryKeyConstraint("bot", "update_id", "attempt", name=f"pk_{attempts}"),
        CheckConstraint(OUTCOME_CHECK, name=f"ck_{attempts}_outcome"),
    )
    bots = bots_table_name(table)
    Table(
        bots,
        metadata,
        Column("bot", Text, nullable=False),
        Column("paused_at", BigInteger, nullable=True),
        Column("paused_by", Text, nullable=True),
        Column("paused_reason", Text, nullable=True),
        Column("rate_per_second", Double, nullable=True),
        # The rate limit's token bucket, shared by every worker process: the tokens left at
        # `refilled_at`; it refills at rate_per_second up to a second's worth.
        Column("tokens", Double, nullable=False, server_default=text("0")),
        Column("refilled_at", BigInteger, nullable=False, server_default=text("0")),
        # The last breaker transition any worker reported, and when.
        Column("breaker", Text, nullable=True),
        Column("breaker_at", BigInteger, nullable=True),
        # Operational events: since when the backlog is stale (one backlog.stale an episode).
        Column("stale_since", BigInteger, nullable=True),
        # The getWebhookInfo watch: its lease (the next check is due then, across the
        # cluster), and what the last check saw (Telegram's last_error_date in epoch seconds,
        # its message, pending_update_count, and when).
        Column("webhook_check_due_at", BigInteger, nullable=True),
        Column("webhook_error_date", BigInteger, nullable=True),
        Column("webhook_error_message", Text, nullable=True),
        Column("webhook_pending", BigInteger, nullable=True),
        Column("webhook_checked_at", BigInteger, nullable=True),
        # Long polling (docs/contract.md section 11): the one process polling getUpdates for the
        # bot, its lease, and the offset that confirms what it recorded (the next getUpdates asks
        # it).
        Column("poller", Text, nullable=True),
        Column("poller_until", BigInteger, nullable=True),
        Column("poll_offset", BigInteger, nullable=True),
        PrimaryKeyConstraint("bot", name=f"pk_{bots}"),
        CheckConstraint("rate_per_second > 0", name=f"ck_{bots}_rate"),
    )
    audit = audit_table_name(table)
    audit_table = Table(
        audit,
        metadata,
        Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
        Column("at", BigInteger, nullable=False),
        Column("key_name", Text, nullable=False),
        Column("action", Text, nullable=False),
        Column("target", Text, nullable=False),
        Column("detail", Text, nullable=True),  # JSON: the filter, reason, rate, dry run
        Column("matched", BigInteger, nullable=True),
        Column("changed", BigInteger, nullable=True),
    )
    Index(f"ix_{audit}_at", audit_table.c.at)
    events = events_table_name(table)
    events_table = Table(
        events,
        metadata,
        Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
        Column("type", Text, nullable=False),
        Column("data", Text, nullable=False),  # JSON: the event's own fields
        Column("created_at", BigInteger, nullable=False),
        # The outbox of operational events (operations_url): the next delivery's time (a
        # lease while one runs), failed deliveries so far, and when one succeeded.
        Column("due_at", BigInteger, nullable=True),
        Column("deliveries", Integer, nullable=False, server_default=text("0")),
        Column("delivered_at", BigInteger, nullable=True),
        # Revision 0008: the trace of the update the event tells of (its row's trace_context,
        # copied in the transaction that makes the event); NULL for any other event.
        *([Column("trace_context", Text, nullable=True)] if revision >= "0008" else []),
        # Revision 0009: the update an event tells of (exhaustion.created), so that erasing
        # the update erases its events; NULL for every other event.
        *_event_update_columns(revision),
    )
    if revision >= "0009":
        Index(
            f"ix_{events}_update",
            events_table.c.bot,
            events_table.c.update_id,
            postgresql_where=text("update_id IS NOT NULL"),
            sqlite_where=text("update_id IS NOT NULL"),
        )
    Index(
        f"ix_{events}_due",
        events_table.c.due_at,
        postgresql_where=text("delivered_at IS NULL"),
        sqlite_where=text("delivered_at IS NULL"),
    )


def _event_update_columns(revision: Revision) -> list[Column[Any]]:
    if revision < "0009":
        return []
    return [Column("bot", Text, nullable=True), Column("update_id", BigInteger, nullable=True)]


def _add_access_tables(metadata: MetaData, table: str) -> None:
    """Revision 0005 (who may see what, docs/security.md): the bots each audit entry concerns,
    and the console's sessions."""
    audit_bots = audit_bots_table_name(table)
    Table(
        audit_bots,
        metadata,
        # An entry with no row here concerns every bot (a filter that named none): only a key
        # limited to no bots reads it. An entry is shown to a key limited to some bots when
        # every bot it concerns is one of them.
        Column("audit_id", BigInteger().with_variant(Integer, "sqlite"), nullable=False),
        Column("bot", Text, nullable=False),
        PrimaryKeyConstraint("audit_id", "bot", name=f"pk_{audit_bots}"),
    )
    sessions = sessions_table_name(table)
    sessions_table = Table(
        sessions,
        metadata,
        # SHA-256 of the session's token (the cookie holds the token itself, signed): a reader
        # of this table cannot take over a session.
        Column("id", Text, nullable=False),
        # HMAC of the key's value under the console's secret: a key changed or removed from
        # the configuration no longer matches, which ends its sessions.
        Column("key_digest", Text, nullable=False),
        Column("started_at", BigInteger, nullable=False),
        Column("seen_at", BigInteger, nullable=False),
        PrimaryKeyConstraint("id", name=f"pk_{sessions}"),
    )
    Index(f"ix_{sessions}_seen", sessions_table.c.seen_at)


def _add_privacy_tables(metadata: MetaData, table: str) -> None:
    """Revision 0009 (personal data, docs/privacy.md): erasure jobs and the key registry."""
    erasures = erasures_table_name(table)
    erasures_table = Table(
        erasures,
        metadata,
        Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
        Column("bot", Text, nullable=False),
        Column("kind", Text, nullable=False),
        # The id erased, as the rows store it (a digest with a key ring), and sealed for the
        # erasure.completed event; both NULL once the job is done: no id outlives it here.
        Column("subject", Text, nullable=True),
        Column("subject_sealed", Text, nullable=True),
        Column("dry_run", Integer, nullable=False, server_default=text("0")),
        Column("requested_at", BigInteger, nullable=False),
        Column("requested_by", Text, nullable=False),
        Column("state", Text, nullable=False),
        # The running job's lease (one process at a time) and its cursor: the last update_id
        # it finished, so that a job taken over goes on where it stopped.
        Column("due_at", BigInteger, nullable=False),
        Column("after_update_id", BigInteger, nullable=True),
        Column("updates", BigInteger, nullable=False, server_default=text("0")),
        Column("attempts", BigInteger, nullable=False, server_default=text("0")),
        Column("events", BigInteger, nullable=False, server_default=text("0")),
        Column("finished_at", BigInteger, nullable=True),
        CheckConstraint(
            "kind IN (" + ", ".join(f"'{k}'" for k in ERASURE_KINDS) + ")",
            name=f"ck_{erasures}_kind",
        ),
        CheckConstraint(
            "state IN (" + ", ".join(f"'{s}'" for s in ERASURE_STATES) + ")",
            name=f"ck_{erasures}_state",
        ),
    )
    Index(
        f"ix_{erasures}_due",
        erasures_table.c.due_at,
        postgresql_where=text("state <> 'done'"),
        sqlite_where=text("state <> 'done'"),
    )
    keys = keys_table_name(table)
    Table(
        keys,
        metadata,
        # Every key id any process has sealed values under (registered at its start), and
        # the last count of values under it: a process whose ring lacks a key that may still
        # hold values refuses to start, and a key counted at 0 can leave the ring.
        Column("key_id", Text, nullable=False),
        Column("registered_at", BigInteger, nullable=False),
        Column("counted_at", BigInteger, nullable=True),
        Column("stored_values", BigInteger, nullable=True),
        PrimaryKeyConstraint("key_id", name=f"pk_{keys}"),
    )


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
