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

import json
from typing import Any

import sqlalchemy as sa
from alembic import context, op

from app.store.rekey import drop_trigger_ddl, may_be_delivered, rekey, trigger_ddl
from app.store.schema import make_table

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

BATCH = 1_000


def upgrade() -> None:
    table = context.config.attributes["table"]
    dialect = op.get_bind().dialect.name
    op.add_column(table, sa.Column("queue_rule", sa.Integer(), nullable=True))
    for statement in trigger_ddl(table, dialect):
        op.execute(statement)
    op.execute(rekey(make_table(table, "0006"), dialect))


def downgrade() -> None:
    # The release before 0006 keys updates by chat or sender: the rows that may still be
    # delivered go back to those keys, so that the rows its serves record next queue behind
    # them. Delivered rows keep their keys (their history).
    table = context.config.attributes["table"]
    bind = op.get_bind()
    for statement in drop_trigger_ddl(table, bind.dialect.name):
        op.execute(statement)
    t = make_table(table, "0006")
    rows = bind.execute(
        sa.select(t.c.bot, t.c.update_id, t.c.update_type, t.c.body).where(may_be_delivered(t))
    ).all()
    keys = [
        {"b_bot": row.bot, "b_update_id": row.update_id, "key": _key_before_0006(row)}
        for row in rows
    ]
    rekey = (
        sa.update(t)
        .where(t.c.bot == sa.bindparam("b_bot"), t.c.update_id == sa.bindparam("b_update_id"))
        .values(queue_key=sa.bindparam("key"))
    )
    for start in range(0, len(keys), BATCH):
        bind.execute(rekey, keys[start : start + BATCH])
    op.drop_column(table, "queue_rule")


# The key of the release before 0006: the chat of these types, the sender of those, a poll
# answer's voter (an anonymous chat's vote: that chat).
_CHAT_KEYED = frozenset(
    [
        "message",
        "edited_message",
        "channel_post",
        "edited_channel_post",
        "business_message",
        "edited_business_message",
        "deleted_business_messages",
        "message_reaction",
        "message_reaction_count",
        "chat_member",
        "my_chat_member",
        "chat_join_request",
        "chat_boost",
        "removed_chat_boost",
    ]
)
_SENDER_KEYED = frozenset(
    [
        "callback_query",
        "inline_query",
        "chosen_inline_result",
        "shipping_query",
        "pre_checkout_query",
    ]
)


def _key_before_0006(row: Any) -> str | None:
    try:
        update = json.loads(row.body)
    except ValueError:
        return None
    payload = update.get(row.update_type) if isinstance(update, dict) else None
    if not isinstance(payload, dict):
        return None
    if row.update_type in _CHAT_KEYED:
        holder = payload.get("chat")
    elif row.update_type in _SENDER_KEYED:
        holder = payload.get("from")
    elif row.update_type == "poll_answer":
        holder = payload.get("voter_chat", payload.get("user"))
    else:
        return None
    value = holder.get("id") if isinstance(holder, dict) else None
    if type(value) is not int or not -(2**63) <= value < 2**63:
        return None
    return str(value)
