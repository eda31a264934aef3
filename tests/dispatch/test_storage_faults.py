"""A database that cannot write is not the update's failure (issue 49): a settle it refuses is
retried past the lease until it lands, an attempt whose lease ran out meanwhile is handed back
spending nothing, and the claim loop waits for both (`app.dispatch.runner`). The full disk
itself, through real processes and volumes, is tests/chaos/test_full_disk.py; here the store's
writes fail as a full disk fails them, for as long as the test says."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest

from app.store import SqlUpdateStore, StorageFull, StoreTimedOut, StoreUnavailable
from app.store.storage import failure_level
from tests.conftest import Storage
from tests.dispatch.test_dispatcher import rows, until
from tests.downstream import (
    FakeDownstream,
    bot,
    by_attempt,
    dispatching,
    eventually,
    hang,
    message,
    now_ms,
    ok,
    settings_for,
)

FULL = StorageFull("database storage is full: database or disk is full (test)")


def break_writes(store: SqlUpdateStore, *names: str) -> Callable[[], None]:
    """Make `store`'s methods `names` fail as a full disk fails them; the call that mends them."""
    kept = {name: getattr(store, name) for name in names}

    async def full(*_args: Any, **_kwargs: Any) -> Any:
        raise FULL

    for name in names:
        setattr(store, name, full)

    def mend() -> None:
        for name, method in kept.items():
            setattr(store, name, method)

    return mend


async def test_a_settle_refused_past_the_lease_still_lands_and_delivers_nothing_twice(
    storage: Storage, downstream: FakeDownstream
) -> None:
    url = storage.url()
    settings = settings_for(url, bot(downstream, lease_seconds=1, mode="durable"))
    async with dispatching(settings) as (dispatcher, store):
        mend = break_writes(store, "settle_many_owned", "renew_owned")
        await store.add("shop", 1, message(1), now_ms())
        await eventually(lambda: downstream.received)
        await eventually(lambda: dispatcher.in_flight == 1)  # answered, its settle stalled
        await asyncio.sleep(2.5)  # two leases and a half
        assert len(downstream.received) == 1  # not retaken here meanwhile
        mend()
        await until(url, lambda r: r[0][1] == "completed")
        assert dispatcher.owner_lost == 0
    assert [r.attempt for r in downstream.received] == [1]


async def test_a_lease_run_out_while_nothing_writes_is_handed_back_spending_no_attempt(
    storage: Storage, downstream: FakeDownstream
) -> None:
    """With `max_attempts = 1`, an attempt cut short by the fault would end the update
    exhausted ("attempts spent"); handed back, it is delivered once the disk has room."""
    downstream.answer = by_attempt(hang, ok)
    url = storage.url()
    options = {"lease_seconds": 1, "mode": "durable", "max_attempts": 1}
    settings = settings_for(url, bot(downstream, **options))
    async with dispatching(settings) as (dispatcher, store):
        await store.add("shop", 1, message(1), now_ms())
        await eventually(lambda: downstream.received)
        mend = break_writes(store, "settle_many_owned", "renew_owned")
        await eventually(lambda: downstream.received[0].disconnected, within=5)  # stopped
        await asyncio.sleep(1.0)
        assert len(downstream.received) == 1  # its hand-back stalls, so do the claims
        mend()
        await until(url, lambda r: r[0][1] == "completed")
        assert dispatcher.owner_lost == 0
    assert [r.attempt for r in downstream.received] == [1, 2]
    assert rows(url, "attempts", "uncounted", "exhausted_at") == [(2, 1, None)]


@pytest.mark.parametrize(
    ("error", "level"),
    [
        (FULL, logging.DEBUG),
        (StoreUnavailable("connection refused"), logging.WARNING),
        (StoreTimedOut("lock timeout"), logging.WARNING),
        (None, logging.WARNING),
    ],
)
def test_a_full_disk_is_told_by_its_episode_not_by_each_failure(
    error: BaseException | None, level: int
) -> None:
    assert failure_level(error) == level


def test_what_fails_while_an_episode_lasts_is_part_of_it() -> None:
    refused = StoreUnavailable("the database system is in recovery mode")
    refused.during_full_disk = True  # as the store marks it while its episode lasts
    assert failure_level(refused) == logging.DEBUG
