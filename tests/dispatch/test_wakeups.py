"""Idle workers wake at once: in-process when the intake shares the process, by the PostgreSQL
NOTIFY of the intake's commit when it does not (behind PgBouncer: over a direct URL for LISTEN,
or by polling). Each test polls only every 30 s, so a prompt delivery is a wake-up."""

from __future__ import annotations

import asyncio
import logging
import uuid

import httpx
import pytest
from sqlalchemy.engine import make_url

from app.dispatch import Dispatcher
from app.main import create_app
from app.store import Completed, SqlUpdateStore, open_store
from app.store.migrate import upgrade
from tests.conftest import Storage, serve_asgi
from tests.downstream import (
    SECRET,
    FakeDownstream,
    bot,
    dispatching,
    eventually,
    message,
    now_ms,
    settings_for,
)
from tests.pgbouncer import BouncedStorage

SLOW_POLL = {"poll_interval_seconds": 30}


async def assert_woken_by(
    intake_store: SqlUpdateStore, worker: Dispatcher, downstream: FakeDownstream
) -> None:
    """`worker`, listening and asleep for its slow poll, delivers at once what another
    process's store commits."""
    await asyncio.wait_for(worker.listening.wait(), 5)
    # Its first pass, and the pass after the listener's own wake-up on connecting (set just
    # before it): it has looked, found nothing, and sleeps for its slow poll.
    await eventually(lambda: worker.claim_passes >= 2)
    await intake_store.add("shop", 1, message(1), now_ms())  # its commit notifies
    await eventually(lambda: downstream.received, within=5)


async def test_run_delivers_what_the_intake_in_the_same_process_records(
    storage: Storage, downstream: FakeDownstream
) -> None:
    settings = settings_for(storage.url(), bot(downstream), **SLOW_POLL)
    async with (
        serve_asgi(create_app(settings, workers=True)) as base,
        httpx.AsyncClient() as client,
    ):
        for update_id in (1, 2):
            response = await client.post(
                f"{base}/telegram/shop",
                content=message(update_id),
                headers={"x-telegram-bot-api-secret-token": SECRET},
            )
            assert response.status_code == 200
        await eventually(lambda: len(downstream.received) == 2, within=5)
    assert [r.update_id for r in downstream.received] == [1, 2]


async def test_a_worker_elsewhere_wakes_on_the_intakes_notification(
    postgres_storage: Storage, downstream: FakeDownstream
) -> None:
    # A table of its own: the channel is named after the table, and tests running beside
    # this one in other schemas of the same database would otherwise wake it too.
    table = f"t{uuid.uuid4().hex[:12]}"
    url = postgres_storage.url(None)
    upgrade(url, table=table)
    settings = settings_for(url, bot(downstream), table=table, **SLOW_POLL)
    async with dispatching(settings) as (worker, _):
        intake_store = await open_store(url, table=table)  # another process's connections
        try:
            await assert_woken_by(intake_store, worker, downstream)
        finally:
            await intake_store.close()


async def test_the_end_of_an_attempt_wakes_the_next_update_of_its_chat(
    storage: Storage, downstream: FakeDownstream
) -> None:
    url = storage.url()
    store = await open_store(url)
    try:  # recorded before the worker starts: its first look finds 1, and 2 and 3 blocked
        for update_id in (1, 2, 3):  # one chat: each waits for the one before
            await store.add("shop", update_id, message(update_id), now_ms(), queue_key="42")
    finally:
        await store.close()
    async with dispatching(settings_for(url, bot(downstream), **SLOW_POLL)):
        await eventually(lambda: len(downstream.received) == 3, within=5)
    assert [r.update_id for r in downstream.received] == [1, 2, 3]


async def test_settle_many_owned_names_the_settled_keys_whose_chat_has_more(
    postgres_storage: Storage,
) -> None:
    store = await open_store(postgres_storage.url())
    try:
        for update_id, chat in ((1, "a"), (2, "a"), (3, "b")):
            await store.add("shop", update_id, message(update_id), 0, queue_key=chat)
        claimed = await store.claim_next_owned(
            now=1, lease_until=10_000, max_attempts=3, limit=10, bots=["shop"]
        )
        assert [c.identity.update_id for c in claimed] == [1, 3]  # 2 waits for 1
        waiting: set[tuple[str, int]] = set()
        settled = await store.settle_many_owned(
            [(c.identity, Completed(2)) for c in claimed], waiting=waiting
        )
        assert settled == [True, True]
        assert waiting == {("shop", 1)}
    finally:
        await store.close()


async def test_behind_pgbouncer_a_worker_wakes_through_its_direct_listen_url(
    pgbouncer_storage: BouncedStorage, downstream: FakeDownstream
) -> None:
    # Through PgBouncer's transaction pooling a LISTEN lasts one transaction: the wake-ups
    # come over INTAKE_LISTEN_DATABASE_URL, a session of its own to the same database.
    url = pgbouncer_storage.url()
    direct = pgbouncer_storage.direct_url(str(make_url(url).database))
    behind = {"database_pgbouncer": True, "listen_database_url": direct}
    async with dispatching(settings_for(url, bot(downstream), **behind, **SLOW_POLL)) as (
        worker,
        _,
    ):
        intake_store = await open_store(url, pgbouncer=True)  # another process, through PgBouncer
        try:
            await assert_woken_by(intake_store, worker, downstream)
        finally:
            await intake_store.close()


async def test_behind_pgbouncer_without_a_listen_url_workers_poll_and_say_so_once(
    pgbouncer_storage: BouncedStorage,
    downstream: FakeDownstream,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = pgbouncer_storage.url()
    settings = settings_for(
        url, bot(downstream), database_pgbouncer=True, poll_interval_seconds=0.5
    )
    with caplog.at_level(logging.WARNING, logger="app.store.backends"):
        async with dispatching(settings) as (worker, _):
            intake_store = await open_store(url, pgbouncer=True)
            try:
                await eventually(lambda: worker.claim_passes >= 2)
                await intake_store.add("shop", 1, message(1), now_ms())
                await eventually(lambda: downstream.received, within=5)  # the next poll
            finally:
                await intake_store.close()
            assert not worker.listening.is_set()
            assert worker.problems() == []  # the listener's return is no death
    told = [r.getMessage() for r in caplog.records if "wake-ups from other" in r.getMessage()]
    assert len(told) == 1, told
    assert "INTAKE_LISTEN_DATABASE_URL" in told[0]
