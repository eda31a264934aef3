"""The table, as SQLAlchemy Core metadata: the one source of truth that Alembic compares against.

Revision 0001 is the base shape; revision 0002 (ADR 0256) adds `claim_id`, `exhausted_at`,
`acknowledged_at`, the exhaustion index and the due-order index that batch claims walk;
revision 0003 adds `uncounted` (attempts that spend no budget: hand-backs), and
`delivery_due_at` and `deliveries` (an open exhaustion's next delivery to `exhaustion_url`
and the failed ones so far, shared by every process) with their index.
`make_metadata(table, revision=...)` draws any of them.

Invariants every statement of the store keeps (its queries lean on them for index use; a
process writing the table by other means must keep them too):
- a pending row's `due_at` is its `received_at`;
- a row with `settled_at` has `due_at == settled_at`;
- `exhausted_at` is set only on `abandoned` rows, which no statement moves to another state;
- an open exhaustion (`exhausted_at` set, `acknowledged_at` NULL) has `delivery_due_at` set.
"""

from __future__ import annotations

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
from app.store.types import STATES

DEFAULT_TABLE = "telegram_updates"
Revision = Literal["0001", "0002", "0003"]
HEAD: Revision = "0003"
# The columns each revision adds, in order: `revision_of` reads a live table by them.
ADDED_COLUMNS: dict[Revision, tuple[str, ...]] = {
    "0002": ("claim_id", "exhausted_at", "acknowledged_at"),
    "0003": ("uncounted", "delivery_due_at", "deliveries"),
}

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


def make_metadata(table: str = DEFAULT_TABLE, revision: Revision = HEAD) -> MetaData:
    """Metadata holding the updates table as it stands at `revision`."""
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
    return metadata


def revision_of(columns: set[str]) -> Revision:
    """The revision whose columns the live table has (the highest complete one)."""
    present: Revision = "0001"
    for revision, added in ADDED_COLUMNS.items():
        if not set(added) <= columns:
            break
        present = revision
    return present


def make_table(table: str = DEFAULT_TABLE, revision: Revision = HEAD) -> Table:
    return make_metadata(table, revision).tables[table]
