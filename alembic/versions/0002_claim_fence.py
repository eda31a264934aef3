"""A Telegram attempt is fenced by a persisted claim (docs/design.md, decisions 2 and 5).

Adds claim_id (a fresh UUID per claim), exhausted_at and acknowledged_at (a durable exhaustion
is an abandoned row with exhausted_at set until its exact acknowledgement), the index that pages
unacknowledged exhaustions, an index of non-terminal rows in due order (batch claims walk it and
stop at their limit), and on PostgreSQL the ownership function for downstream services that
share the database.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

UNACKNOWLEDGED = "exhausted_at IS NOT NULL AND acknowledged_at IS NULL"
NON_TERMINAL = "state IN ('pending', 'processing', 'failed')"


def _owns_function(table: str) -> str:
    return "telegram_intake_owns" if table == "telegram_updates" else f"{table}_owns"


def upgrade() -> None:
    table = context.config.attributes["table"]
    # Nullable columns without defaults: a plain ALTER TABLE on both backends, rows untouched.
    op.add_column(table, sa.Column("claim_id", sa.Text(), nullable=True))
    op.add_column(table, sa.Column("exhausted_at", sa.BigInteger(), nullable=True))
    op.add_column(table, sa.Column("acknowledged_at", sa.BigInteger(), nullable=True))
    op.create_index(
        f"ix_{table}_due",
        table,
        ["due_at"],
        postgresql_where=sa.text(NON_TERMINAL),
        sqlite_where=sa.text(NON_TERMINAL),
    )
    op.create_index(
        f"ix_{table}_unacknowledged",
        table,
        ["bot", "update_id"],
        postgresql_where=sa.text(UNACKNOWLEDGED),
        sqlite_where=sa.text(UNACKNOWLEDGED),
    )
    if op.get_bind().dialect.name == "postgresql":
        # Lock first, then read the clock: time spent waiting for the lock counts against the
        # lease. Live at exactly due_at, as in the store. The search_path is the one migrating,
        # so the function finds its table whatever the caller's search_path.
        op.execute(
            f"""
            CREATE FUNCTION {_owns_function(table)}(
                bot text, update_id bigint, attempt int, claim_id text
            ) RETURNS boolean LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
            DECLARE
                lease bigint;
            BEGIN
                SELECT t.due_at INTO lease FROM {table} AS t
                 WHERE t.bot = $1 AND t.update_id = $2 AND t.attempts = $3
                   AND t.claim_id = $4 AND t.state = 'processing'
                   FOR UPDATE;
                RETURN FOUND
                   AND lease >= floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
            END
            $$
            """
        )


def downgrade() -> None:
    table = context.config.attributes["table"]
    if not context.is_offline_mode():
        # Revision 0001 cannot hold an exhaustion: refuse rather than lose one.
        open_exhaustions = op.get_bind().scalar(
            sa.text(f"SELECT count(*) FROM {table} WHERE {UNACKNOWLEDGED}")
        )
        if open_exhaustions:
            raise RuntimeError(
                f"{open_exhaustions} unacknowledged exhaustions in {table}: acknowledge them "
                "before downgrading below 0002, or they would be lost"
            )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP FUNCTION {_owns_function(table)}(text, bigint, int, text)")
    op.drop_index(f"ix_{table}_unacknowledged", table_name=table)
    op.drop_index(f"ix_{table}_due", table_name=table)
    # SQLite (3.35+) drops a column in place once no index refers to it; no table copy, so
    # `alembic downgrade --sql` works offline too.
    op.drop_column(table, "acknowledged_at")
    op.drop_column(table, "exhausted_at")
    op.drop_column(table, "claim_id")
