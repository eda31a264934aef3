"""Deliveries beside the update's row (revision 0010, docs/design.md decision 7), on both
backends: what the intake's batch records for an update's routes."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from sqlalchemy import select

from app.store import ClaimIdentity, Completed, Failed, NewUpdate, SchemaError, open_store
from app.store.operator_types import ExhaustionFilter
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
        # Claims need the head revision whatever their destination (below it: plain bots).
        with pytest.raises(SchemaError, match="upgrade head"):
            await store.claim_next_owned(**CLAIM, destination="payments")
        with pytest.raises(SchemaError, match="upgrade head"):
            await store.owns(ClaimIdentity("shop", 1, 1, "c", "payments"), 1)
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


CLAIM = {"now": 2_000, "lease_until": 62_000, "max_attempts": 3, "limit": 10}


async def _history(store: SqlUpdateStore) -> list[tuple[str, int, int, str | None]]:
    a = store.delivery_attempts_table
    assert a is not None
    async with store.engine.connect() as connection:
        rows = await connection.execute(
            select(a.c.destination, a.c.update_id, a.c.attempt, a.c.outcome).order_by(
                a.c.destination, a.c.update_id, a.c.attempt
            )
        )
        return [tuple(row) for row in rows]


async def test_a_destination_claims_its_own_deliveries_with_the_update_s_body(
    storage: Storage,
) -> None:
    store = await open_store(storage.url())
    try:
        traced = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        routed = _update(1, DEFAULT, PAYMENTS, ANALYTICS)
        await store.add_many(
            [
                NewUpdate(**{**_fields(routed), "trace_context": traced}),
                _update(2, PAYMENTS, at=1_001),
                _update(3, DEFAULT, at=1_002),
            ]
        )
        taken = await store.claim_next_owned(**CLAIM, destination="payments")
        assert [(c.identity.update_id, c.identity.destination) for c in taken] == [
            (1, "payments")  # 2 waits behind 1 in chat 7, for payments alone
        ]
        (first,) = taken
        assert (first.identity.attempt, first.counted) == (1, 1)
        assert (first.body, first.update_type) == (routed.body, "message")
        assert (first.trace_context, first.received_at) == (traced, 1_000)
        assert first.queue_key is not None
        # default's own claim is untouched by payments' lease: 1 then 3 are its own.
        mine = await store.claim_next_owned(**CLAIM, ordering="none")
        assert [(c.identity.update_id, c.identity.destination) for c in mine] == [
            (1, "default"),
            (3, "default"),
        ]
        # An unordered destination's deliveries wait for nothing.
        loose = await store.claim_next_owned(**CLAIM, destination="analytics")
        assert [c.identity.update_id for c in loose] == [1]
        assert await _history(store) == [("analytics", 1, 1, None), ("payments", 1, 1, None)]
    finally:
        await store.close()


def _fields(row: NewUpdate) -> dict[str, Any]:
    return {name: getattr(row, name) for name in NewUpdate.__dataclass_fields__}


async def test_each_transition_of_a_delivery_compares_its_destination_too(
    storage: Storage,
) -> None:
    store = await open_store(storage.url())
    try:
        await store.add_many([_update(1, DEFAULT, PAYMENTS), _update(2, PAYMENTS, chat=8)])
        pay = {c.identity.update_id: c.identity for c in
               await store.claim_next_owned(**CLAIM, destination="payments")}  # fmt: skip
        (own,) = [c.identity for c in await store.claim_next_owned(**CLAIM)]
        # The same key and attempt under another destination, or its claim_id on default's
        # row: neither is the delivery.
        crossed = ClaimIdentity("shop", 1, 1, pay[1].claim_id)  # default, payments' claim_id
        assert not await store.owns(crossed, 2_100)
        assert not await store.settle_owned(crossed, Completed(2_100))
        other = ClaimIdentity("shop", 1, 1, own.claim_id, "payments")
        assert not await store.owns(other, 2_100)
        assert await store.owned_leases([pay[1], own, pay[2], other], 2_100) == [
            62_000, 62_000, 62_000, None]  # fmt: skip
        assert await store.renewed_leases([(pay[1], 70_000), (own, 65_000)], 2_200) == [
            70_000, 65_000]  # fmt: skip
        assert await store.renew_owned(pay[2], 71_000, 2_200)
        waiting: set[tuple[str, int]] = set()
        assert await store.settle_many_owned(
            [(pay[1], Completed(2_300)), (own, Completed(2_300)),
             (pay[2], Failed(2_300, 9_000, "HTTP 502"))],
            waiting=waiting,
        ) == [True, True, True]  # fmt: skip
        assert not await store.settle_owned(pay[1], Completed(2_400))  # settled already
        deliveries = await _deliveries(store)
        assert (deliveries[(1, "payments")].state, deliveries[(1, "payments")].settled_at) == (
            "completed", 2_300)  # fmt: skip
        assert deliveries[(2, "payments")].state == "failed"
        assert deliveries[(2, "payments")].due_at == 9_000
        assert (await _rows(store))[1].state == "completed"
        assert await _history(store) == [
            ("payments", 1, 1, "completed"), ("payments", 2, 1, "failed")]  # fmt: skip
        (tried,) = await store.attempt_history("shop", 2, destination="payments") or []
        assert (tried.attempt, tried.outcome, tried.error) == (1, "failed", "HTTP 502")
        assert await store.attempt_history("shop", 2, destination="analytics") is None
        default = await store.attempt_history("shop", 1) or []  # the row's own
        assert [(a.attempt, a.outcome) for a in default] == [(1, "completed")]
        # A duplicate key within a destination is refused; across destinations it is not.
        with pytest.raises(ValueError, match="repeat"):
            await store.settle_many_owned([(pay[2], Completed(1)), (pay[2], Completed(1))])
    finally:
        await store.close()


async def test_a_destination_has_controls_of_its_own_and_the_bot_s_pause_holds_them_all(
    storage: Storage,
) -> None:
    store = await open_store(storage.url())
    try:
        await store.add_many([_update(1, DEFAULT, PAYMENTS, ANALYTICS)])
        assert await store.pause("shop", at=1, by="ops", reason="refunds", destination="payments")
        assert not await store.pause("shop", at=2, by="ops", destination="payments")  # kept
        assert await store.claim_next_owned(**CLAIM, destination="payments") == []
        assert len(await store.claim_next_owned(**CLAIM)) == 1  # default's is not paused
        await store.pause("shop", at=3, by="ops", reason="the bot's pause holds them all")
        assert await store.claim_next_owned(**CLAIM, destination="analytics") == []
        await store.resume("shop", at=4, by="ops")
        assert len(await store.claim_next_owned(**CLAIM, destination="analytics")) == 1
        assert await store.claim_next_owned(**CLAIM, destination="payments") == []
        assert await store.resume("shop", at=5, by="ops", destination="payments")
        (taken,) = await store.claim_next_owned(**CLAIM, destination="payments")
        # A rate limit and a breaker of its own, beside the bot's (default's).
        await store.set_rate_limit("shop", 2.0, at=6, by="ops", destination="payments")
        assert await store.take_tokens("shop", 5, now=1_006, destination="payments") == 2
        assert await store.take_tokens("shop", 5, now=1_006) == 5  # default: no limit
        await store.report_breaker("shop", "open", at=7, destination="payments")
        (own,) = await store.bot_controls(["shop"], destinations=True)
        assert (own.destination, own.paused, own.rate_per_second, own.breaker) == (
            "payments", False, 2.0, "open")  # fmt: skip
        (bots,) = await store.bot_controls(["shop"])
        assert (bots.destination, bots.rate_per_second, bots.breaker) == ("default", None, None)
        # Park ends that delivery alone, as an exhaustion of its own.
        assert await store.park(taken.identity, at=2_100, by="ops", reason="refund by hand")
        deliveries = await _deliveries(store)
        assert deliveries[(1, "payments")].state == "abandoned"
        assert deliveries[(1, "payments")].exhausted_at == 2_100
        assert deliveries[(1, "analytics")].state == "processing"
        with pytest.raises(ValueError, match="not a destination name"):
            await store.pause("shop", at=8, by="ops", destination="No")
    finally:
        await store.close()


async def test_a_destination_s_held_chat_is_walked_past_by_its_heads(storage: Storage) -> None:
    """A chat whose head is leased, with a queue behind it longer than the claim's window:
    the head walk finds the next chat's delivery, within the destination alone."""
    store = await open_store(storage.url())
    try:
        await store.add_many([_update(n, DEFAULT, PAYMENTS) for n in range(1, 31)])
        await store.add_many([_update(31, DEFAULT, PAYMENTS, chat=8, at=1_500)])
        claim = {**CLAIM, "limit": 2}
        first = await store.claim_next_owned(**claim, destination="payments")
        assert [c.identity.update_id for c in first] == [1, 31]
        for _ in range(2):  # the window comes up short, then the heads go first
            assert await store.claim_next_owned(**claim, destination="payments") == []
        # default's queue is its own: its head is free.
        assert [c.identity.update_id for c in await store.claim_next_owned(**claim)] == [1, 31]
    finally:
        await store.close()


