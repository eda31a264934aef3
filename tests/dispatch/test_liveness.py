"""A worker's /healthz tells the truth: it fails when a loop of the dispatcher died or stalled."""

from __future__ import annotations

import asyncio

import httpx

from app.dispatch.liveness import Liveness
from app.metrics import Metrics
from app.worker import health_app
from tests.conftest import Storage, serve_asgi
from tests.downstream import (
    FakeDownstream,
    ManualClock,
    bot,
    dispatching,
    eventually,
    looked_again,
    settings_for,
)


async def test_a_loop_that_raised_or_was_cancelled_died_and_one_that_returned_did_not() -> None:
    async def raises() -> None:
        raise RuntimeError("a bug")

    async def returns() -> None:
        return

    async def waits() -> None:
        await asyncio.Event().wait()

    tasks = {name: asyncio.create_task(job()) for name, job in (("a", raises), ("b", returns))}
    cancelled = asyncio.create_task(waits())
    running = asyncio.create_task(waits())
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.gather(*tasks.values(), cancelled, return_exceptions=True)
    liveness = Liveness(stall_seconds=60)
    everything = {**tasks, "c": cancelled, "d": running}
    assert liveness.problems(everything) == ["a died", "c died"]
    running.cancel()


def test_a_loop_without_a_turn_past_the_stall_limit_has_stalled() -> None:
    clock = ManualClock()
    liveness = Liveness(stall_seconds=120, monotonic_ns=clock.monotonic_ns)
    beat = liveness.beater("claim loop")
    clock.advance(120)
    assert liveness.problems({}) == []  # at the limit: still alive
    clock.advance(1)
    assert liveness.problems({}) == ["claim loop stalled: no turn for 121 s"]
    beat()
    assert liveness.problems({}) == []


async def test_the_worker_healthz_fails_when_the_claim_loop_died(
    storage: Storage, downstream: FakeDownstream
) -> None:
    settings = settings_for(storage.url(), bot(downstream))
    async with dispatching(settings) as (worker, store):
        app = health_app(settings, store, worker, Metrics.of(settings))
        async with serve_asgi(app) as base, httpx.AsyncClient() as client:
            healthy = await client.get(f"{base}/healthz")
            assert worker.problems() == []
            worker._claim_loop.cancel()  # type: ignore[union-attr]  # as a bug would end it
            await eventually(lambda: worker.problems(), within=5)
            unhealthy = await client.get(f"{base}/healthz")
    assert (healthy.status_code, healthy.json()) == (200, {"status": "ok"})
    assert unhealthy.status_code == 503
    assert unhealthy.json() == {"status": "unhealthy", "problems": ["claim loop died"]}


async def test_a_claim_loop_stuck_in_the_database_is_reported_stalled(
    storage: Storage, downstream: FakeDownstream
) -> None:
    clock = ManualClock()
    settings = settings_for(storage.url(), bot(downstream), worker_stall_seconds=30)
    async with dispatching(settings, clock=clock) as (worker, store):
        await looked_again(worker)
        entered, release = asyncio.Event(), asyncio.Event()
        claim = store.claim_next_owned

        async def hangs(**arguments: object) -> object:
            entered.set()
            await release.wait()  # a statement that does not come back
            return await claim(**arguments)  # type: ignore[arg-type]

        store.claim_next_owned = hangs  # type: ignore[method-assign]
        worker.wake()
        await asyncio.wait_for(entered.wait(), 5)
        clock.advance(31)
        assert any(p.startswith("claim loop stalled") for p in worker.problems())
        store.claim_next_owned = claim  # type: ignore[method-assign]
        release.set()
        await eventually(lambda: worker.problems() == [], within=5)  # each loop beat again
