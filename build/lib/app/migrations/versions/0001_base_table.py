"""The base table: one row per (bot, update_id), its state, attempts and times.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

STATES = "state IN ('pending', 'processing', 'completed', 'failed', 'abandoned')"
NON_TERMINAL = "state IN ('pending', 'processing', 'failed')"


def upgrade() -> None:
    table = context.config.attributes["table"]
    op.create_table(
        table,
        sa.Column("bot", sa.Text(), nullable=False),
        sa.Column("update_id", sa.BigInteger(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("update_type", sa.Text(), nullable=True),
        sa.Column("queue_key", sa.Text(), nullable=True),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("due_at", sa.BigInteger(), nullable=False),
        sa.Column("received_at", sa.BigInteger(), nullable=False),
        sa.Column("settled_at", sa.BigInteger(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("bot", "update_id", name=f"pk_{table}"),
        sa.CheckConstraint(STATES, name=f"ck_{table}_state"),
    )
    op.create_index(f"ix_{table}_state_due", table, ["state", "due_at"])
    op.create_index(
        f"ix_{table}_queue",
        table,
        ["bot", "queue_key", "update_id"],
        postgresql_where=sa.text(NON_TERMINAL),
        sqlite_where=sa.text(NON_TERMINAL),
    )


def downgrade() -> None:
    table = context.config.attributes["table"]
    op.drop_index(f"ix_{table}_queue", table_name=table)
    op.drop_index(f"ix_{table}_state_due", table_name=table)
    op.drop_table(table)