async def test_a_delivery_s_exhaustion_event_names_its_destination(storage: Storage) -> None:
    """exhaustion.created of a delivery beside the row: by a worker's exhaust, and by a claim
    that finds its attempts spent (PostgreSQL writes that one in the claim's statement)."""
    store = await open_store(storage.url(), events=True)
    try:
        await store.add_many([_update(1, PAYMENTS), _update(2, ANALYTICS, chat=8)])
        (paying,) = await store.claim_next_owned(
            **CLAIM, destination="payments", durable_exhaustion=True
        )
        assert await store.exhaust(paying.identity, 2_100, "HTTP 400")
        lapsed = {**CLAIM, "lease_until": 2_001, "max_attempts": 1, "durable_exhaustion": True}
        assert len(await store.claim_next_owned(**lapsed, destination="analytics")) == 1
        spent = {**lapsed, "now": 3_000, "lease_until": 63_000}
        assert await store.claim_next_owned(**spent, destination="analytics") == []
        taken = await store.take_events(now=4_000, lease_until=9_000, limit=10)
        found = [json.loads(event.payload)["data"] for event in taken]
        assert [(d["destination"], d["update_id"], d["reason"]) for d in found] == [
            ("payments", 1, "failed"),
            ("analytics", 2, "spent"),
        ]
    finally:
        await store.close()


