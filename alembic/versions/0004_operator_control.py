"""Operator control (docs/contract.md section 9): attempt history, bot controls, the audit log,
search.

Adds four tables beside the updates table, each named after it: `_attempts` (one row per
attempt: its claim, start and end, outcome, HTTP status, error excerpt and worker; kept as
long as its update), `_bots` (pause, the rate limit and the token bucket every worker process
shares, the last breaker transition a worker reported, the backlog and webhook watches),
`_audit` (every operator action, by key name) and `_events` (the outbox of operational events
to `operations_url`). On the updates table, the indexes that operators' searches walk: newest first
within a bot, within a chat, within an update type.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import context, op

from app.store.schema import make_metadata

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

SUFFIXES = ("_attempts", "_bots", "_audit", "_events")
SEARCH_INDEXES = {
    "received": ["bot", "received_at", "update_id"],
    "chat": ["bot", "queue_key", "received_at", "update_id"],
    "type": ["bot", "update_type", "received_at", "update_id"],
}


def upgrade() -> None:
    table = context.config.attributes["table"]
    # The new tables exactly as the metadata draws them (one source of truth); nothing to
    # backfill: attempts before this revision left no history, no bot is paused or limited.
    metadata = make_metadata(table, "0004")
    bind = op.get_bind()
    for suffix in SUFFIXES:
        metadata.tables[table + suffix].create(bind)
    # On a large PostgreSQL table an index build holds off the intake's inserts while it runs:
    # build them first with CREATE INDEX CONCURRENTLY (docs/store.md, "Upgrading a large
    # table to 0004"), and this keeps them.
    for name, columns in SEARCH_INDEXES.items():
        op.create_index(f"ix_{table}_{name}", table, columns, if_not_exists=True)


def downgrade() -> None:
    # The updates themselves are untouched: what goes is their history, the bots' pause and
    # rate limits (every paused bot delivers again), the audit log and undelivered events.
    table = context.config.attributes["table"]
    for name in SEARCH_INDEXES:
        op.drop_index(f"ix_{table}_{name}", table_name=table)
    for suffix in reversed(SUFFIXES):
        op.drop_table(table + suffix)
