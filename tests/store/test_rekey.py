"""Revision 0006's keys in SQL agree with `app.queues` on every body the intake accepts.

Code older than 0006 records rows without `queue_rule`; the database keys them on insert
(`app.store.rekey`), and the revision re-keys the rows that may still be delivered. Both run
the table rendered in SQL, so both are compared here with the Python table, row by row, over
every update type and every shape an id can take in a body: integers at and past the bounds,
negative zero, fractions, exponents, strings, booleans, nulls, missing and misplaced objects,
escapes that a decoding reader would trip on; and bodies that are not JSON at all.
"""

from __future__ import annotations

import json
import random
from typing import Any

from sqlalchemy import text

from app.http.strict_json import read_json
from app.intake.updates import classify
from app.queues import MAX_ID, QUEUES
from app.store.engine import create_sync_engine
from app.store.migrate import downgrade, upgrade
from app.store.schema import DEFAULT_TABLE, QUEUE_RULE
from tests.conftest import Storage

TABLE = DEFAULT_TABLE
NOW = 1_800_000_000_000

# What may stand where an id is read, as JSON text.
ID_SHAPES = [
    "0", "-0", "1", "-1", "42", "123456789", "-1001234567890", "7012345678",
    str(MAX_ID), str(-MAX_ID), str(MAX_ID + 1), str(-MAX_ID - 1), str(2**63 - 1), str(-(2**63)),
    str(2**63), "99999999999999999999", "1.0", "42.5", "1e3", "-1E2", "0.0",
    '"42"', '"-1001234567890"', "true", "false", "null", "[]", "{}", '"\\u0000"', '"4\\u0032"',
]  # fmt: skip
POLL_ID_SHAPES = [
    '"0"', '"5404452365627555840"', '"-5404452365627555840"', '"9223372036854775807"',
    '"-9223372036854775808"', '"9223372036854775808"', '"-9223372036854775809"', '"007"', '"-0"',
    '"12a"', '""', '" 12"', '"+12"', '"1e3"', '"12.0"', '"\\u0031\\u0032"', '"\\u0000"', "12",
    "12.5", "true", "null", "[]", "{}",
]  # fmt: skip


def _object(path: tuple[str, ...], value: str) -> str:
    """JSON text of nested objects holding `value` (JSON text) at `path`."""
    for field in reversed(path):
        value = f'{{"{field}": {value}, "other": 1}}'
    return value


def corpus() -> list[str]:
    """Bodies of every update type with every shape at its id's path, misplaced objects, and
    a random sample of realistic ids: each one a body the intake accepts."""
    bodies: list[str] = []
    for update_type, queue in QUEUES.items():
        shapes = POLL_ID_SHAPES if queue.category is None else ID_SHAPES
        for shape in shapes:
            payload = _object(queue.path, shape)
            bodies.append(f'{{"update_id": 1, "{update_type}": {payload}}}')
        # The objects along the path missing, or not objects.
        for cut in range(len(queue.path)):
            for misplaced in ("null", "[1, 2]", '"chat"', "7", "{}"):
                payload = _object(queue.path[:cut], misplaced)
                bodies.append(f'{{"update_id": 1, "{update_type}": {payload}}}')
        # Escapes elsewhere in the body, `\\u0000` first (PostgreSQL's json refuses it).
        payload = _object(queue.path, '"5404452365627555840"' if queue.category is None else "42")
        escaped = '"\\u0000 \\u00e9 \\ud83d\\ude80 \\"q\\" \\\\u0000"'
        bodies.append(f'{{"update_id": 1, "{update_type}": {payload}, "text": {escaped}}}')
        # Whitespace around the id, as a hand-written body may hold it.
        spaced = _object(queue.path, " 42 " if queue.category is not None else ' "42" ')
        bodies.append(f'{{"update_id": 1, "{update_type}":\n {spaced} }}')
    rng = random.Random(20261203)
    names = list(QUEUES)
    for _ in range(400):
        update_type = rng.choice(names)
        queue = QUEUES[update_type]
        if queue.category is None:
            value = json.dumps(str(rng.randint(-(2**63), 2**63 - 1)))
        else:
            value = str(rng.choice([rng.randint(1, 2**40), -rng.randint(1, 10**13)]))
        bodies.append(
            json.dumps({"update_id": 1, update_type: json.loads(_object(queue.path, value))})
        )
    # Types the table does not know, and a body of the update_id alone.
    bodies.append('{"update_id": 1, "subscription": {"chat": {"id": 42}}}')
    bodies.append('{"update_id": 1}')
    return bodies


