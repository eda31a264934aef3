"""Security checks of issue 7 that are about the code rather than a run: SQL text is never
built from input, and secrets are compared in constant time. (Routes without a key:
tests/api/test_auth.py; secrets absent from every process's log: the chaos run.)"""

from __future__ import annotations

import ast
import hmac
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from app.api_keys import ApiKey
from app.bot_settings import BotSettings
from app.config import Settings
from app.main import create_app
from tests.conftest import Storage, serve_asgi
from tests.processes import ROOT

# SQL keywords as this code base writes them: upper case.
SQL = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|DROP|ALTER|LISTEN|NOTIFY|BEGIN|"
                 r"PRAGMA|GRANT|COMMENT|WITH|SET|LOCK|TRUNCATE|ANALYZE|VACUUM)\b")  # fmt: skip
# Every place that formats SQL text, and why what it interpolates cannot be input.
REVIEWED = {
    ("app/store/backends/sqlite_engine.py", "set_up"): "a constant (the busy timeout), and a "
    "page count computed from the volume's free space, an int",
    ("app/store/backends/sqlite_engine.py", "_on_begin"): "a begin mode checked against two "
    "literals first",
    ("alembic/versions/0002_claim_fence.py", "upgrade"): "the table name, which "
    "make_metadata validated (validate.table_name) in alembic/env.py before any revision ran",
    ("alembic/versions/0002_claim_fence.py", "downgrade"): "the same validated table name",
    ("alembic/versions/0003_budget_and_delivery.py", "upgrade"): "the same validated table name",
    ("app/store/rekey.py", "_postgresql_function"): "the key function's name, made of the "
    "table name that make_metadata validated (validate.table_name, at most 40 characters), and "
    "SQL that SQLAlchemy compiled from app.queues' constants",
    ("app/store/rekey.py", "trigger_ddl"): "the same validated table name and compiled SQL",
    ("app/store/rekey.py", "drop_trigger_ddl"): "the same validated table name",
    ("alembic/versions/0010_destinations.py", "_state_check"): "the validated table name, "
    "the constraint name made of it, CHECK texts built from app.store.types' constant states "
    "(schema.STATE_CHECK, DELIVERY_CHECK), and the schema version SQLite gave, as an int",
    ("alembic/versions/0010_destinations.py", "_owns_function"): "function and table names "
    "made of the same validated table name",
    ("alembic/versions/0010_destinations.py", "downgrade"): "the same validated table names",
    ("app/store/backends/postgres.py", "analyze"): "the store's table name, validated when the "
    "store was opened (validate.table_name) and quoted by the dialect's identifier preparer",
    ("app/store/backends/postgres.py", "vacuum"): "the store's table name, validated when the "
    "store was opened (validate.table_name) and quoted by the dialect's identifier preparer",
    ("app/store/backends/sqlite.py", "rewrite_header"): "the user_version SQLite gave, as an int",
    ("app/store/backends/sqlite_writer.py", "_checkpoint"): "busy timeouts: a constant, and "
    "the one SQLite gave, as an int",
    ("app/store/backends/sqlite_writer.py", "_make_room"): "a page count computed from the WAL "
    "file's size, an int",
}


def _formatted_sql(path: Path, root: Path = ROOT) -> set[tuple[str, str]]:
    """(file, innermost function) of every f-string, % or .format() whose text starts as SQL."""
    tree = ast.parse(path.read_text())
    owner: dict[int, str] = {}  # node -> its innermost function (walked outer first)
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            owner.update((id(node), function.name) for node in ast.walk(function))
    found = set()
    for node in ast.walk(tree):
        head = None
        if isinstance(node, ast.JoinedStr):
            head = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod | ast.Add):
            if isinstance(node.left, ast.Constant) and isinstance(node.left.value, str):
                head = node.left.value
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "format":
            target = node.func.value  # type: ignore[attr-defined]
            if isinstance(target, ast.Constant) and isinstance(target.value, str):
                head = target.value
        if head is not None and SQL.match(head):
            found.add((str(path.relative_to(root)), owner.get(id(node), "<module>")))
    return found


def test_sql_text_is_formatted_only_where_reviewed() -> None:
    found: set[tuple[str, str]] = set()
    for folder in ("app", "alembic"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            found |= _formatted_sql(path)
    assert found - set(REVIEWED) == set(), "SQL built by formatting: bind it, or review it"
    assert set(REVIEWED) - found == set(), "a reviewed place no longer formats SQL: drop it"


def test_the_scan_finds_formatted_sql(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "def a(n):\n    return f'SELECT * FROM t WHERE id = {n}'\n"
        "def b(n):\n    return 'DELETE FROM t WHERE id = %s' % n\n"
        "def c(n):\n    return 'UPDATE t SET x = {}'.format(n)\n"
        "def d(n):\n    return f'update {n}: recorded'\n"
    )
    found = {name for _, name in _formatted_sql(sample, tmp_path)}
    assert found == {"a", "b", "c"}


async def test_secrets_and_keys_are_compared_in_constant_time(
    sqlite_storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        compared.append((bytes(a), bytes(b)))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    keys = (
        ApiKey(key=SecretStr("key-one-0123456789")),
        ApiKey(key=SecretStr("key-two-0123456789")),
    )
    settings = Settings(
        database_url=sqlite_storage.url(),
        bots=(BotSettings(name="shop", secret_token=SecretStr("the-secret-token")),),
        api_keys=keys,
    )
    async with serve_asgi(create_app(settings)) as base, httpx.AsyncClient(base_url=base) as http:
        refused = await http.post(
            "/telegram/shop", content=b"{}", headers={"x-telegram-bot-api-secret-token": "nope"}
        )
        assert refused.status_code == 403
        assert (b"nope", b"the-secret-token") in compared
        compared.clear()
        wrong = await http.get("/v1/stats", headers={"authorization": "Bearer wrong-key"})
        assert wrong.status_code == 401
        # Every configured key is compared, with no early exit.
        assert compared == [
            (b"wrong-key", b"key-one-0123456789"),
            (b"wrong-key", b"key-two-0123456789"),
        ]
        for answer in (refused, wrong):
            assert "the-secret-token" not in answer.text
            assert "key-one" not in answer.text
