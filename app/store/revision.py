"""The live schema's revision, read from the database, and what each revision serves."""

from __future__ import annotations

from sqlalchemy import inspect
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.errors import UPGRADE_HINT, SchemaError, translated_errors
from app.store.schema import (
    BESIDE_WIDENED,
    DEFAULT_TABLE,
    HEAD,
    Revision,
    make_metadata,
    revision_of,
)
from app.store.types import Capability

_LEVELS: dict[Capability, int] = {"base": 0, "fenced": 1, "durable": 2}


_BASE_COLUMNS = frozenset(make_metadata(revision="0001").tables[DEFAULT_TABLE].c.keys())


def capability_of(revision: Revision) -> Capability:
    """What a table at `revision` serves. Fenced and durable bots need the head revision: a
    table below it serves `plain` bots until `alembic upgrade head` (one code path per level,
    not one per revision)."""
    return "durable" if revision == HEAD else "base"


def _inspect(connection: Connection, table: str) -> Revision:
    inspector = inspect(connection)
    if not inspector.has_table(table):
        raise SchemaError(f"table {table!r} does not exist; {UPGRADE_HINT}")
    columns = {column["name"] for column in inspector.get_columns(table)}
    missing = _BASE_COLUMNS - columns
    if missing:
        raise SchemaError(f"table {table!r} lacks {sorted(missing)}; {UPGRADE_HINT}")
    # The tables of the connection's default schema: where an unqualified name resolves.
    tables = set(inspector.get_table_names())
    beside = {
        suffix: {column["name"] for column in inspector.get_columns(table + suffix)}
        for suffix in BESIDE_WIDENED
        if table + suffix in tables
    }
    return revision_of(columns, tables, table, beside)


async def read_revision(engine: AsyncEngine, table: str) -> Revision:
    """The revision of the live schema, by the table's columns and the tables beside it;
    SchemaError when the table is missing or incomplete."""
    with translated_errors(table):
        async with engine.connect() as connection:
            return await connection.run_sync(_inspect, table)


async def read_capability(engine: AsyncEngine, table: str) -> Capability:
    """The highest level the live table serves; SchemaError when it is missing or incomplete."""
    return capability_of(await read_revision(engine, table))
