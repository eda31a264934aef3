"""`/readyz` (docs/contract.md section 16, issue 29): without a key it says only ready or not; with
a key holding the viewer scope it says why, and what the schema serves. Keys and answers do not
depend on the database: SQLite, its store swapped on the running server for one that is not
ready."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from app.store import SqlUpdateStore
from app.store.engine import create_store_engine
from app.store.schema import HEAD
from tests.api.conftest import CALLBACK_KEY, KEY, OPERATIONS_KEY, VIEWER_KEY, Api

TABLE = "telegram_updates"


@asynccontextmanager
async def store_of(api: Api, store: SqlUpdateStore) -> AsyncIterator[None]:
    """The served app's /readyz asks `store` while the block runs."""
    live = api.app.state.store
    api.app.state.store = store
    try:
        yield
    finally:
        api.app.state.store = live
        await store.close()


async def test_readyz_without_a_key_says_ready_and_nothing_more(sqlite_api: Api) -> None:
    for key in (None, CALLBACK_KEY):  # a valid key without the viewer scope is told no more
        answer = await sqlite_api.get("/readyz", key=key)
        assert answer.status_code == 200, key
        assert answer.json() == {"status": "ready"}, key


async def test_readyz_with_a_viewer_key_names_the_capability(sqlite_api: Api) -> None:
    for key in (VIEWER_KEY, OPERATIONS_KEY, KEY):
        answer = await sqlite_api.get("/readyz", key=key)
        assert answer.status_code == 200, key
        assert answer.json() == {"status": "ready", "capability": "durable"}, key


async def test_readyz_with_a_wrong_key_is_401(sqlite_api: Api) -> None:
    answer = await sqlite_api.get("/readyz", key="wrong-key.0123456789abcdef")
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"] == "Bearer"


async def test_a_schema_below_the_bots_modes_is_unavailable_and_only_a_viewer_is_told_why(
    sqlite_api: Api,
) -> None:
    old = SqlUpdateStore(create_store_engine(sqlite_api.url), TABLE, "0001")
    async with store_of(sqlite_api, old):
        public = await sqlite_api.get("/readyz", key=None)
        viewer = await sqlite_api.get("/readyz", key=VIEWER_KEY)
    assert public.status_code == 503
    assert public.json() == {"status": "unavailable"}
    assert viewer.status_code == 503
    error = viewer.json()["error"]
    assert "alembic upgrade head" in error, error
    assert TABLE not in error, error  # no table's name, even to a viewer (docs/security.md)


async def test_an_unreachable_database_is_unavailable_and_only_a_viewer_is_told_why(
    sqlite_api: Api, tmp_path: Path
) -> None:
    (tmp_path / "gone").mkdir()  # a directory: SQLite cannot open it
    dead = SqlUpdateStore(
        create_store_engine(f"sqlite+aiosqlite:///{tmp_path / 'gone'}"), TABLE, HEAD
    )
    async with store_of(sqlite_api, dead):
        public = await sqlite_api.get("/readyz", key=None)
        viewer = await sqlite_api.get("/readyz", key=VIEWER_KEY)
    assert public.status_code == 503
    assert public.json() == {"status": "unavailable"}
    assert viewer.status_code == 503
    assert viewer.json() == {
        "status": "unavailable",
        "error": "database unreachable (StoreUnavailable)",
    }
