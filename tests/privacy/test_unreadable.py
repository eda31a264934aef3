"""A value the ring cannot open: an error, never plaintext, never a stop of the worker loop."""

from __future__ import annotations

from app.store import open_store
from app.store.codec import Codec
from tests.conftest import Storage
from tests.downstream import (
    FakeDownstream,
    bot,
    dispatching,
    eventually,
    message,
    now_ms,
    settings_for,
)
from tests.privacy.rings import INDEX_KEY_TEXT, key_text, test_ring


async def test_a_body_sealed_under_a_key_the_ring_lacks_ends_its_attempt_and_no_other(
    storage: Storage, downstream: FakeDownstream
) -> None:
    url = storage.url()
    dropped = await open_store(url, codec=Codec(test_ring("gone")))
    try:
        await dropped.add("shop", 1, message(1, chat=1), now_ms(), queue_key="1")
    finally:
        await dropped.close()
    ring = {"encryption_keys": f"k1:{key_text('k1')}", "index_key": INDEX_KEY_TEXT}
    settings = settings_for(url, bot(downstream), **ring)
    async with dispatching(settings) as (_, store):
        await store.add("shop", 2, message(2, chat=2), now_ms(), queue_key="2")

        async def ended() -> bool:
            first, second = await store.get_update("shop", 1), await store.get_update("shop", 2)
            assert first is not None
            assert second is not None
            return first.state == "abandoned" and second.state == "completed"

        await eventually(ended)
        (exhaustion,) = await store.due_exhaustions(limit=10)
    assert [received.update_id for received in downstream.received] == [2]
    assert exhaustion.identity.update_id == 1
    assert exhaustion.body == ""
    assert exhaustion.unreadable is not None
    assert "key 'gone'; the ring lacks it" in exhaustion.unreadable
    assert exhaustion.error is not None
    assert "key 'gone'" in exhaustion.error
