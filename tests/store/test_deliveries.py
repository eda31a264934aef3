"""Deliveries beside the update's row (revision 0010, docs/design.md decision 7), on both
backends: what the intake's batch records for an update's routes."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from app.store import NewUpdate, SchemaError, open_store
from app.store.store import SqlUpdateStore
from app.store.types import Route
from tests.conftest import Storage

DEFAULT, PAYMENTS, ANALYTICS = Route("default"), Route("payments"), Route("analytics", False)


def _update(update_id: int, *routes: Route, chat: int = 7, at: int = 1_000) -> NewUpdate:
    body = f'{{"update_id": {update_id}, "message": {{"chat": {{"id": {chat}}}}}}}'
    return NewUpdate("shop", update_id, body, at, "message", f"chat:{chat}", routes=tuple(routes))


async def _rows(store: SqlUpdateStore) -> dict[int, Any]:
    t = store.table
    async with store.engine.connect() as connection:
        found = await connection.execute(
            select(t.c.update_id, t.c.state, t.c.due_at, t.c.settled_at, t.c.queue_key)
        )
        return {row.update_id: row for row in found}


async def _deliveries(store: SqlUpdateStore) -> dict[tuple[int, str], Any]:
    d = store.deliveries_table
    assert d is not None
    async with store.engine.connect() as connection:
        found = await connection.execute(select(d))
        return {(row.update_id, row.destination): row for row in found}


async def test_an_update_is_recorded_once_with_a_delivery_per_destination_beside_default(
    storage: Storage,
) -> None:
    store = await open_store(storage.url())
    try:
        new = await store.add_many(
            [
                _update(1, DEFAULT, PAYMENTS, ANALYTICS),
                _update(2, PAYMENTS, at=1_001),  # not default's: the row holds no delivery
                _update(3, at=1_002),  # matches no destination
                _update(4, DEFAULT, at=1_003),
            ]
        )
        assert new == {("shop", n) for n in (1, 2, 3, 4)}
        rows = await _rows(store)
        assert {n: (row.state, row.settled_at) for n, row in rows.items()} == {
            1: ("pending", None),
            2: ("unrouted", 1_001),  # settled at its receipt: done for prune and retention
            3: ("unrouted", 1_002),
            4: ("pending", None),
        }
        deliveries = await _deliveries(store)
        assert set(deliveries) == {(1, "payments"), (1, "analytics"), (2, "payments")}
        for (update_id, _), delivery in deliveries.items():
            assert (delivery.state, delivery.attempts, delivery.claim_id) == ("pending", 0, None)
            assert delivery.due_at == delivery.received_at == rows[update_id].due_at
        # An ordered destination keeps the update's queue key as stored; an unordered none.
        assert deliveries[(1, "payments")].queue_key == rows[1].queue_key is not None
        assert deliveries[(1, "analytics")].queue_key is None
    finally:
        await store.close()


async def test_a_duplicate_gains_no_delivery_whatever_its_routes_are_now(
    storage: Storage,
) -> None:
    store = await open_store(storage.url())
    try:
        assert await store.add_many([_update(1, DEFAULT), _update(1, PAYMENTS)]) == {("shop", 1)}
        assert await store.add_many([_update(1, PAYMENTS, ANALYTICS), _update(2, PAYMENTS)]) == {
            ("shop", 2)
        }
        assert set(await _deliveries(store)) == {(2, "payments")}
        assert (await _rows(store))[1].state == "pending"  # the first one kept, as it was
    finally:
        await store.close()


async def test_routes_need_revision_0010_and_a_refusal_writes_nothing(storage: Storage) -> None:
    store = await open_store(storage.url(revision="0009"))
    try:
        for routes in ((PAYMENTS,), (), (DEFAULT, PAYMENTS)):
            with pytest.raises(SchemaError, match="revision 0010"):
                await store.add_many([_update(5), _update(1, *routes)])
        assert await _rows(store) == {}
        assert await store.add_many([_update(1, DEFAULT)]) == {("shop", 1)}  # default: as ever
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("routes", "words"),
    [
        ((Route("Payments"),), "not a destination name"),
        ((PAYMENTS, PAYMENTS), "routed twice"),
        ((("payments", "yes"),), "not a .destination, ordered. pair"),
        ([PAYMENTS], "not a tuple"),
    ],
)
def test_bad_routes_are_refused_naming_them(routes: Any, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        NewUpdate("shop", 1, "{}", 0, routes=routes)


async def _set(store: SqlUpdateStore, table: Any, update_id: int, **values: Any) -> None:
    async with store.engine.begin() as connection:
        await connection.execute(
            table.update().where(table.c.update_id == update_id).values(**values)
        )


async def test_prune_takes_an_update_once_its_row_and_every_delivery_beside_it_are_done(
    storage: Storage,
) -> None:
    store = await open_store(storage.url())
    d = store.deliveries_table
    try:
        await store.add_many(
            [_update(1, DEFAULT, PAYMENTS), _update(2, at=1_001), _update(3, PAYMENTS)]
        )
        done = {"state": "completed", "due_at": 1_500, "settled_at": 1_500}
        await _set(store, store.table, 1, **done)
        # An exhaustion keeps settled_at NULL until its acknowledgement.
        await _set(store, d, 3, state="abandoned", exhausted_at=1_500, due_at=1_500)
        assert await store.prune(2_000) == 1  # 2, unrouted; 1 waits for payments
        assert set(await _rows(store)) == {1, 3}
        await _set(store, d, 1, **{**done, "settled_at": 2_500, "due_at": 2_500})
        assert await store.prune(2_000) == 0  # settled after `before`
        assert await store.prune(3_000) == 1
        assert set(await _rows(store)) == {3}
        assert set(await _deliveries(store)) == {(3, "payments")}  # it went with its row
    finally:
        await store.close()