async def test_bulk_redrive_and_acknowledgement_act_on_one_destination(storage: Storage) -> None:
    store = await open_store(storage.url())
    try:
        await store.add_many(
            [_update(n, DEFAULT, PAYMENTS, chat=n) for n in (1, 2)] + [_update(3, PAYMENTS, chat=3)]
        )
        durable = {**CLAIM, "durable_exhaustion": True}
        paying = {c.identity.update_id: c.identity for c in
                  await store.claim_next_owned(**durable, destination="payments")}  # fmt: skip
        (own, _) = [c.identity for c in await store.claim_next_owned(**durable)]
        for identity in [*paying.values(), own]:
            assert await store.exhaust(identity, 2_100, f"HTTP 400 for {identity.update_id}")
        chosen = ExhaustionFilter(bots=("shop",), destination="payments")
        dry = await store.redrive(chosen, at=3_000, by="ops", dry_run=True)
        assert (dry.matched, dry.changed) == (3, 0)
        assert [e.identity.destination for e in dry.sample] == ["payments"] * 3
        assert dry.sample[0].body == _update(1, chat=1).body
        narrow = ExhaustionFilter(update_type="message", destination="payments", chat=None)
        done = await store.redrive(
            dataclasses.replace(narrow, error_contains="for 2"), at=3_000, by="ops"
        )
        assert done.changed == 1
        deliveries = await _deliveries(store)
        assert (deliveries[(2, "payments")].state, deliveries[(2, "payments")].uncounted) == (
            "failed", 1)  # fmt: skip
        assert deliveries[(1, "payments")].state == "abandoned"
        assert (await _rows(store))[1].state == "abandoned"  # default's: untouched
        acknowledged = await store.acknowledge_exhaustions([paying[1], paying[3]], at=4, by="ops")
        assert acknowledged.changed == 2
        with pytest.raises(ValueError, match="one action per destination"):
            await store.acknowledge_exhaustions([own, paying[1]], at=5, by="ops")
        (entry, *_) = await store.audit_log(limit=10)
        assert entry.target == "shop/payments"
        later = {**durable, "now": 3_000, "lease_until": 63_000}  # due again from 3_000
        again = await store.claim_next_owned(**later, destination="payments")
        assert [(c.identity.update_id, c.identity.attempt, c.counted) for c in again] == [
            (2, 2, 1)]  # fmt: skip
    finally:
        await store.close()


