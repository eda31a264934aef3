"""Samples: what the processes counted, per bot, destination and minute, for the console's charts.

docs/design.md decision 8. Adds `_samples`, one row per bot, destination and minute: the
updates received, delivered, retried and exhausted, the downstream's answers by class, the
receipt-to-delivery times in buckets, and the backlog as one process sampled it. Nothing else
changes: the release before keeps recording and delivering beside this one, and writes no
samples.

Downgrade drops the table, and the charts' history with it.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-08
"""

from __future__ import annotations

from alembic import context, op

from app.store.schema import make_metadata, samples_table_name

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def _name() -> str:
    return samples_table_name(context.config.attributes["table"])


def upgrade() -> None:
    table = str(context.config.attributes["table"])
    make_metadata(table, "0011").tables[_name()].create(op.get_bind())


def downgrade() -> None:
    op.drop_table(_name())
