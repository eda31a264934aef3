"""The conformance check, run once per backend and level, and its controls."""

from __future__ import annotations

import pytest

from app.store import SqlUpdateStore, UpdateStore, open_store
from app.store.conformance import check_update_store
from tests.conftest import Storage
from tests.store.broken_stores import CONTROLS


@pytest.mark.parametrize(("revision", "level"), [("0001", "base"), ("head", "durable")])
async def test_store_conforms_at_every_level(storage: Storage, revision: str, level: str) -> None:
    async def make_store() -> UpdateStore:
        store = await open_store(storage.url(revision))
        assert store.capability == level
        return store

    assert await check_update_store(make_store) == []


@pytest.mark.parametrize("broken", list(CONTROLS), ids=lambda cls: cls.__name__)
async def test_check_names_each_broken_store(
    storage: Storage, broken: type[SqlUpdateStore]
) -> None:
    async def make_store() -> UpdateStore:
        store = await open_store(storage.url())
        return broken(store.engine, store.table.name, store.capability)

    violations = await check_update_store(make_store)

    rule = CONTROLS[broken]
    assert any(v.startswith(f"{rule}: ") for v in violations), violations
