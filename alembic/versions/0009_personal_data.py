"""Personal data: whom each update concerns, erasure jobs, and the key registry.

docs/privacy.md and docs/contract.md section 17. Adds to the updates table `subjects` (every
user and chat id the update names, as stored: keyed digests with a key ring) and `erased_at`
(its body erased, by retention or on request); to `_events` the `bot` and `update_id` of the
update an event tells of, with their index, filled in for the events already recorded; and
two tables beside it: `_erasures` (the durable erasure jobs) and `_keys` (every key id values
were sealed under, and their last count).

Every column is nullable with no default, or has a constant default: on PostgreSQL and SQLite
alike the ALTER TABLEs rewrite nothing, and old processes, which name their columns, keep
recording and delivering. The events' backfill reads their data as JSON, which every event
before this release is: an event whose data is not a JSON object (sealed by this release
before the migration ran) keeps NULLs, and an erasure opens it instead.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-07
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import postgresql

from app.store.schema import erasures_table_name, events_table_name, make_metadata

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def _table() -> str:
    return str(context.config.attributes["table"])


def upgrade() -> None:
    table = _table()
    events = events_table_name(table)
    op.add_column(table, sa.Column("subjects", sa.Text(), nullable=True))
    op.add_column(table, sa.Column("erased_at", sa.BigInteger(), nullable=True))
    op.add_column(events, sa.Column("bot", sa.Text(), nullable=True))
    op.add_column(events, sa.Column("update_id", sa.BigInteger(), nullable=True))
    rows = sa.table(
        events, sa.column("type"), sa.column("data"), sa.column("bot"), sa.column("update_id")
    )
    if op.get_bind().dialect.name == "postgresql":
        document = sa.cast(rows.c.data, postgresql.JSON)
        bot: Any = document["bot"].astext
        update_id: Any = sa.cast(document["update_id"].astext, sa.BigInteger)
        readable: Any = rows.c.data.like("{%")
    else:
        bot = sa.func.json_extract(rows.c.data, "$.bot")
        update_id = sa.func.json_extract(rows.c.data, "$.update_id")
        readable = sa.func.json_valid(rows.c.data)
    op.execute(
        sa.update(rows)
        .where(rows.c.type == "exhaustion.created", readable)
        .values(bot=bot, update_id=update_id)
    )
    metadata = make_metadata(table, "0009")
    op.create_index(
        f"ix_{events}_update",
        events,
        ["bot", "update_id"],
        postgresql_where=sa.text("update_id IS NOT NULL"),
        sqlite_where=sa.text("update_id IS NOT NULL"),
    )
    bind = op.get_bind()
    for name in (erasures_table_name(table), f"{table}_keys"):
        metadata.tables[name].create(bind)


def downgrade() -> None:
    table = _table()
    events = events_table_name(table)
    op.drop_table(f"{table}_keys")
    op.drop_table(erasures_table_name(table))
    op.drop_index(f"ix_{events}_update", table_name=events)
    op.drop_column(events, "update_id")
    op.drop_column(events, "bot")
    op.drop_column(table, "erased_at")
    op.drop_column(table, "subjects")
