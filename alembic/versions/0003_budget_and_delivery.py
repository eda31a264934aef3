"""Hand-backs spend no attempt; each exhaustion is delivered once across the cluster.

Adds `uncounted` (attempts that spend none of the budget: a worker that stopped mid-request
handed them back; a claim takes a row while `attempts - uncounted < max_attempts`), and
`delivery_due_at` and `deliveries` (when an open exhaustion's next delivery to
`exhaustion_url` may start, and how many have failed so far: the delivery lease and the
backoff live in the database, shared by every process and kept over a restart), with the
index that finds the open exhaustions due for delivery.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

UNACKNOWLEDGED = "exhausted_at IS NOT NULL AND acknowledged_at IS NULL"


def upgrade() -> None:
    table = context.config.attributes["table"]
    # A constant default: PostgreSQL (11+) adds the column without rewriting the table, and
    # SQLite's ADD COLUMN never rewrites it.
    zero = sa.text("0")
    op.add_column(table, sa.Column("uncounted", sa.Integer(), nullable=False, server_default=zero))
    op.add_column(table, sa.Column("delivery_due_at", sa.BigInteger(), nullable=True))
    op.add_column(table, sa.Column("deliveries", sa.Integer(), nullable=False, server_default=zero))
    # The open exhaustions of 0002 are due for delivery now, as they were before.
    op.execute(f"UPDATE {table} SET delivery_due_at = exhausted_at WHERE {UNACKNOWLEDGED}")
    op.create_index(
        f"ix_{table}_delivery_due",
        table,
        ["delivery_due_at"],
        postgresql_where=sa.text(UNACKNOWLEDGED),
        sqlite_where=sa.text(UNACKNOWLEDGED),
    )


def downgrade() -> None:
    # Nothing accepted is lost: attempts handed back count against the budget again, and
    # delivery forgets its backoff (each process keeps its own, as before 0003).
    table = context.config.attributes["table"]
    op.drop_index(f"ix_{table}_delivery_due", table_name=table)
    op.drop_column(table, "deliveries")
    op.drop_column(table, "delivery_due_at")
    op.drop_column(table, "uncounted")
