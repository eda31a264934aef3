"""Tracing: an operational event about an update joins the update's trace.

Adds `trace_context` to the outbox of operational events (`_events`, revision 0004): the
update's own (revision 0007), copied in the transaction that makes the event, for the events
that tell of one update (exhaustion.created). Its delivery to `operations_url` is then a span
of that update's trace (docs/contract.md section 15). NULL for every other event, and for
every event written before this revision.

A nullable column with no default: on PostgreSQL and SQLite alike the ALTER TABLE rewrites
nothing, and old processes, which name their columns, keep writing events.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

from app.store.schema import events_table_name

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def _events() -> str:
    return events_table_name(context.config.attributes["table"])


def upgrade() -> None:
    op.add_column(_events(), sa.Column("trace_context", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column(_events(), "trace_context")
