"""The tables beside the updates table, each named after it: operator control's (revision
0004), who may see what (0005), personal data's (0009) and the destinations' (0010).
`app.store.schema` draws them with the updates table and re-exports what others import."""

from __future__ import annotations

from typing import Any

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
from sqlalchemy.sql.expression import FromClause

from app.store.types import DELIVERY_STATES

# Rows a worker may still deliver; the ordering index and chat ordering only look at these.
NON_TERMINAL = "state IN ('pending', 'processing', 'failed')"
UNACKNOWLEDGED = "exhausted_at IS NOT NULL AND acknowledged_at IS NULL"
# A delivery's states: every state but `unrouted`, and the updates table's before 0010.
DELIVERY_CHECK = "state IN (" + ", ".join(f"'{s}'" for s in DELIVERY_STATES) + ")"


def partial_index(name: str, *columns: Any, where: str) -> Index:
    """An index of the rows that `where` (SQL) selects, on both backends alike."""
    return Index(name, *columns, postgresql_where=text(where), sqlite_where=text(where))


# Attempt outcomes as `_attempts` records them (NULL while the attempt runs, and for an
# attempt whose lease lapsed before it ended: a reader calls that one "lost").
OUTCOMES = ("completed", "failed", "abandoned", "exhausted", "handed_back", "parked")
OUTCOME_CHECK = "outcome IN (" + ", ".join(f"'{o}'" for o in OUTCOMES) + ")"

# Erasure jobs (revision 0009, docs/privacy.md): what an erasure concerns, and where it is.
ERASURE_KINDS = ("user", "chat", "bot")
ERASURE_STATES = ("pending", "running", "done")


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


def _attempt_columns() -> list[Column[Any]]:
    """An attempt's history after its keys: `_attempts`' (`default`) and, from 0010,
    `_delivery_attempts`' (every other destination)."""
    return [
        Column("attempt", Integer, nullable=False),
        Column("claim_id", Text, nullable=False),
        Column("started_at", BigInteger, nullable=False),
        Column("ended_at", BigInteger, nullable=True),
        Column("outcome", Text, nullable=True),
        Column("status_code", Integer, nullable=True),
        Column("error", Text, nullable=True),
        Column("worker", Text, nullable=True),
    ]


def _control_columns() -> list[Column[Any]]:
    """What operators and workers set on a destination's way after its keys: the pause, the
    rate limit and its token bucket, the breaker. `_bots`' (`default`) and, from 0010,
    `_destinations`' (every other destination)."""
    return [
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
    ]


def add_operator_tables(metadata: MetaData, table: str, *, traced: bool, keyed: bool) -> None:
    """Revision 0004 (operator control): `_attempts`, `_bots`, `_audit`, `_events`; with
    `traced` (0008) the events' trace, with `keyed` (0009) the update each tells of."""
    attempts = attempts_table_name(table)
    Table(
        attempts,
        metadata,
        Column("bot", Text, nullable=False),
        Column("update_id", BigInteger, nullable=False),
        *_attempt_columns(),
        PrimaryKeyConstraint("bot", "update_id", "attempt", name=f"pk_{attempts}"),
        CheckConstraint(OUTCOME_CHECK, name=f"ck_{attempts}_outcome"),
    )
    bots = bots_table_name(table)
    Table(
        bots,
        metadata,
        Column("bot", Text, nullable=False),
        *_control_columns(),
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
        *([Column("trace_context", Text, nullable=True)] if traced else []),
        # Revision 0009: the update an event tells of (exhaustion.created), so that erasing
        # the update erases its events; NULL for every other event.
        *_event_update_columns(keyed),
    )
    if keyed:
        partial_index(
            f"ix_{events}_update",
            events_table.c.bot,
            events_table.c.update_id,
            where="update_id IS NOT NULL",
        )
    partial_index(f"ix_{events}_due", events_table.c.due_at, where="delivered_at IS NULL")


def _event_update_columns(keyed: bool) -> list[Column[Any]]:
    if not keyed:
        return []
    return [Column("bot", Text, nullable=True), Column("update_id", BigInteger, nullable=True)]


def add_access_tables(metadata: MetaData, table: str) -> None:
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


