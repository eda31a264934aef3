"""Tracing: the trace each update belongs to, kept with its row.

Adds `trace_context`: the W3C `traceparent` of the intake's span for the request that recorded
the update (docs/contract.md section 15), so that each attempt, in whichever worker process,
joins the update's trace. NULL when tracing was off at the intake, and for every row recorded
before this revision: such an update's attempts begin traces of their own.

A nullable column with no default: on PostgreSQL and SQLite alike the ALTER TABLE rewrites
nothing, and old processes, which name their columns, keep inserting and claiming.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        context.config.attributes["table"], sa.Column("trace_context", sa.Text(), nullable=True)
    )


def downgrade() -> None:
    op.drop_column(context.config.attributes["table"], "trace_context")
