"""Telegram's queues (`app.queues`) in SQL: the keys of rows that older code records.

Revision 0006 moved every update to Telegram's own queue. Code older than it keys an update
by its chat or its sender, so during a rolling upgrade an old `serve` would record keys that
no new row shares, and an old worker would deliver a new row past an old one of the same
Telegram queue. So the database keys those rows itself: a trigger, on every row inserted
without `queue_rule` (only code older than 0006 leaves it out), computes the key from the
row's update type and body with the expression below, the same table rendered in SQL. Every
row then carries Telegram's key, whoever recorded it, and the claim (one column compared for
equality, unchanged since 0001) orders old and new processes alike. The revision re-keys the
rows that may still be delivered the same way, in the transaction that installs the trigger.

The expression agrees with `app.queues.queue_of` on every body the intake accepts
(tests/store/test_rekey.py compares them): the type is the row's `update_type`, read by the
same rule by every version; an id counts only as a JSON integer of at most 2^53 - 1 in
magnitude, a poll id only as a canonical decimal int64 string. No body can make it fail (a
trigger that raised would refuse an old process's insert, an UPDATE that raised would stop
the upgrade): a body that is not JSON, or a poll id with an escape that is not text, gets no
key, as the Python table gives none.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable
from typing import TypeVar

from sqlalchemy import (
    JSON,
    BigInteger,
    ColumnElement,
    Numeric,
    Table,
    Text,
    Update,
    and_,
    between,
    case,
    cast,
    func,
    literal,
    literal_column,
    null,
    or_,
    text,
    type_coerce,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect

from app.queues import CATEGORY, MAX_ID, MAX_INT64, MIN_INT64, POLL_ID, QUEUES, Queue
from app.store.schema import NON_TERMINAL, QUEUE_RULE, UNACKNOWLEDGED

K = TypeVar("K", bound=Hashable)
# A JSON integer of at most 16 digits (2^53 - 1 has 16), as the body spells it.
_ID_TEXT = r"^-?[0-9]{1,16}$"


def _groups(by: Callable[[Queue], K]) -> dict[K, list[str]]:
    """The table's update types grouped by what `by` reads of their queue, in table order."""
    groups: dict[K, list[str]] = defaultdict(list)
    for name, queue in QUEUES.items():
        groups[by(queue)].append(name)
    return groups


def sqlite_queue_key(
    update_type: ColumnElement[str], body: ColumnElement[str]
) -> ColumnElement[str]:
    """The queue key of a row with this update type and body, as `app.queues.queue_of`
    computes it: one CASE over the table, NULL for a type it does not name. The JSON path
    starts at the row's own type, one of the table's snake_case names."""
    whens = []
    for (path, category), names in _groups(lambda q: (q.path, q.category)).items():
        at = literal("$.") + update_type + literal("." + ".".join(path))
        kind, value = func.json_type(body, at), func.json_extract(body, at)
        if category is None:
            # CAST takes the longest integer prefix and clamps at int64's ends: only a
            # canonical int64 string comes back as itself.
            canonical = cast(cast(value, BigInteger), Text) == value
            key = case((and_(kind == "text", canonical), value))
        else:
            in_range = between(value, -MAX_ID, MAX_ID)
            key = case((and_(kind == "integer", in_range), cast(value + category * CATEGORY, Text)))
        whens.append((update_type.in_(names), key))
    # A body that is not JSON (never the intake's; a row written by hand) gets no key rather
    # than failing the statement: CASE evaluates a branch only when its condition holds.
    return case((func.json_valid(body) == 1, case(*whens, else_=null())))


