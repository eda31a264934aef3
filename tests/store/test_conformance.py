"""The conformance check, run once per backend and level, and its controls."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from sqlalchemy import delete

from app.store import SqlUpdateStore, UpdateStore, open_store
from app.store.codec import PLAIN, Codec
from app.store.conformance.check import check_update_store
from tests.conftest import Storage
from tests.privacy.rings import test_ring
from tests.store.broken_stores import CONTROLS


def emptied_stores(
    storage: Storage,
    revision: str = "head",
    kind: type[SqlUpdateStore] = SqlUpdateStore,
    codec: Codec = PLAIN,
) -> Callable[[], Awaitable[SqlUpdateStore]]:
    """`make_store` for the check: each store on the same migrated table, emptied first. The
    check closes each rule's store before it makes the next, so an empty table is a fresh
    store; migrating a new one for each of the two dozen rules cost most of the test's time."""
    url = storage.url(revision)

    async def make_store() -> SqlUpdateStore:
        opened = await open_store(url, events=True, codec=codec)
        async with opened.engine.begin() as connection:
            for table in opened.table.metadata.sorted_tables:  # with revision 0004's
                await connection.execute(delete(table))
        return (
            opened
            if kind is SqlUpdateStore
            else kind(opened.engine, opened.table.name, opened.revision, events=True, codec=codec)
        )

    return make_store


@pytest.mark.parametrize(
    ("revision", "level"), [("0001", "base"), ("0002", "base"), ("head", "durable")]
)
async def test_store_conforms_at_every_level(storage: Storage, revision: str, level: str) -> None:
    stores = emptied_stores(storage, revision)

    async def make_store() -> UpdateStore:
        store = await stores()
        assert store.capability == level
        return store

    assert await check_update_store(make_store) == []


async def test_an_encrypting_store_conforms(storage: Storage) -> None:
    """The whole contract holds with personal data sealed and identifiers digested: the codec
    sits between the store's methods and its statements, and no rule sees it."""
    assert await check_update_store(emptied_stores(storage, codec=Codec(test_ring()))) == []


@pytest.mark.parametrize("broken", list(CONTROLS), ids=lambda cls: cls.__name__)
async def test_check_names_each_broken_store(
    storage: Storage, broken: type[SqlUpdateStore]
) -> None:
    make_store = emptied_stores(storage, kind=broken)

    rule = CONTROLS[broken]
    # Its own rule only: the control proves that rule can fail (the whole check runs, clean,
    # on the real store above).
    violations = await check_update_store(make_store, only=[rule])

    assert any(v.startswith(f"{rule}: ") for v in violations), violations


async def test_the_check_refuses_an_unknown_rule_name(storage: Storage) -> None:
    with pytest.raises(ValueError, match="no rules named"):
        await check_update_store(emptied_stores(storage), only=["no such rule"])