CORPUS = corpus()


def _expected(body: str) -> tuple[str | None, str | None]:
    return classify(read_json(body.encode())[1])


def _rows(bodies: list[str], start: int = 1) -> list[dict[str, Any]]:
    """Rows as code older than 0006 records them: its own key, no queue_rule."""
    rows = []
    for update_id, body in enumerate(bodies, start):
        update_type, _ = _expected(body)
        rows.append(
            {
                "bot": "shop",
                "update_id": update_id,
                "body": body,
                "update_type": update_type,
                "queue_key": "old-key",
                "state": "pending",
                "attempts": 0,
                "due_at": NOW,
                "received_at": NOW,
            }
        )
    return rows


def _insert_as_old_code(url: str, rows: list[dict[str, Any]]) -> None:
    names = ", ".join(rows[0])
    values = ", ".join(f":{name}" for name in rows[0])
    engine = create_sync_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(text(f"INSERT INTO {TABLE} ({names}) VALUES ({values})"), rows)
    finally:
        engine.dispose()


def _keys(url: str) -> dict[int, tuple[str | None, int | None]]:
    engine = create_sync_engine(url)
    try:
        with engine.connect() as connection:
            result = connection.execute(
                text(f"SELECT update_id, queue_key, queue_rule FROM {TABLE} ORDER BY update_id")
            )
            return {row.update_id: (row.queue_key, row.queue_rule) for row in result}
    finally:
        engine.dispose()


def test_the_corpus_is_what_the_intake_accepts_and_covers_every_type() -> None:
    seen = set()
    for body in CORPUS:
        _, update = read_json(body.encode())  # raises on a body the intake would refuse
        assert isinstance(update, dict)
        seen.add(next((key for key in update if key != "update_id"), None))
    assert set(QUEUES) <= seen
    keyed = [body for body in CORPUS if _expected(body)[1] is not None]
    unkeyed = [body for body in CORPUS if _expected(body)[1] is None]
    # Both outcomes well represented.
    assert len(keyed) > 300
    assert len(unkeyed) > 300


def test_a_row_recorded_by_older_code_gets_telegrams_key_on_insert(storage: Storage) -> None:
    url = storage.url()
    _insert_as_old_code(url, _rows(CORPUS))
    keys = _keys(url)
    wrong = [
        (body, keys[update_id][0], _expected(body)[1])
        for update_id, body in enumerate(CORPUS, 1)
        if keys[update_id][0] != _expected(body)[1]
    ]
    assert wrong == []
    assert {rule for _, rule in keys.values()} == {QUEUE_RULE}


def test_a_row_recorded_with_queue_rule_keeps_its_key(storage: Storage) -> None:
    """The trigger leaves alone what this code records: its key is already Telegram's."""
    url = storage.url()
    rows = _rows(CORPUS[:50])
    for row in rows:
        row["queue_rule"] = QUEUE_RULE
    _insert_as_old_code(url, rows)
    assert {key for key, _ in _keys(url).values()} == {"old-key"}


