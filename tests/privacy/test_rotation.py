"""Rotation and turning encryption on: the re-encryption moves every stored value to the ring's
current key, plaintext included, the registry keeps a key in the ring while values need it,
and `keys status` counts what is where."""

from __future__ import annotations

import asyncio
import json

import pytest

from app.store import Completed, ExhaustionFilter, Failed, NewUpdate, SqlUpdateStore, open_store
from app.store.codec import PLAIN, Codec
from app.store.errors import MissingKeys
from tests.conftest import Storage, table_rows
from tests.downstream import (
    FakeDownstream,
    bot,
    dispatching,
    eventually,
    now_ms,
    settings_for,
)
from tests.privacy.rings import INDEX_KEY_TEXT, key_text, test_ring

BOT = "shop"
PERSON = {"id": 61_001, "is_bot": False, "first_name": "Zelphinia"}


def update(update_id: int) -> NewUpdate:
    chat = 73_000 + update_id
    body = {
        "update_id": update_id,
        "message": {"chat": {"id": chat, "type": "private"}, "from": PERSON, "text": "hi"},
    }
    return NewUpdate(
        BOT, update_id, json.dumps(body), update_id, "message", str(chat), None, (61_001, chat)
    )


async def fill(store: SqlUpdateStore, first: int) -> None:
    """Rows with every kind of sealed value: bodies, errors and history, an exhaustion, its
    event, an audit entry with a filter."""
    ids = range(first, first + 6)
    await store.add_many([update(n) for n in ids])
    claimed = await store.claim_next_owned(
        now=first * 100, lease_until=first * 100 + 50_000, max_attempts=5, limit=10
    )
    for index, held in enumerate(claimed):
        at = first * 100 + 1
        if index % 3 == 0:
            await store.settle_owned(held.identity, Completed(at))
        elif index % 3 == 1:
            await store.settle_owned(held.identity, Failed(at, at + 10**9, f"HTTP 500: {first}"))
        else:
            await store.exhaust(held.identity, at, f"HTTP 400: no {first}")
    await store.acknowledge_exhaustions(
        ExhaustionFilter(bots=(BOT,), chat=str(73_000 + first + 2)),
        at=first * 100 + 2,
        by="operator",
        dry_run=True,
    )
    await store.pause(BOT, at=first * 100 + 3, by="operator", reason=f"maintenance {first}")
    await store.resume(BOT, at=first * 100 + 4, by="operator")


async def snapshot(store: SqlUpdateStore, at: int) -> dict[str, object]:
    """What readers see: bodies, errors, histories, exhaustions, events and the audit log."""
    seen: dict[str, object] = {}
    for update_id in range(1, 13):
        row = await store.get_update(BOT, update_id)
        seen[f"update {update_id}"] = None if row is None else (row.body, row.error, row.state)
        seen[f"history {update_id}"] = [
            (a.attempt, a.error) for a in await store.attempt_history(BOT, update_id) or []
        ]
    seen["exhaustions"] = [(e.body, e.error) for e in await store.due_exhaustions(limit=50)]
    seen["audit"] = [(e.action, e.detail) for e in await store.audit_log(limit=50)]
    events = await store.take_events(now=at, lease_until=at + 1, limit=50)
    seen["events"] = sorted(json.loads(e.payload)["data"].get("error", "") for e in events)
    return seen


async def reencrypted(store: SqlUpdateStore) -> int:
    moved = 0
    while done := await store.reencrypt(limit=4):
        moved += done
    return moved


async def test_a_new_first_key_moves_every_value_plaintext_included(storage: Storage) -> None:
    url = storage.url()
    plain = await open_store(url, events=True)
    await fill(plain, 1)  # before encryption was turned on
    await plain.close()
    old = await open_store(url, events=True, codec=Codec(test_ring("k1")))
    await old.check_key_ring(at=1)
    await fill(old, 7)
    await old.close()

    rotated = await open_store(url, events=True, codec=Codec(test_ring("k2", "k1")))
    try:
        await rotated.check_key_ring(at=2)
        before = await snapshot(rotated, 10**12)
        counts = await rotated.count_keys(at=3)
        assert counts["k1"] > 0
        assert counts["none"] > 0
        assert counts.get("k2", 0) == 0

        assert await reencrypted(rotated) > 0
        assert await reencrypted(rotated) == 0  # a second pass finds nothing left

        after = await rotated.count_keys(at=4)
        assert after["k1"] == after["none"] == 0
        assert after["k2"] == counts["k1"] + counts["none"]
        assert await snapshot(rotated, 2 * 10**12) == before
        # Queue keys and subjects are digests now, whoever recorded the row.
        keys = [key for (key,) in table_rows(url, "queue_key")]
        subjects = [s for (s,) in table_rows(url, "subjects")]
        assert all(key.startswith("h1:") for key in keys), keys
        assert all(s.count("h1:") == 2 for s in subjects), subjects
    finally:
        await rotated.close()

    # k1 counted at 0: a ring without it starts; before the count it would not have.
    dropped = await open_store(url, codec=Codec(test_ring("k2")))
    try:
        await dropped.check_key_ring(at=5)
    finally:
        await dropped.close()


async def test_a_ring_that_lacks_a_key_in_use_refuses_to_start(storage: Storage) -> None:
    url = storage.url()
    first = await open_store(url, codec=Codec(test_ring("k1")))
    await first.check_key_ring(at=1)
    await first.add_many([update(1)])
    await first.close()
    for codec, words in (
        (Codec(test_ring("k2")), "the ring lacks them"),
        (PLAIN, "no key ring is configured"),
    ):
        store = await open_store(url, codec=codec)
        try:
            with pytest.raises(MissingKeys, match=rf"keys \['k1'\], and {words}"):
                await store.check_key_ring(at=2)
        finally:
            await store.close()


async def test_a_rotation_under_load_loses_nothing_and_delivers_nothing_twice(
    storage: Storage, downstream: FakeDownstream
) -> None:
    url = storage.url()
    old = await open_store(url, codec=Codec(test_ring("k1")))
    try:
        await old.check_key_ring(at=1)
        await old.add_many([update(n) for n in range(1, 301)])  # a backlog under k1
    finally:
        await old.close()
    ring = {"encryption_keys": f"k2:{key_text('k2')},k1:{key_text('k1')}"}
    settings = settings_for(url, bot(downstream, name=BOT), **ring, index_key=INDEX_KEY_TEXT)
    mover = await open_store(url, codec=Codec(test_ring("k2", "k1")))
    try:
        async with dispatching(settings) as (_, store):

            async def post() -> None:  # the intake goes on meanwhile
                for first in range(301, 601, 20):
                    await store.add_many([update(n) for n in range(first, first + 20)])
                    await asyncio.sleep(0.01)

            async def rotate() -> None:
                while (await mover.count_keys(at=now_ms())).get("k1", 0):
                    await mover.reencrypt(limit=25)

            await asyncio.gather(post(), rotate())

            async def delivered() -> bool:
                stats = await store.stats()
                return bool(stats) and stats[0].states == {"completed": 600}

            await eventually(delivered, within=60)
        counts = await mover.count_keys(at=now_ms())
    finally:
        await mover.close()
    received = [r.update_id for r in downstream.received]
    assert sorted(set(received)) == list(range(1, 601)), "lost"
    assert len(received) == 600, "delivered twice"
    assert counts.get("k1") == 0
    assert counts["none"] == 0
