"""The statements that exist on SQLite only: its insert and the rows it inserted, batches as
one JSON parameter (`json_each`), the history insert, and `owns` held in the same transaction."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    Insert,
    Select,
    Table,
    Text,
    Update,
    and_,
    bindparam,
    func,
    literal_column,
    select,
    type_coerce,
    update,
)
from sqlalchemy.dialects import sqlite
from sqlalchemy.sql.expression import FromClause

from app.store import history
from app.store.predicates import identity_is, in_state
from app.store.records import statements as records
from app.store.settles import statements as settles
from app.store.types import ClaimIdentity, DeliveryRow, RecordedRow


def add(t: Table) -> Insert:
    """`add_many`'s INSERT over json_each() of the rows (`json_batch`): new keys as pending,
    existing ones skipped (duplicates within the batch too, the first one kept). It returns
    nothing (each row RETURNING gave was a step of the driver's own): the count it inserted
    tells when every key was new, and `inserted` which ones when some were not."""
    return records.add_many(t, _json_batch(records.ADD_COLUMNS), sqlite.insert)


def add_deliveries(d: Table) -> Insert:
    """`add_many`'s INSERT of the new rows' deliveries beside them (revision 0010) over
    json_each() (`delivery_rows`): the caller passes only those of the keys `add` recorded."""
    return records.add_deliveries(d, _json_batch(records.DELIVERY_COLUMNS))


def delivery_rows(deliveries: Sequence[DeliveryRow]) -> dict[str, str]:
    """The parameter of `add_deliveries` for these deliveries."""
    columns = records.DELIVERY_COLUMNS
    return json_batch(columns, [dict(zip(columns, row, strict=True)) for row in deliveries])


def inserted(t: Table) -> Select[Any]:
    """The keys of `add`'s rows (the same parameter) whose rows have a rowid above `after`.
    SQLite gives a new row the rowid one above the table's largest, so the rows one INSERT adds
    (holding the write lock) are the last `count` rowids up to `last_insert_rowid()`: with
    `after` their first minus one, these are the keys the INSERT recorded."""
    rowid = literal_column(f"{t.name}.rowid", BigInteger)
    after = bindparam("after", type_=BigInteger)
    return records.recorded(t, _json_batch(records.KEY_COLUMNS)).where(rowid > after)


def add_rows(rows: Sequence[RecordedRow]) -> dict[str, str]:
    """The parameter of `add` for these rows."""
    columns = records.ADD_COLUMNS
    return json_batch(columns, [{name: getattr(row, name) for name in columns} for row in rows])


def _json_batch(columns: dict[str, Any]) -> FromClause:
    """Rows passed as one JSON array of arrays (the parameter `batch`, `json_batch`), as the
    derived table `batch(columns...)`: SQLite's unnest(). One statement, whatever the size."""
    each = func.json_each(bindparam("batch", "[]", Text)).table_valued("value")
    return select(
        *(
            type_coerce(func.json_extract(each.c.value, f"$[{i}]"), kind).label(name)
            for i, (name, kind) in enumerate(columns.items())
        )
    ).subquery("batch")


def settle_many_owned(t: Table) -> Update:
    """`settles.settle_many_owned` over json_each() of the settlements (`json_batch` of
    `settles.settle_rows`)."""
    return settles.settle_many_owned(t, _json_batch(settles.SETTLE_COLUMNS))


def json_batch(columns: dict[str, Any], rows: Sequence[dict[str, Any]]) -> dict[str, str]:
    """The parameter of `_json_batch` for these rows."""
    array = [[row[name] for name in columns] for row in rows]
    return {"batch": json.dumps(array, ensure_ascii=False, separators=(",", ":"))}


def history_insert(attempts: Table) -> Any:
    """The executemany insert of the attempts a claim started (`history.start_rows`)."""
    return history.insert_started(attempts, sqlite.insert)


def hold_owned(t: Table, *, identity: ClaimIdentity) -> Update:
    """`owns` inside a caller's transaction: a no-op write of the identity's leased row, which
    takes the one write lock until that transaction ends (a SELECT would take none). It returns
    the lease; `held` compares it with the clock read after the statement, so time spent
    waiting for the lock counts against the lease (as in the PostgreSQL function)."""
    leased = and_(identity_is(t, identity), in_state(t.c.state, "processing"))
    return update(t).where(leased).values(due_at=t.c.due_at).returning(t.c.due_at)


def held(row: Any) -> bool:
    """Whether `hold_owned`'s row proves a live lease now (live at exactly due_at)."""
    return row is not None and row[0] >= time.time_ns() // 1_000_000