def add_privacy_tables(metadata: MetaData, table: str) -> None:
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
    partial_index(f"ix_{erasures}_due", erasures_table.c.due_at, where="state <> 'done'")
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


def deliveries_table_name(table: str) -> str:
    return f"{table}_deliveries"


def delivery_attempts_table_name(table: str) -> str:
    return f"{table}_delivery_attempts"


def destinations_table_name(table: str) -> str:
    return f"{table}_destinations"


def beside_deliveries(t: FromClause) -> bool:
    """Whether `t` is a deliveries table (revision 0010), not the update's own."""
    return "destination" in t.c


def updates_of(deliveries: Table) -> Table:
    """The update's table beside a deliveries table, from the same metadata."""
    return deliveries.metadata.tables[deliveries.name.removesuffix("_deliveries")]


def add_destination_tables(metadata: MetaData, table: str) -> None:
    """Revision 0010 (docs/design.md decision 7): every destination's deliveries but
    `default`'s, which stay in the update's row. `_deliveries`: one row per (update,
    destination) with the row's delivery columns under their names and its partial indexes;
    `_delivery_attempts`: their attempt history, as `_attempts` is `default`'s;
    `_destinations`: pause, rate and breaker per destination, as `_bots` holds `default`'s.
    Their indexes and constraints are named `_dl_`, so that every name derived from the
    longest table name (40 characters) fits PostgreSQL's 63."""
    deliveries = deliveries_table_name(table)
    rows = Table(
        deliveries,
        metadata,
        Column("bot", Text, nullable=False),
        Column("destination", Text, nullable=False),
        Column("update_id", BigInteger, nullable=False),
        Column("queue_key", Text, nullable=True),  # the update's, as stored; NULL: unordered
        Column("state", Text, nullable=False),
        Column("attempts", Integer, nullable=False),
        Column("uncounted", Integer, nullable=False, server_default=text("0")),
        Column("due_at", BigInteger, nullable=False),
        Column("received_at", BigInteger, nullable=False),  # the update's
        Column("settled_at", BigInteger, nullable=True),
        Column("error", Text, nullable=True),
        Column("claim_id", Text, nullable=True),
        Column("exhausted_at", BigInteger, nullable=True),
        Column("acknowledged_at", BigInteger, nullable=True),
        Column("delivery_due_at", BigInteger, nullable=True),
        Column("deliveries", Integer, nullable=False, server_default=text("0")),
        PrimaryKeyConstraint("bot", "destination", "update_id", name=f"pk_{deliveries}"),
        CheckConstraint(DELIVERY_CHECK, name=f"ck_{deliveries}_state"),
    )
    Index(f"ix_{table}_dl_update", rows.c.bot, rows.c.update_id)
    Index(f"ix_{table}_dl_state_due", rows.c.state, rows.c.due_at)
    partial_index(
        f"ix_{table}_dl_queue",
        rows.c.bot,
        rows.c.destination,
        rows.c.queue_key,
        rows.c.update_id,
        where=NON_TERMINAL,
    )
    partial_index(f"ix_{table}_dl_due", rows.c.due_at, where=NON_TERMINAL)
    partial_index(
        f"ix_{table}_dl_unacknowledged",
        rows.c.bot,
        rows.c.destination,
        rows.c.update_id,
        where=UNACKNOWLEDGED,
    )
    partial_index(f"ix_{table}_dl_delivery_due", rows.c.delivery_due_at, where=UNACKNOWLEDGED)
    attempts = delivery_attempts_table_name(table)
    Table(
        attempts,
        metadata,
        Column("bot", Text, nullable=False),
        Column("destination", Text, nullable=False),
        Column("update_id", BigInteger, nullable=False),
        *_attempt_columns(),
        PrimaryKeyConstraint("bot", "destination", "update_id", "attempt", name=f"pk_{attempts}"),
        CheckConstraint(OUTCOME_CHECK, name=f"ck_{table}_dl_attempts_outcome"),
    )
    destinations = destinations_table_name(table)
    Table(
        destinations,
        metadata,
        Column("bot", Text, nullable=False),
        Column("destination", Text, nullable=False),
        *_control_columns(),
        PrimaryKeyConstraint("bot", "destination", name=f"pk_{destinations}"),
        CheckConstraint("rate_per_second > 0", name=f"ck_{destinations}_rate"),
    )
