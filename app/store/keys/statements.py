"""Every statement of the key ring's upkeep (revision 0009, docs/privacy.md): the registry of
key ids, the count of values under each, and the re-encryption's reads and guarded writes.
Each builder is named after the store method that runs it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Insert,
    Select,
    Table,
    Update,
    and_,
    bindparam,
    case,
    func,
    literal,
    not_,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import GenericFunction
from sqlalchemy.types import Text

from app.store.codec import DIGEST_PREFIX, PREFIX
from app.store.predicates import Upsert

NONE = "none"  # what `keys status` calls values stored as they are


class key_id_of(GenericFunction[str]):
    """The key id of a stored value (`enc1:<id>:...`), or 'none' for one stored as it is: the
    text between the prefix and the next colon. Differs by necessity: PostgreSQL splits a
    string by its parts, SQLite has only instr() and substr()."""

    type = Text()
    inherit_cache = True


@compiles(key_id_of, "postgresql")
def _key_id_of_postgresql(element: key_id_of, compiler: SQLCompiler, **kw: Any) -> str:
    (value,) = element.clauses
    found = func.split_part(value, ":", 2)
    return _key_id_case(compiler, value, found, **kw)


@compiles(key_id_of, "sqlite")
def _key_id_of_sqlite(element: key_id_of, compiler: SQLCompiler, **kw: Any) -> str:
    (value,) = element.clauses
    rest = func.substr(value, len(PREFIX) + 1)
    found = func.substr(rest, 1, func.instr(rest, ":") - 1)
    return _key_id_case(compiler, value, found, **kw)


def _key_id_case(compiler: SQLCompiler, value: Any, found: Any, **kw: Any) -> str:
    # Literals, not parameters: GROUP BY repeats the expression, and PostgreSQL matches it to
    # the select list only when both read the same text.
    expression = case((value.like(f"{PREFIX}%"), found), else_=literal(NONE))
    return str(compiler.process(expression, **{**kw, "literal_binds": True}))


def register_key(keys: Table, upsert: Upsert, *, key_id: str, at: int) -> Insert:
    """The key a process seals under, known from its start: a key counted at 0 before and
    sealing again counts as holding values until the next count."""
    insert = upsert(keys).values(key_id=key_id, registered_at=at)
    statement: Insert = insert.on_conflict_do_update(
        index_elements=[keys.c.key_id],
        set_={"counted_at": None, "stored_values": None},
        where=keys.c.stored_values == 0,
    )
    return statement


def keys_holding_values(keys: Table, *, ids: Sequence[str]) -> Select[Any]:
    """The registered key ids outside `ids` that may still hold values (never counted, or
    counted above 0)."""
    holding = or_(keys.c.stored_values.is_(None), keys.c.stored_values > 0)
    return select(keys.c.key_id).where(keys.c.key_id.not_in(list(ids)), holding)


def registered(keys: Table) -> Select[tuple[str]]:
    """Every key id the registry knows, held values or not."""
    return select(keys.c.key_id)


def count_values(table: Table, column: str) -> Select[str, int]:
    """The values of one column by the key id each is sealed under ('none': as it is)."""
    value = table.c[column]
    key_id = key_id_of(value)
    return (
        select(key_id.label("key_id"), func.count().label("stored"))
        .where(value.is_not(None), value != "")
        .group_by(key_id)
    )


def counted(keys: Table, *, key_id: str, stored: int, at: int) -> Update:
    return update(keys).where(keys.c.key_id == key_id).values(stored_values=stored, counted_at=at)


def not_current(value: ColumnElement[str], current: str | None) -> ColumnElement[bool]:
    """A value a re-encryption moves: present, and not sealed under the current key (every
    sealed value when there is none: a ring removed cannot be moved, only read)."""
    present = and_(value.is_not(None), value != "")
    if current is None:
        return literal(False)
    return and_(present, not_(value.like(f"{PREFIX}{current}:%")))


def stale_rows(
    table: Table,
    *,
    key: Sequence[str],
    sealed: Sequence[str],
    read: Sequence[str],
    also: Sequence[ColumnElement[bool]],
    current: str | None,
    after: tuple[Any, ...] | None,
    limit: int,
) -> Select[Any]:
    """The next `limit` rows after the cursor (in `key` order) with a `sealed` value to move,
    or another reason (`also`) for the re-encryption to rewrite them; with the `read`
    columns it needs besides."""
    reasons = [not_current(table.c[column], current) for column in sealed] + list(also)
    key_columns = [table.c[name] for name in key]
    wanted = [c for c in dict.fromkeys([*sealed, *read]) if c not in key]
    statement = select(*key_columns, *(table.c[c] for c in wanted)).where(or_(*reasons))
    if after is not None:
        statement = statement.where(tuple_(*key_columns) > tuple_(*after))
    return statement.order_by(*key_columns).limit(limit)


def rewrite(table: Table, *, key: Sequence[str], columns: Sequence[str]) -> Update:
    """One row's values moved, only if each is still what was read (`old_<column>`): a
    settle, an erasure or a retention between the read and this write wins."""
    rules = [table.c[name] == bindparam(f"key_{name}") for name in key]
    rules += [table.c[c].is_not_distinct_from(bindparam(f"old_{c}")) for c in columns]
    return update(table).where(*rules).values({c: bindparam(f"new_{c}") for c in columns})


def digested(value: ColumnElement[str]) -> ColumnElement[bool]:
    return value.like(f"{DIGEST_PREFIX}%")
