"""Destinations: every delivery but `default`'s, beside the update's row.

docs/design.md decision 7 and docs/contract.md section 18. Destination `default`'s delivery
stays in the update's row, as it is: this revision moves no delivery state, so every open row
keeps its attempt count, `claim_id`, lease and due time, and the release before keeps
recording and delivering beside this one. It adds:
- the state `unrouted` to the updates table's CHECK: a row that holds no delivery, since its
  update does not go to `default`. PostgreSQL swaps the constraint (added NOT VALID, then
  validated: writers wait for the swap, not for the scan). SQLite keeps a table's CHECK in the
  table's SQL text; a constraint that only widens is rewritten there in place, as SQLite's
  documentation gives for changes that leave every stored row valid (`writable_schema`, and
  the schema version raised so that every connection reads it again): no copy of the table;
- `_deliveries`, `_delivery_attempts` and `_destinations`: the other destinations'
  deliveries, their attempt history and their pause, rate and breaker;
- on PostgreSQL, the five-argument ownership function (`bot, destination, update_id, attempt,
  claim_id`), beside the four-argument one, which keeps meaning `default`.

Downgrade refuses while a delivery beside the rows is open or any row is `unrouted`: revision
0009 could hold neither. It drops the other destinations' history and controls with them.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

from app.store.schema import (
    DELIVERY_CHECK,
    STATE_CHECK,
    deliveries_table_name,
    delivery_attempts_table_name,
    destinations_table_name,
    make_metadata,
    owns_function_name,
)

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def _table() -> str:
    return str(context.config.attributes["table"])


def _beside(table: str) -> tuple[str, ...]:
    return (
        deliveries_table_name(table),
        delivery_attempts_table_name(table),
        destinations_table_name(table),
    )


def _state_check(table: str, old: str, new: str) -> None:
    """The updates table's CHECK on `state`, from `old` to `new`."""
    name = f"ck_{table}_state"
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
        op.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} CHECK ({new}) NOT VALID")
        op.execute(f"ALTER TABLE {table} VALIDATE CONSTRAINT {name}")
        return
    query = "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?"
    sql = str(bind.exec_driver_sql(query, (table,)).scalar_one())
    found = sql.count(f"CHECK ({old})")
    if found != 1:
        raise RuntimeError(
            f"{table}: expected its state CHECK once in its schema, found it {found} times; "
            "was the table changed by hand?"
        )
    version = int(bind.exec_driver_sql("PRAGMA schema_version").scalar_one())
    bind.exec_driver_sql("PRAGMA writable_schema = ON")
    bind.exec_driver_sql(
        "UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = ?",
        (sql.replace(f"CHECK ({old})", f"CHECK ({new})"), table),
    )
    bind.exec_driver_sql(f"PRAGMA schema_version = {version + 1}")
    bind.exec_driver_sql("PRAGMA writable_schema = OFF")


def _owns_function(table: str) -> str:
    """The five-argument ownership function: `default` asks the four-argument one (the
    update's row); any other destination its row of `_deliveries`. Lock first, then read the
    clock, as the four-argument one does."""
    owns, deliveries = owns_function_name(table), deliveries_table_name(table)
    return f"""
        CREATE FUNCTION {owns}(
            bot text, destination text, update_id bigint, attempt int, claim_id text
        ) RETURNS boolean LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
        DECLARE
            lease bigint;
        BEGIN
            IF $2 = 'default' THEN
                RETURN {owns}($1, $3, $4, $5);
            END IF;
            SELECT d.due_at INTO lease FROM {deliveries} AS d
             WHERE d.bot = $1 AND d.destination = $2 AND d.update_id = $3
               AND d.attempts = $4 AND d.claim_id = $5 AND d.state = 'processing'
               FOR UPDATE;
            RETURN FOUND
               AND lease >= floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
        END
        $$
    """


def upgrade() -> None:
    table = _table()
    _state_check(table, DELIVERY_CHECK, STATE_CHECK)
    metadata = make_metadata(table, "0010")
    bind = op.get_bind()
    for name in _beside(table):
        metadata.tables[name].create(bind)
    if bind.dialect.name == "postgresql":
        op.execute(_owns_function(table))


def downgrade() -> None:
    table = _table()
    if not context.is_offline_mode():
        bind = op.get_bind()
        deliveries = deliveries_table_name(table)
        kept = bind.scalar(sa.text(f"SELECT count(*) FROM {deliveries}"))
        unrouted = bind.scalar(sa.text(f"SELECT count(*) FROM {table} WHERE state = 'unrouted'"))
        if kept or unrouted:
            raise RuntimeError(
                f"{kept} deliveries to destinations other than default, and "
                f"{unrouted} updates that do not go to default, in {table}: revision 0009 "
                "holds neither. Remove the other destinations, let their deliveries finish "
                "and be pruned (or forget them), then downgrade"
            )
    if op.get_bind().dialect.name == "postgresql":
        owns = owns_function_name(table)
        op.execute(f"DROP FUNCTION {owns}(text, text, bigint, int, text)")
    for name in reversed(_beside(table)):
        op.drop_table(name)
    _state_check(table, STATE_CHECK, DELIVERY_CHECK)