async def test_a_replay_delivers_a_range_to_a_destination_that_never_had_it(
    storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A destination added later: its deliveries of a range of earlier updates, each due now,
    in its queue when ordered; the updates it had, the erased ones and those outside the
    range are left; `default` takes its `unrouted` rows back; more than the limit is refused
    whole; each replay is in the audit log."""
    store = await open_store(storage.url())
    try:
        await store.add_many(
            [
                _update(1, DEFAULT),
                _update(2, DEFAULT, PAYMENTS),  # payments had it
                _update(3, DEFAULT),  # erased below
                _update(4, ANALYTICS),  # unrouted: default never had it
                _update(5, DEFAULT),  # outside the range
            ]
        )
        t = store.table
        async with store.transaction() as connection:
            erased = t.update().where(t.c.update_id == 3).values(body="", erased_at=1_500)
            await connection.execute(erased)
        replay = {"first": 1, "last": 4, "at": 2_000, "by": "ops"}
        before = await _deliveries(store)
        dry = await store.replay("shop", "payments", **replay, ordered=True, dry_run=True)
        assert (dry, await _deliveries(store)) == (2, before)  # 1 and 4
        monkeypatch.setattr("app.store.control.methods.REPLAY_LIMIT", 1)
        with pytest.raises(ValueError, match="2 updates to replay, over 1 at once"):
            await store.replay("shop", "payments", **replay, ordered=True)
        assert await _deliveries(store) == before
        monkeypatch.undo()
        assert await store.replay("shop", "payments", **replay, ordered=True) == 2
        assert await store.replay("shop", "audit", **replay, ordered=False) == 3  # 1, 2, 4
        assert await store.replay("shop", "payments", **replay, ordered=True) == 0  # had them
        added = {k: (r.state, r.due_at, r.queue_key) for k, r in (await _deliveries(store)).items()}
        assert {k: v for k, v in added.items() if k not in before} == {
            (1, "payments"): ("pending", 2_000, "chat:7"),
            (4, "payments"): ("pending", 2_000, "chat:7"),
            (1, "audit"): ("pending", 2_000, None),  # unordered: in no queue
            (2, "audit"): ("pending", 2_000, None),
            (4, "audit"): ("pending", 2_000, None),
        }
        assert await store.replay("shop", "default", **replay, ordered=True) == 1
        rows = await _rows(store)
        assert (rows[4].state, rows[4].due_at, rows[4].settled_at) == ("pending", 2_000, None)
        # Claimed as any delivery, in update order within the queue.
        claim = {"now": 2_000, "lease_until": 60_000, "max_attempts": 3, "limit": 5}
        claimed = await store.claim_next_owned(**claim, destination="payments")
        assert [c.identity.update_id for c in claimed] == [1]
        with pytest.raises(ValueError, match="is empty"):
            await store.replay("shop", "payments", **(replay | {"first": 5}), ordered=True)
        entries = await store.audit_log(limit=10)
        assert [(e.action, e.target, e.matched) for e in entries] == [
            ("replay", "shop/default", 1),
            ("replay", "shop/audit", 3),
            ("replay", "shop/payments", 2),
        ]
    finally:
        await store.close()
