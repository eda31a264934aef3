"""The dispatcher end to end, in this process: a real store on each backend, a real
downstream server, and a rival dispatcher where a test needs one. Where a test proves that
something does not happen in time, its dispatchers run on a `ManualClock` that the test moves,
and it waits for them to have looked (`looked_again`) instead of sleeping."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from pydantic import SecretStr
from standardwebhooks import Webhook
from starlette.requests import Request
from starlette.responses import Response

from app.api_keys import ApiKey
from app.dispatch import Dispatcher
from app.dispatch.dispatcher import STOP_BOUND_SECONDS
from app.main import create_app
from app.store import Claimed, ClaimIdentity, Completed, SchemaError, StoreUnavailable, open_store
from telegram_intake_kit import IntakeClient
from telegram_intake_kit.wire import Identity
from tests.conftest import Storage, serve_asgi, table_locked, table_rows
from tests.downstream import (
    DOWNSTREAM_SECRET,
    SIGNING_SECRET,
    FakeDownstream,
    ManualClock,
    Received,
    bot,
    by_attempt,
    dispatching,
    eventually,
    hang,
    looked_again,
    message,
    now_ms,
    ok,
    settings_for,
    status,
)

COLUMNS = ("update_id", "state", "attempts", "error")


def rows(url: str, *columns: str) -> list[tuple[Any, ...]]:
    """The table now (only while no dispatcher runs in this loop: it blocks the loop)."""
    return table_rows(url, *(columns or COLUMNS))


async def until(
    url: str, holds: Callable[[list[tuple[Any, ...]]], bool], *columns: str, within: float = 15
) -> list[tuple[Any, ...]]:
    """Poll the table, off the event loop, until `holds(rows)`; the rows."""

    async def check() -> list[tuple[Any, ...]] | None:
        found = await asyncio.to_thread(table_rows, url, *(columns or COLUMNS))
        return found if holds(found) else None

    result: list[tuple[Any, ...]] = await eventually(check, within=within)
    return result


async def test_dispatch_forwards_the_body_byte_for_byte_with_identity_and_signature(
    storage: Storage, downstream: FakeDownstream
) -> None:
    url = storage.url()
    body = message(7, text="byte for byte: ünïcödé, spaces  and \\u escapes")
    async with dispatching(settings_for(url, bot(downstream))) as (_, store):
        assert await store.add("shop", 7, body, now_ms(), update_type="message", queue_key="c:42")
        await until(url, lambda r: r[0][1] == "completed")
    (seen,) = downstream.received
    assert seen.body == body.encode()
    assert seen.headers["content-type"] == "application/json"
    assert seen.headers["x-telegram-bot-api-secret-token"] == DOWNSTREAM_SECRET
    assert seen.headers["x-intake-bot"] == "shop"
    assert seen.headers["x-intake-update-id"] == "7"
    assert seen.headers["x-intake-attempt"] == "1"
    (claim_id,) = rows(url, "claim_id")[0]
    assert seen.headers["x-intake-claim-id"] == claim_id
    assert int(seen.headers["x-intake-lease-expires-at"]) > now_ms()
    assert seen.headers["webhook-id"] == "shop:7"
    Webhook(SIGNING_SECRET).verify(seen.body, seen.headers)  # raises if tampered
    assert rows(url) == [(7, "completed", 1, None)]


async def test_dispatch_retries_a_500_and_then_completes(
    storage: Storage, downstream: FakeDownstream
) -> None:
    downstream.answer = by_attempt(status(500), ok)
    url = storage.url()
    async with dispatching(settings_for(url, bot(downstream))) as (_, store):
        await store.add("shop", 1, message(1), now_ms())
        await until(url, lambda r: r[0][1] == "completed")
    assert [r.attempt for r in downstream.received] == [1, 2]
    assert rows(url)[0][:3] == (1, "completed", 2)


async def test_dispatch_honours_retry_after_on_429(
    storage: Storage, downstream: FakeDownstream
) -> None:
    downstream.answer = by_attempt(status(429, {"Retry-After": "1"}), ok)
    url = storage.url()
    clock = ManualClock()
    async with dispatching(settings_for(url, bot(downstream)), clock=clock) as (worker, store):
        await store.add("shop", 1, message(1), worker.clock.now())  # due by the clock it reads
        await until(url, lambda r: r[0][1] == "failed")
        # Due again a second after the 429, by the clock the worker read (standing still).
        await until(url, lambda r: r == [(worker.clock.now() + 1_000,)], "due_at")
        # The backoff alone would be at most 50 ms; the downstream asked for one second.
        clock.advance(0.99)
        await looked_again(worker)
        assert len(downstream.received) == 1
        clock.advance(0.02)
        await until(url, lambda r: r[0][1] == "completed")
    assert [r.attempt for r in downstream.received] == [1, 2]


async def test_a_terminal_4xx_becomes_an_exhaustion_delivered_and_acknowledged(
    storage: Storage, downstream: FakeDownstream
) -> None:
    downstream.answer = status(404)
    url = storage.url()
    shop = bot(downstream, exhaustion_url=f"{downstream.url}/exhausted")
    body = message(3)
    async with dispatching(settings_for(url, shop)) as (_, store):
        await store.add("shop", 3, body, now_ms())
        await until(url, lambda r: r[0][0] is not None, "acknowledged_at")
    assert len(downstream.received) == 1  # a terminal answer is not retried
    (record,) = downstream.exhaustions
    state, attempts, claim_id, error = rows(url, "state", "attempts", "claim_id", "error")[0]
    assert (state, attempts) == ("abandoned", 1)
    assert error.startswith("HTTP 404")
    assert record.headers["idempotency-key"] == f"shop:3:1:{claim_id}"
    payload = json.loads(record.body)
    assert payload["update"] == json.loads(body)
    assert (payload["bot"], payload["update_id"], payload["attempt"]) == ("shop", 3, 1)
    assert payload["claim_id"] == claim_id
    assert payload["error"] == error
    Webhook(SIGNING_SECRET).verify(record.body, record.headers)


async def test_an_exhaustion_undelivered_before_a_restart_keeps_its_backoff_after_it(
    storage: Storage, downstream: FakeDownstream
) -> None:
    """The backoff of a failed exhaustion delivery is kept in the row (issue 14, item 4): a
    restart neither resets it nor forgets the exhaustion."""
    downstream.answer = status(400)
    downstream.exhaustion_answer = status(503)  # the exhaustion_url is down
    url = storage.url()
    shop = bot(downstream, exhaustion_url=f"{downstream.url}/exhausted")
    settings = settings_for(url, shop, exhaustion_retry_seconds=1)
    async with dispatching(settings) as (_, store):
        await store.add("shop", 1, message(1), now_ms())
        await until(url, lambda r: r[0][1] == 1, "acknowledged_at", "deliveries")
    [(due, deliveries, acknowledged_at)] = rows(
        url, "delivery_due_at", "deliveries", "acknowledged_at"
    )
    assert (deliveries, acknowledged_at) == (1, None)
    arrived: list[int] = []

    async def accept(received: Received, request: object) -> object:
        arrived.append(now_ms())
        return await ok(received, request)  # type: ignore[arg-type]

    downstream.exhaustion_answer = accept  # type: ignore[assignment]
    async with dispatching(settings):
        await until(url, lambda r: r[0][0] is not None, "acknowledged_at")
    assert len(arrived) == 1
    assert arrived[0] >= due  # not before the backoff the first process set
    assert len(downstream.received) == 1


async def test_three_workers_deliver_each_exhaustion_once(
    storage: Storage, downstream: FakeDownstream
) -> None:
    """Issue 14, item 4: with every worker sweeping, a slow exhaustion_url received each
    exhaustion up to three times (30 delivered 70 times); a lease in the row makes it once."""

    async def slow(received: Received, request: object) -> object:
        await asyncio.sleep(0.5)
        return await ok(received, request)  # type: ignore[arg-type]

    downstream.answer = status(400)
    downstream.exhaustion_answer = slow  # type: ignore[assignment]
    url = storage.url()
    shop = bot(downstream, exhaustion_url=f"{downstream.url}/exhausted", ordering="none")
    settings = settings_for(url, shop, exhaustion_retry_seconds=0.2)
    async with (
        dispatching(settings) as (_, store),
        dispatching(settings),
        dispatching(settings),
    ):
        for update_id in range(1, 31):
            await store.add("shop", update_id, message(update_id), now_ms())
        await until(url, lambda r: all(row[0] is not None for row in r) and len(r) == 30,
                    "acknowledged_at", within=30)  # fmt: skip
    delivered = sorted(json.loads(r.body)["update_id"] for r in downstream.exhaustions)
    assert delivered == list(range(1, 31))


async def test_a_failing_exhaustion_does_not_starve_the_ones_after_it(
    storage: Storage, downstream: FakeDownstream
) -> None:
    async def first_fails(received: Received, request: object) -> object:
        code = 500 if json.loads(received.body)["update_id"] == 1 else 200
        return await status(code)(received, request)  # type: ignore[arg-type]

    downstream.answer = status(400)
    downstream.exhaustion_answer = first_fails  # type: ignore[assignment]
    url = storage.url()
    shop = bot(downstream, exhaustion_url=f"{downstream.url}/exhausted", ordering="none")
    async with dispatching(settings_for(url, shop)) as (_, store):
        for update_id in range(1, 6):
            await store.add("shop", update_id, message(update_id, chat=update_id), now_ms())
        await until(
            url,
            lambda r: [a is not None for (a,) in r] == [False, True, True, True, True],
            "acknowledged_at",
        )


async def test_a_202_defers_the_settle_to_the_downstream_which_settles_through_the_api(
    storage: Storage, downstream: FakeDownstream
) -> None:
    async def answer(received: Received, request: Request) -> Response:
        return await (status(202) if received.update_id == 5 else ok)(received, request)

    downstream.answer = answer
    url = storage.url()
    key = "deferring-downstream.key"
    settings = settings_for(url, bot(downstream), api_keys=(ApiKey(key=SecretStr(key)),))
    app = create_app(settings, workers=True)
    async with serve_asgi(app) as service, IntakeClient(service, key) as intake:
        worker: Dispatcher = app.state.dispatcher  # runs in the server's thread
        store = await open_store(url)
        try:
            # Two updates of one chat: the second waits for the first's settle.
            await store.add("shop", 5, message(5), now_ms(), queue_key="42")
            await store.add("shop", 6, message(6), now_ms(), queue_key="42")
        finally:
            await store.close()
        await eventually(lambda: downstream.received)
        (seen,) = downstream.received
        identity = Identity(
            bot="shop",
            update_id=5,
            attempt=int(seen.headers["x-intake-attempt"]),
            claim_id=seen.headers["x-intake-claim-id"],
        )
        # The attempt has ended without a settle, and the claim loop has looked since: the
        # chat's next update stays behind the deferred one.
        await eventually(lambda: worker.in_flight == 0)
        await looked_again(worker)
        assert rows(url)[0][1] == "processing"
        assert [r.update_id for r in downstream.received] == [5]
        renewed = await intake.renew(identity, lease_ms=30_000)
        assert renewed.renewed
        assert renewed.lease_expires_at is not None
        assert renewed.lease_expires_at >= now_ms() + 29_000
        assert (await intake.settle(identity, "completed")).settled
        # The chat's next update goes out once the first is settled.
        await eventually(lambda: len(downstream.received) == 2)
        await until(url, lambda r: [state for _, state, *_ in r] == ["completed", "completed"])
        assert not (await intake.settle(identity, "completed")).settled  # once only


async def test_an_expired_callback_query_is_exhausted_without_delivery(
    storage: Storage, downstream: FakeDownstream
) -> None:
    url = storage.url()
    body = json.dumps({"update_id": 9, "callback_query": {"id": "1", "data": "x"}})
    async with dispatching(settings_for(url, bot(downstream))) as (_, store):
        received_at = now_ms() - 151_000  # Telegram stopped waiting for the answer
        await store.add("shop", 9, body, received_at, update_type="callback_query")
        await until(url, lambda r: r[0][1] == "abandoned")
    assert rows(url) == [(9, "abandoned", 1, "expired")]
    assert rows(url, "exhausted_at")[0][0] is not None
    assert downstream.received == []


async def test_a_retry_that_would_land_after_the_deadline_expires_instead(
    storage: Storage, downstream: FakeDownstream
) -> None:
    downstream.answer = status(503, {"Retry-After": "60"})
    url = storage.url()
    body = json.dumps({"update_id": 4, "inline_query": {"id": "1", "query": "q"}})
    async with dispatching(settings_for(url, bot(downstream))) as (_, store):
        await store.add("shop", 4, body, now_ms(), update_type="inline_query")
        await until(url, lambda r: r[0][1] == "abandoned")
    assert rows(url) == [(4, "abandoned", 1, "expired")]


async def test_spent_attempts_end_as_an_exhaustion_with_the_last_error(
    storage: Storage, downstream: FakeDownstream
) -> None:
    downstream.answer = status(500)
    url = storage.url()
    async with dispatching(settings_for(url, bot(downstream, max_attempts=3))) as (_, store):
        await store.add("shop", 1, message(1), now_ms())
        await until(url, lambda r: r[0][1] == "abandoned")
    (_update_id, state, attempts, error) = rows(url)[0]
    assert (state, attempts) == ("abandoned", 3)
    assert error.startswith("attempts spent; last: HTTP 500")
    assert len(downstream.received) == 3


async def test_a_fenced_bot_abandons_on_a_terminal_answer_without_exhaustion(
    storage: Storage, downstream: FakeDownstream
) -> None:
    downstream.answer = status(403)
    url = storage.url()
    async with dispatching(settings_for(url, bot(downstream, mode="fenced"))) as (_, store):
        await store.add("shop", 1, message(1), now_ms())
        await until(url, lambda r: r[0][1] == "abandoned")
    assert rows(url, "exhausted_at", "settled_at")[0][0] is None
    assert downstream.received[0].headers["x-intake-attempt"] == "1"


async def test_chat_ordering_keeps_one_update_of_a_chat_in_flight(
    storage: Storage, downstream: FakeDownstream
) -> None:
    url = storage.url()
    async with dispatching(settings_for(url, bot(downstream))) as (_, store):
        for update_id in range(1, 31):
            chat = update_id % 3
            await store.add(
                "shop", update_id, message(update_id, chat=chat), now_ms(), queue_key=f"c:{chat}"
            )
        await until(url, lambda r: all(state == "completed" for _, state, _, _ in r))
    by_chat: dict[int, list[int]] = {}
    for seen in downstream.received:
        by_chat.setdefault(json.loads(seen.body)["message"]["chat"]["id"], []).append(
            seen.update_id
        )
    assert all(ids == sorted(ids) and len(ids) == 10 for ids in by_chat.values())


async def test_a_hung_request_loses_its_claim_when_renewal_fails_and_the_rival_completes_it(
    storage: Storage, downstream: FakeDownstream
) -> None:
    """The fence in action: worker A's request hangs and A is cut off from the database; its
    lease runs out, A cancels the request and tries to hand the update back, the rival B
    reclaims and completes, and once A is back its hand-back and its stale identity settle
    nothing."""

    downstream.answer = by_attempt(hang, ok)
    url = storage.url()
    settings = settings_for(url, bot(downstream, lease_seconds=1))
    async with dispatching(settings) as (worker_a, store_a):

        async def cut_off(*_args: object, **_kwargs: object) -> bool:
            raise StoreUnavailable("network partition (test)")

        writes = {name: getattr(store_a, name) for name in ("renew_owned", "settle_many_owned")}
        for name in writes:
            setattr(store_a, name, cut_off)
        await store_a.add("shop", 1, message(1), now_ms())
        await eventually(lambda: downstream.received)
        async with dispatching(settings):  # the rival
            await until(url, lambda r: r[0][1] == "completed")
        await eventually(lambda: downstream.received[0].disconnected)
        for name, method in writes.items():  # the partition heals
            setattr(store_a, name, method)
        await eventually(lambda: worker_a.owner_lost == 1)  # its hand-back was refused
        first = downstream.received[0]
        stale = ClaimIdentity("shop", 1, 1, first.headers["x-intake-claim-id"])
        assert not await store_a.settle_owned(stale, Completed(now_ms()))
    assert [r.attempt for r in downstream.received] == [1, 2]
    assert rows(url)[0][:3] == (1, "completed", 2)


async def test_a_long_request_keeps_its_lease_by_renewal(
    storage: Storage, downstream: FakeDownstream
) -> None:
    """Two and a half leases pass, by the clock both workers read, while the request runs:
    the owner renews each half lease, and the rival, looking all along, never finds it lapsed."""
    answered = threading.Event()

    async def slow(received: Received, request: object) -> object:
        await asyncio.to_thread(answered.wait, 30)  # set from the test's thread
        return await status(200)(received, request)  # type: ignore[arg-type]

    downstream.answer = slow  # type: ignore[assignment]
    url = storage.url()
    clock = ManualClock()
    settings = settings_for(url, bot(downstream, lease_seconds=1))
    async with (
        dispatching(settings, clock=clock) as (worker, store),
        dispatching(settings, clock=clock) as (other, _),
    ):
        due = min(worker.clock.now(), other.clock.now())  # by the clocks they read
        await store.add("shop", 1, message(1), due)
        await eventually(lambda: downstream.received)
        owner, rival = (worker, other) if worker.in_flight else (other, worker)
        try:
            for _ in range(5):
                clock.advance(0.5)  # past a third of the lease: renewal is due
                renewed_until = owner.clock.now() + 1_000
                renewed = lambda r, lease=renewed_until: r == [(lease,)]  # noqa: E731
                await until(url, renewed, "due_at", within=20)
                await looked_again(rival)
        finally:
            answered.set()
        await until(url, lambda r: r[0][1] == "completed")
        assert worker.owner_lost == other.owner_lost == 0
    assert len(downstream.received) == 1


async def test_stop_hands_unfinished_attempts_back_for_another_worker(
    storage: Storage, downstream: FakeDownstream
) -> None:
    downstream.answer = by_attempt(hang, ok)
    url = storage.url()
    settings = settings_for(url, bot(downstream, lease_seconds=60), shutdown_grace_seconds=0.2)
    async with dispatching(settings) as (_, store):
        await store.add("shop", 1, message(1), now_ms())
        await eventually(lambda: downstream.received)
    assert rows(url) == [(1, "failed", 1, None)]  # no error: nothing went wrong
    assert rows(url, "due_at")[0][0] <= now_ms()  # due at once, not in 60 s
    async with dispatching(settings):
        await until(url, lambda r: r[0][1] == "completed")
    assert [r.attempt for r in downstream.received] == [1, 2]


async def test_stop_ends_within_its_bound_while_the_database_hangs(
    postgres_storage: Storage, postgres_admin: psycopg.Connection, downstream: FakeDownstream
) -> None:
    """Issue 14, item 3: the hand-back's settle cannot commit while another session holds the
    table; before, stop retried it for as long as the lease held (here 30 s)."""
    downstream.answer = hang
    url = postgres_storage.url()
    grace = 0.2
    settings = settings_for(url, bot(downstream, lease_seconds=30), shutdown_grace_seconds=grace)
    async with dispatching(settings) as (worker, store):
        await store.add("shop", 1, message(1), now_ms())
        await eventually(lambda: downstream.received)
        async with table_locked(postgres_admin, url):
            began = time.monotonic()
            await worker.stop()
            took = time.monotonic() - began
    assert took < grace + STOP_BOUND_SECONDS + 2, took
    # Not handed back: the lease is left to lapse, and another worker retakes the update then.
    assert rows(url, "state", "attempts") == [("processing", 1)]


async def test_a_hand_back_spends_no_attempt_and_keeps_the_last_real_error(
    storage: Storage, downstream: FakeDownstream
) -> None:
    """A rolling restart during a slow handler must not exhaust the update (issue 14, item 6):
    with a budget of 2, attempt 1 fails for real, attempt 2 is handed back by a stopping
    worker, and attempt 3 still runs and completes."""
    downstream.answer = by_attempt(status(502), hang, ok)
    url = storage.url()
    shop = bot(downstream, lease_seconds=60, max_attempts=2)
    settings = settings_for(url, shop, shutdown_grace_seconds=0.2)
    async with dispatching(settings) as (_, store):
        await store.add("shop", 1, message(1), now_ms())
        await eventually(lambda: len(downstream.received) == 2)
    [(state, attempts, uncounted, error)] = rows(url, "state", "attempts", "uncounted", "error")
    assert (state, attempts, uncounted) == ("failed", 2, 1)
    assert error.startswith("HTTP 502")  # attempt 1's error, not the stop's
    async with dispatching(settings):
        await until(url, lambda r: r[0][1] == "completed")
    assert [r.attempt for r in downstream.received] == [1, 2, 3]


async def test_the_breaker_stops_claiming_while_the_downstream_is_down_then_closes(
    storage: Storage, downstream: FakeDownstream
) -> None:
    downstream.answer = status(502)
    url = storage.url()
    clock = ManualClock()  # the cool-down ends when the test says, however slow the machine
    shop = bot(
        downstream,
        ordering="none",
        breaker_failures=3,
        breaker_cooldown_seconds=1,
        max_attempts=50,
        concurrency=1,
    )
    async with dispatching(settings_for(url, shop), clock=clock) as (worker, store):
        for update_id in range(1, 11):
            body = message(update_id, chat=update_id)
            await store.add("shop", update_id, body, worker.clock.now())
        await eventually(lambda: len(downstream.received) >= 3 and worker.in_flight == 0)
        await looked_again(worker)  # within the cool-down: nothing more is tried
        assert len(downstream.received) == 3
        clock.advance(0.99)
        await looked_again(worker)  # still within it
        assert len(downstream.received) == 3
        downstream.answer = status(200)
        clock.advance(0.02)  # the cool-down is over: one probe, whose success closes it
        await until(url, lambda r: all(s == "completed" for _, s, _, _ in r), within=20)
        assert worker.owner_lost == 0
    # Ten updates and three failures: not one attempt was burned while it was down.
    assert sum(attempts for _, _, attempts, _ in rows(url)) == 13
    assert len(downstream.received) == 13


async def test_a_fenced_bot_refuses_to_start_on_a_0001_table(
    storage: Storage, downstream: FakeDownstream
) -> None:
    url = storage.url(revision="0001")
    with pytest.raises(SchemaError, match="alembic upgrade head"):
        async with dispatching(settings_for(url, bot(downstream, mode="fenced"))):
            pass


async def test_a_plain_bot_runs_on_a_0001_table_and_forwards_the_bare_update(
    storage: Storage, downstream: FakeDownstream
) -> None:
    url = storage.url(revision="0001")
    async with dispatching(settings_for(url, bot(downstream, mode="plain"))) as (_, store):
        await store.add("shop", 1, message(1), now_ms())
        await until(url, lambda r: r[0][1] == "completed")
    (seen,) = downstream.received
    assert not [name for name in seen.headers if name.startswith("x-intake-")]
    assert seen.headers["x-telegram-bot-api-secret-token"] == DOWNSTREAM_SECRET


async def test_bots_are_dispatched_independently(
    storage: Storage, downstream: FakeDownstream
) -> None:
    url = storage.url()
    shop, news = bot(downstream, "shop"), bot(downstream, "news")
    async with dispatching(settings_for(url, shop, news)) as (_, store):
        await store.add("shop", 1, message(1), now_ms())
        await store.add("news", 1, message(1), now_ms())
        await until(url, lambda r: [s for _, s, _, _ in r] == ["completed", "completed"])
    assert sorted(r.headers["x-intake-bot"] for r in downstream.received) == ["news", "shop"]


async def test_a_retry_is_picked_up_when_due_not_at_the_next_poll(
    storage: Storage, downstream: FakeDownstream
) -> None:
    downstream.answer = by_attempt(status(503, {"Retry-After": "1"}), ok)
    url = storage.url()
    async with dispatching(settings_for(url, bot(downstream), poll_interval_seconds=30)) as (
        _,
        store,
    ):
        await store.add("shop", 1, message(1), now_ms())
        await until(url, lambda r: r[0][1] == "completed", within=10)
    first, second = downstream.received
    assert 0.95 <= second.at - first.at < 5


async def test_the_database_clock_is_used_for_leases(storage: Storage) -> None:
    store = await open_store(storage.url())
    try:
        before = now_ms()
        database = await store.database_time()
        assert before - 1_000 < database < now_ms() + 1_000
    finally:
        await store.close()


async def test_a_plain_bot_is_not_starved_by_another_bots_backlog(
    storage: Storage, downstream: FakeDownstream
) -> None:
    url = storage.url(revision="0001")
    zeta = bot(downstream, "zeta", mode="plain")
    async with dispatching(settings_for(url, zeta, claim_batch=8)) as (_, store):
        for update_id in range(1, 71):  # bot alpha sorts first; no worker here serves it
            await store.add("alpha", update_id, message(update_id), now_ms())
        await store.add("zeta", 1, message(1), now_ms())
        await until(url, lambda r: ("zeta", "completed") in r, "bot", "state")
    assert [r.update_id for r in downstream.received] == [1]


async def test_a_plain_bot_honours_deadlines_too(
    storage: Storage, downstream: FakeDownstream
) -> None:
    url = storage.url(revision="0001")
    body = json.dumps({"update_id": 2, "inline_query": {"id": "1", "query": "q"}})
    async with dispatching(settings_for(url, bot(downstream, mode="plain"))) as (_, store):
        await store.add("shop", 2, body, now_ms() - 31_000, update_type="inline_query")
        await until(url, lambda r: r[0][1] == "abandoned")
    assert rows(url) == [(2, "abandoned", 1, "expired")]
    assert downstream.received == []


async def test_the_prune_loop_deletes_settled_rows_after_the_retention(
    storage: Storage, downstream: FakeDownstream
) -> None:
    url = storage.url()
    settings = settings_for(url, bot(downstream), retention_seconds=0.5, prune_interval_seconds=0.2)
    async with dispatching(settings) as (_, store):
        await store.add("shop", 1, message(1), now_ms())
        exhausted = json.dumps({"update_id": 2, "inline_query": {"id": "1", "query": "q"}})
        await store.add("shop", 2, exhausted, now_ms() - 60_000, update_type="inline_query")
        # The completed row goes after half a second; the exhaustion stays, unacknowledged.
        await until(url, lambda r: [(u, s) for u, s, _, _ in r] == [(2, "abandoned")])
    assert rows(url, "update_id", "exhausted_at", "acknowledged_at")[0][2] is None


async def test_a_probe_that_ends_unanswered_does_not_stop_the_bot_for_good(
    storage: Storage, downstream: FakeDownstream
) -> None:
    """The breaker's probe expires before it is sent: the next claim probes again, and the
    bot is delivered to once its downstream answers."""
    downstream.answer = by_attempt(status(500), ok)
    url = storage.url()
    shop = bot(
        downstream,
        ordering="none",
        breaker_failures=1,
        breaker_cooldown_seconds=0.3,
        retry_base_seconds=0.5,
        retry_cap_seconds=0.5,
    )
    async with dispatching(settings_for(url, shop)) as (_, store):
        await store.add("shop", 1, message(1), now_ms())
        await eventually(lambda: downstream.received)  # the 500 opens the breaker
        stale = json.dumps({"update_id": 2, "callback_query": {"id": "1", "data": "x"}})
        await store.add("shop", 2, stale, now_ms() - 200_000, update_type="callback_query")
        await until(url, lambda r: [s for _, s, _, _ in r] == ["completed", "abandoned"])
    assert rows(url)[1] == (2, "abandoned", 1, "expired")
    assert [(r.update_id, r.attempt) for r in downstream.received] == [(1, 1), (1, 2)]


async def test_an_attempt_cancelled_before_it_starts_gives_its_capacity_back(
    storage: Storage, downstream: FakeDownstream
) -> None:
    async with dispatching(settings_for(storage.url(), bot(downstream))) as (worker, _):
        lane = worker._lanes[0]
        identity = ClaimIdentity("shop", 1, 1, "never-claimed")
        claimed = Claimed(identity, message(1), "message", "42", now_ms(), counted=1)
        attempt = worker._claims.start(lane, claimed, now_ms() + 5_000, now_ms(), probe=False)
        assert worker.in_flight == 1
        assert attempt.task is not None
        attempt.task.cancel()  # before its first step: its coroutine never runs
        await asyncio.gather(attempt.task, return_exceptions=True)
        assert worker.in_flight == 0
        assert lane.in_flight == 0
    assert downstream.received == []


async def test_an_answered_attempt_frees_its_place_while_its_settle_commits(
    storage: Storage, downstream: FakeDownstream
) -> None:
    """The limits count requests in flight: with the settles held back, a bot limited to one
    request still forwards its next updates (other chats), and the attempts left settling are
    bounded by the process's limit once more. Each update is settled once the settles go."""
    url = storage.url()
    settings = settings_for(url, bot(downstream, concurrency=1), worker_concurrency=2)
    async with dispatching(settings) as (worker, store):
        gate = asyncio.Event()
        settle_many_owned = store.settle_many_owned

        async def held(*args: Any, **kwargs: Any) -> Any:
            await gate.wait()
            return await settle_many_owned(*args, **kwargs)

        store.settle_many_owned = held  # type: ignore[method-assign]
        for update_id in range(1, 7):
            await store.add("shop", update_id, message(update_id, chat=update_id), now_ms())
        # Two places for requests, two more for attempts settling: four forwarded, no more.
        await eventually(lambda: len(downstream.received) == 4 and worker.in_flight == 4)
        # At its limit the claim loop waits for a place or its poll (0.2 s): give it turns.
        await asyncio.sleep(0.6)
        assert len(downstream.received) == 4
        states = sorted(state for _, state, _, _ in await asyncio.to_thread(rows, url))
        assert states == ["pending"] * 2 + ["processing"] * 4
        gate.set()
        await until(url, lambda r: all(state == "completed" for _, state, _, _ in r))
    assert sorted(r.update_id for r in downstream.received) == [1, 2, 3, 4, 5, 6]
    assert all(r.attempt == 1 for r in downstream.received)