def test_0006_rekeys_the_rows_that_may_still_be_delivered(storage: Storage) -> None:
    url = storage.url("0005")
    open_rows = _rows(CORPUS)
    states = ["pending", "processing", "failed"]
    for i, row in enumerate(open_rows):
        row["state"] = states[i % 3]
    closed = _rows(CORPUS[:60], start=len(CORPUS) + 1)
    for i, row in enumerate(closed):
        row["state"] = "completed" if i % 2 else "abandoned"
        row["settled_at"] = NOW
    # An exhaustion not yet acknowledged (a redrive reopens it) and one acknowledged.
    closed[0].update(state="abandoned", exhausted_at=NOW, acknowledged_at=None)
    closed[1].update(state="abandoned", exhausted_at=NOW, acknowledged_at=NOW)
    _insert_as_old_code(url, open_rows)
    _insert_as_old_code(url, closed[:2])
    _insert_as_old_code(url, closed[2:])
    upgrade(url, "0006")
    keys = _keys(url)
    wrong = [
        body
        for update_id, body in enumerate(CORPUS, 1)
        if keys[update_id] != (_expected(body)[1], QUEUE_RULE)
    ]
    assert wrong == []
    first = len(CORPUS) + 1
    assert keys[first] == (_expected(CORPUS[0])[1], QUEUE_RULE)  # the open exhaustion
    # Delivered rows keep the key they were delivered under.
    assert {keys[first + i] for i in range(1, 60)} == {("old-key", None)}


def test_not_json_gets_no_key_and_fails_nothing(storage: Storage) -> None:
    """Never the intake's, but a row written by hand must not stop an insert or the upgrade."""
    url = storage.url("0005")
    bad = ["🚀", "", "{", '{"message": {"chat": {"id": 42}}', "[1,", "null"]
    rows = _rows(['{"update_id": 1}'] * len(bad))
    for row, body in zip(rows, bad, strict=True):
        row.update(body=body, update_type="message")
    _insert_as_old_code(url, rows[:3])
    upgrade(url, "0006")
    _insert_as_old_code(url, rows[3:])
    assert {key for key, _ in _keys(url).values()} == {None}


def test_downgrade_drops_the_trigger_and_gives_back_the_old_keys(storage: Storage) -> None:
    url = storage.url()
    member = '{"user": {"id": 7}, "status": "member"}'
    old_keys = {  # body -> the key of the release before 0006, written out
        '{"update_id": 1, "callback_query": {"from": {"id": 42}}}': "42",
        '{"update_id": 1, "message": {"chat": {"id": -100123}}}': "-100123",
        '{"update_id": 1, "poll_answer": {"poll_id": "9", "user": {"id": 5}}}': "5",
        '{"update_id": 1, "poll_answer": {"poll_id": "9", "voter_chat": {"id": -3}}}': "-3",
        '{"update_id": 1, "chat_member": {"chat": {"id": -8}, "old_chat_member": '
        + member
        + "}}": "-8",
        '{"update_id": 1, "poll": {"id": "9"}}': None,
        '{"update_id": 1, "managed_bot": {"user": {"id": 4}}}': None,
    }
    bodies = list(old_keys)
    _insert_as_old_code(url, _rows(bodies))
    closed = _rows(bodies[:1], start=100)
    closed[0].update(state="completed", settled_at=NOW)
    _insert_as_old_code(url, closed)
    downgrade(url, "0005")
    _insert_as_old_code(url, _rows(bodies[:1], start=200))
    keys = _keys_without_rule(url)
    assert [keys[i] for i in range(1, len(bodies) + 1)] == list(old_keys.values())
    assert keys[100] == str(42 + 3 * 2**33)  # delivered: its key stays
    assert keys[200] == "old-key"  # no trigger any more
    upgrade(url, "head")
    assert _keys(url)[200] == (str(42 + 3 * 2**33), QUEUE_RULE)


def _keys_without_rule(url: str) -> dict[int, str | None]:
    engine = create_sync_engine(url)
    try:
        with engine.connect() as connection:
            result = connection.execute(text(f"SELECT update_id, queue_key FROM {TABLE}"))
            return {row.update_id: row.queue_key for row in result}
    finally:
        engine.dispose()