def _postgresql_function(name: str) -> str:
    """`name(update_type, body)`, the queue key as `app.queues.queue_of` computes it. The body
    is read as json, not jsonb, and once: the text at the row's path is the body's own (no
    number rewritten), and only a poll id, a string, is decoded. Reading a path decodes every
    string of the body on the way, and PostgreSQL refuses the escape `\\u0000` (which the
    intake keeps): the body is read with each one spelled `\\u0001` instead, the same length
    and still JSON, where no id can hold either. CASE nests so that no cast meets text that is
    not a number; whatever raises anyway (a body that is not JSON, never the intake's) gives
    no key."""
    update_type, body = literal_column("update_type", Text), literal_column("body", Text)
    raw = literal_column("raw", Text)
    backslash = func.chr(92)
    readable = func.replace(body, backslash.concat("u0000"), backslash.concat("u0001"))
    paths = [
        (
            update_type.in_(names),
            cast(func.json_extract_path(cast(readable, JSON), update_type, *path), Text),
        )
        for path, names in _groups(lambda q: q.path).items()
    ]
    keys = []
    for category, names in _groups(lambda q: q.category).items():
        if category is None:
            # A JSON string, decoded (an escape that cannot be text raises: no key).
            digits = type_coerce(cast(raw, JSON).op("#>>")(literal_column("'{}'")), Text)
            in_range = between(cast(digits, Numeric), MIN_INT64, MAX_INT64)
            canonical = and_(raw.like('"%'), digits.regexp_match(f"^({POLL_ID})$"))
            key = case((canonical, case((in_range, digits))))
        else:
            number = cast(raw, BigInteger)
            in_range = between(number, -MAX_ID, MAX_ID)
            plus = cast(number + category * CATEGORY, Text)
            key = case((raw.regexp_match(_ID_TEXT), case((in_range, plus))))
        keys.append((update_type.in_(names), key))
    return f"""
        CREATE FUNCTION {name}(update_type text, body text) RETURNS text
        LANGUAGE plpgsql IMMUTABLE AS $queue_key$
        DECLARE
            raw text;
        BEGIN
            raw := {_compiled(case(*paths), "postgresql")};
            RETURN {_compiled(case(*keys), "postgresql")};
        EXCEPTION WHEN others THEN
            RETURN NULL;
        END
        $queue_key$
        """


def may_be_delivered(t: Table) -> ColumnElement[bool]:
    """Rows a worker may still deliver: the open ones, and the exhaustions a redrive reopens."""
    return or_(text(NON_TERMINAL), text(UNACKNOWLEDGED))


def queue_key_name(table: str) -> str:
    """The name of the trigger, and of PostgreSQL's key function: one name for both."""
    return f"{table}_queue_key"


def rekey(t: Table, dialect: str) -> Update:
    """Revision 0006's re-keying: every row that may still be delivered gets Telegram's key.
    Delivered rows keep the key they were delivered under (their history)."""
    if dialect == "postgresql":
        key: ColumnElement[str] = getattr(func, queue_key_name(t.name))(
            t.c.update_type, t.c.body, type_=Text
        )
    else:
        key = sqlite_queue_key(t.c.update_type, t.c.body)
    return update(t).where(may_be_delivered(t)).values(queue_key=key, queue_rule=QUEUE_RULE)


def trigger_ddl(table: str, dialect: str) -> list[str]:
    """The statements that install the trigger keying rows inserted without `queue_rule`
    (and, on PostgreSQL, the function computing a key, which the re-keying calls too)."""
    name = function = queue_key_name(table)
    if dialect == "postgresql":
        return [
            _postgresql_function(function),
            f"""
            CREATE FUNCTION {function}_on_insert() RETURNS trigger LANGUAGE plpgsql
            SET search_path FROM CURRENT AS $on_insert$
            BEGIN
                NEW.queue_key := {function}(NEW.update_type, NEW.body);
                NEW.queue_rule := {QUEUE_RULE};
                RETURN NEW;
            END
            $on_insert$
            """,
            f"""
            CREATE TRIGGER {name} BEFORE INSERT ON {table}
            FOR EACH ROW WHEN (NEW.queue_rule IS NULL) EXECUTE FUNCTION {function}_on_insert()
            """,
        ]
    # SQLite's BEFORE triggers cannot change NEW: the row is keyed just after, in the same
    # statement (and so the same transaction).
    new_type = literal_column("NEW.update_type", Text)
    new_body = literal_column("NEW.body", Text)
    key = _compiled(sqlite_queue_key(new_type, new_body), dialect)
    return [
        f"""
        CREATE TRIGGER {name} AFTER INSERT ON {table} WHEN NEW.queue_rule IS NULL
        BEGIN
            UPDATE {table} SET queue_key = {key}, queue_rule = {QUEUE_RULE}
             WHERE bot = NEW.bot AND update_id = NEW.update_id;
        END
        """
    ]


def drop_trigger_ddl(table: str, dialect: str) -> list[str]:
    name = function = queue_key_name(table)
    if dialect == "postgresql":
        return [
            f"DROP TRIGGER {name} ON {table}",
            f"DROP FUNCTION {function}_on_insert()",
            f"DROP FUNCTION {function}(text, text)",
        ]
    return [f"DROP TRIGGER {name}"]


def _compiled(expression: ColumnElement[str], dialect: str) -> str:
    compiler: Dialect = (
        postgresql.dialect()  # type: ignore[no-untyped-call]
        if dialect == "postgresql"
        else sqlite.dialect()
    )
    return str(expression.compile(dialect=compiler, compile_kwargs={"literal_binds": True}))
