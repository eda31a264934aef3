"""The alias of a claim's walks that SQLite reads through the queue index (`INDEXED BY`):
the update table's `ix_<table>_queue`, or the deliveries table's `ix_<table>_dl_queue`."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import Alias, Table
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler

from app.store.schema_beside import beside_deliveries, updates_of


class _ByQueueIndex(Alias):
    """An alias of the table that SQLite reads through ix_queue (`INDEXED BY`). On a small
    table SQLite's planner may otherwise build an automatic index for the statement, or walk
    the primary key and sort: a pass over the whole table. PostgreSQL renders a plain alias."""

    inherit_cache = True


@compiles(_ByQueueIndex, "sqlite")
def _by_queue_index_sqlite(element: _ByQueueIndex, compiler: SQLCompiler, **kw: Any) -> str:
    rendered: str = compiler.visit_alias(element, **kw)  # type: ignore[no-untyped-call]
    if not kw.get("asfrom"):
        return rendered
    # schema.make_metadata's name for the index (add_destination_tables' on the deliveries
    # table); the table name is validated.
    table = cast(Table, element.element)
    if beside_deliveries(table):
        return f"{rendered} INDEXED BY ix_{updates_of(table).name}_dl_queue"
    return f"{rendered} INDEXED BY ix_{table.name}_queue"


def by_queue_index(t: Table, name: str) -> Alias:
    return _ByQueueIndex._construct(t, name=name)
