"""Telegram's own queues: every update keyed by the Bot API server's webhook queue.

Until now an update's queue_key was its chat or its sender; from this revision it is the queue
id Telegram's server gives it (`app.queues`, docs/telegram-queues.md). The revision:
- adds `queue_rule`, which this code sets on every row it records (NULL: a row recorded by
  code older than this revision);
- installs a trigger that keys, on insert, every row recorded without `queue_rule`, from its
  update type and body (`app.store.rekey`): while old and new processes run side by side, an
  old `serve` records Telegram's keys too, and an old worker's claim (equality of queue_key,
  unchanged since 0001) orders them as a new one does;
- re-keys every row that may still be delivered (open, or an exhaustion a redrive reopens);
  delivered rows keep the key they were delivered under.

All of it in the migration's one transaction: on PostgreSQL the new column's ALTER TABLE
holds off every insert and claim until the commit, so no row is recorded or claimed under the
old keys once the re-keying has read the table.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

from app.store.rekey import drop_trigger_ddl, rekey, trigger_ddl
from app.store.schema import make_table

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    table = context.config.attributes["table"]
    dialect = op.get_bind().dialect.name
    op.add_column(table, sa.Column("queue_rule", sa.Integer(), nullable=True))
    for statement in trigger_ddl(table, dialect):
        op.execute(statement)
    op.execute(rekey(make_table(table, "0006"), dialect))


def downgrade() -> None:
    # The keys stay Telegram's: code older than 0006 compares them for equality only, and so
    # keeps Telegram's order with them.
    table = context.config.attributes["table"]
    for statement in drop_trigger_ddl(table, op.get_bind().dialect.name):
        op.execute(statement)
    op.drop_column(table, "queue_rule")
