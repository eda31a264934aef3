"""Operator control (docs/contract.md section 9) as an operator meets it: real `telegram-intake
worker` and `serve` processes on one PostgreSQL database (and a `run` process on SQLite), a real
downstream recording every arrival with its time and X-Intake-Attempt, and the database's own
record of each attempt (`telegram_updates_attempts.started_at`) as the witness of when an
attempt started.

- a pause through the API binds both worker processes (on SQLite: the one `run` process): no
  attempt starts later than 1 s after the pause returned (attempts in flight finish), the
  intake keeps answering 200 and recording, resume wakes the workers at once (their poll is
  far longer), and per-chat order holds;
- a redrive of 10,000 exhaustions paced at 500/s delivers every one once, in chat order, its
  attempt numbers continuing, never ahead of the pacing;
- a rate limit holds across 1, 2 and 4 worker processes (on SQLite: in a `run` process),
  measured over a steady window, and a throttled update spends no attempt; and the rate
  limiter's bucket never turns its clock back (what let 4 processes exceed the limit).

Each test starts its processes with an explicit environment, logs each one's output to files
under tmp_path (printed when a check fails), and kills whatever is still running at the end.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import Response

from app.intake.updates import classify
from app.store import NewUpdate, open_store
from tests.conftest import Storage, table_rows
from tests.downstream import Answer, FakeDownstream, Received, eventually, message, ok
from tests.processes import SECRET, Process, environment, free_port, processes

pytestmark = pytest.mark.slow

STARTUP = 30.0  # a cold interpreter importing the app, on a loaded machine
KEY = "control-operator.key-0123456789"  # full access: the operator scope included
AUTH = {"Authorization": f"Bearer {KEY}"}
WEBHOOK = {"X-Telegram-Bot-Api-Secret-Token": SECRET, "Content-Type": "application/json"}
ATTEMPTS = "telegram_updates_attempts"


# -- helpers ----------------------------------------------------------------------------------


def now_ms() -> int:
    """Epoch ms by this host's clock: the database's too (the server runs on this host), and
    so every process's `DatabaseClock` to within a round trip."""
    return time.time_ns() // 1_000_000


def interleaved(chats: int, rounds: range, first_chat: int = 1000) -> list[tuple[int, int]]:
    """`(update_id, chat)` as Telegram numbers them: chat c's k-th update is k*chats + c + 1."""
    return [(k * chats + c + 1, first_chat + c) for k in rounds for c in range(chats)]


async def add_messages(url: str, updates: Sequence[tuple[int, int]]) -> None:
    """Record `(update_id, chat)` messages of bot `default`, keyed as the intake keys them."""
    rows = []
    for update_id, chat in updates:
        body = message(update_id, chat=chat)
        update_type, queue_key = classify(json.loads(body))
        rows.append(NewUpdate("default", update_id, body, now_ms(), update_type, queue_key))
    store = await open_store(url)
    try:
        for start in range(0, len(rows), 2_000):
            await store.add_many(rows[start : start + 2_000])
    finally:
        await store.close()


async def exhaust_all(url: str) -> None:
    """Make every recorded update of bot `default` an open exhaustion, its one attempt spent,
    in two statements: a claim with a budget of one attempt takes every row on a lease that
    lapses at once (the worker that took them died), and the next claim, meeting each spent,
    ends it as a durable exhaustion (the path every exhaustion of a lost last attempt takes;
    a transaction per update would make the setup, not the test, the slow part)."""
    store = await open_store(url)
    try:
        taken = now_ms()
        for now in (taken, taken + 2):  # the lease is live until taken + 1, lapsed after
            await store.claim_next_owned(
                now=now,
                lease_until=now + 1,
                max_attempts=1,
                limit=100_000,
                ordering="none",
                bots=["default"],
                durable_exhaustion=True,
            )
    finally:
        await store.close()


def attempt_starts(url: str) -> list[tuple[int, int, int, int | None, str | None]]:
    """Every attempt the database recorded: (update_id, attempt, started_at, ended_at,
    outcome)."""
    rows = table_rows(
        url, "update_id", "attempt", "started_at", "ended_at", "outcome", table=ATTEMPTS
    )
    return [(int(u), int(a), int(s), e, o) for u, a, s, e, o in rows]


def assert_chat_order(received: Sequence[Received], chat_of: dict[int, int]) -> None:
    """Each chat's arrivals in update_id order (a retry may repeat the update it retries)."""
    per_chat: dict[int, list[int]] = defaultdict(list)
    for arrival in received:
        order = per_chat[chat_of[arrival.update_id]]
        if not order or order[-1] != arrival.update_id:
            order.append(arrival.update_id)
    for chat, order in per_chat.items():
        assert order == sorted(set(order)), f"chat {chat} delivered out of order: {order}"


def assert_each_once(received: Sequence[Received], url: str, expected: set[int]) -> None:
    """Every expected update arrived, each once per attempt number, and the attempts it took
    are the attempts its row counts (a retry would be a legitimate second arrival)."""
    by_update: dict[int, list[int]] = defaultdict(list)
    for arrival in received:
        by_update[arrival.update_id].append(arrival.attempt)
    assert set(by_update) == expected
    attempts = {int(u): int(a) for u, a in table_rows(url, "update_id", "attempts")}
    for update_id, numbers in by_update.items():
        assert len(numbers) == len(set(numbers)), f"{update_id}: an attempt arrived twice"
        assert max(numbers) == attempts[update_id], (update_id, numbers)


def assert_clean(*children: Process) -> None:
    for child in children:
        log = child.stderr
        assert child.poll() is None, child.report()
        assert "Traceback" not in log, child.report()
        assert '"level": "ERROR"' not in log, child.report()
        assert '"level": "INFO"' in log, "no JSON log lines: the check is blind"


async def healthy(client: httpx.AsyncClient, child: Process, base: str) -> None:
    async def answers() -> bool:
        assert child.poll() is None, child.report()
        try:
            return (await client.get(f"{base}/healthz")).status_code == 200
        except httpx.TransportError:
            return False

    await eventually(answers, within=STARTUP)


POST_RATE = 100.0  # updates a second: 400 take 4 s


async def post_updates(
    client: httpx.AsyncClient, base: str, updates: Sequence[tuple[int, int]]
) -> list[tuple[int, int, float]]:
    """POST each update to the intake in turn, as Telegram does, at most POST_RATE a second
    (so that posting spans the pause whatever the intake's speed): (update_id, status, when
    the answer came, monotonic)."""
    answers = []
    started = time.monotonic()
    for sent, (update_id, chat) in enumerate(updates):
        await asyncio.sleep(max(0.0, started + sent / POST_RATE - time.monotonic()))
        response = await client.post(
            f"{base}/telegram/default", content=message(update_id, chat=chat), headers=WEBHOOK
        )
        answers.append((update_id, response.status_code, time.monotonic()))
    return answers


def slow(seconds: float) -> Answer:
    """A downstream that takes `seconds` to answer 200: attempts are in flight for a while."""

    async def answer(received: Received, request: Request) -> Response:
        await asyncio.sleep(seconds)
        return await ok(received, request)

    return answer


# -- pause and resume -------------------------------------------------------------------------


async def pause_and_resume(
    url: str, downstream: FakeDownstream, client: httpx.AsyncClient, base: str, label: str
) -> None:
    """Both backends' scenario: Telegram posts 400 updates over 20 chats to the intake at
    `base`, one after another, while a downstream that takes 0.3 s an update receives them;
    once 30 have arrived (attempts are in flight), an operator pauses the bot through the API,
    holds it paused at least 3 s (Telegram still posting), and resumes it. Then:

    - from 1 s after the pause returned until resume was asked no attempt started, by the
      database's record of each attempt (`started_at`), and nothing arrived downstream; while
      the bot had work all along (its updates waiting) and the attempts in flight at the pause
      finished, completed;
    - every POST answered 200, and every update was recorded, paused or not;
    - the first arrival after resume came within 2 s (the workers' poll is 5 s: the resume
      woke them);
    - every update arrived once (a retry, should one happen, is the only second arrival),
      each chat's in update_id order across the pause."""
    chats = 20
    updates = interleaved(chats, range(20))  # 400 updates, 20 a chat
    chat_of = dict(updates)
    # The downstream takes 0.3 s an update; while `gate` is closed it holds every request it
    # gets, so that attempts are surely in flight when the pause comes, however loaded the
    # machine is (the pause is asked once one is held, and the gate opens after it returned).
    gate = asyncio.Event()
    gate.set()
    held: list[Received] = []

    async def gated(received: Received, request: Request) -> Response:
        if not gate.is_set():
            held.append(received)
            await gate.wait()
        return await slow(0.3)(received, request)

    downstream.answer = gated

    # Telegram keeps posting throughout; the pause comes while attempts are in flight.
    posting = asyncio.create_task(post_updates(client, base, updates))
    await eventually(lambda: len(downstream.received) >= 30, within=30)
    gate.clear()
    await eventually(lambda: bool(held), within=30)
    response = await client.post(
        f"{base}/v1/bots/default/pause", json={"reason": "maintenance"}, headers=AUTH
    )
    paused_at, paused_mono = now_ms(), time.monotonic()
    gate.set()
    assert response.status_code == 200, response.text
    assert response.json() == {"bot": "default", "changed": True}

    # Paused: the intake still answers 200 to every update, and records each.
    answers = await posting
    assert {code for _, code, _ in answers} == {200}
    while_paused = [u for u, _, answered in answers if answered > paused_mono]
    assert len(while_paused) >= 100, "too few updates came in while paused"
    recorded = {int(u) for (u,) in table_rows(url, "update_id")}
    assert recorded == set(chat_of)
    await asyncio.sleep(max(0.0, paused_mono + 3.0 - time.monotonic()))
    held_at = now_ms()
    states = Counter(state for (state,) in table_rows(url, "state"))
    bots = (await client.get(f"{base}/v1/bots", headers=AUTH)).json()["items"]
    assert (bots[0]["paused"], bots[0]["paused_reason"]) == (True, "maintenance")

    resume_at, resume_mono = now_ms(), time.monotonic()
    response = await client.post(f"{base}/v1/bots/default/resume", headers=AUTH)
    assert response.status_code == 200, response.text
    assert response.json() == {"bot": "default", "changed": True}

    # Resume woke the workers: an arrival long before their 5 s poll.
    await eventually(lambda: any(r.at > resume_mono for r in downstream.received), within=10)
    woke = min(r.at for r in downstream.received if r.at > resume_mono) - resume_mono
    await eventually(lambda: len(downstream.received) >= len(chat_of), within=60)
    await eventually(lambda: {s for (s,) in table_rows(url, "state")} == {"completed"}, within=15)
    await asyncio.sleep(0.5)  # a duplicate would arrive now, if at all
    received = downstream.received
    history = attempt_starts(url)

    # While paused (from 1 s after the pause returned until resume was asked): no attempt
    # started, by the database's record, and nothing arrived downstream.
    started_paused = [h for h in history if paused_at + 1_000 < h[2] < resume_at]
    assert started_paused == [], started_paused
    arrived_paused = [r for r in received if paused_mono + 1.0 < r.at < resume_mono]
    assert arrived_paused == [], [(r.update_id, r.at - paused_mono) for r in arrived_paused]
    last_start = max(h[2] for h in history if h[2] < resume_at) - paused_at
    # The workers had work all along: the pause, not an empty queue, held them.
    assert states["pending"] >= len(while_paused), states
    assert states["processing"] == 0, states  # attempts in flight at the pause finished
    in_flight = [h for h in history if h[2] <= paused_at and (h[3] or 0) > paused_at]
    assert in_flight, "no attempt was in flight at the pause: the test proves less"
    assert {h[4] for h in in_flight} == {"completed"}
    assert woke < 2.0, f"the first attempt after resume came {woke:.2f} s later"

    assert_each_once(received, url, set(chat_of))
    assert_chat_order(received, chat_of)
    print(
        f"\npause ({label}): the last attempt before resume started {last_start} ms after the "
        f"pause returned; {len(in_flight)} in flight at the pause finished; "
        f"{len(while_paused)} posted while paused; {states['pending']} waiting after "
        f"{(held_at - paused_at) / 1000:.1f} s paused; the first arrival "
        f"{woke * 1000:.0f} ms after resume"
    )


async def test_a_pause_binds_two_worker_processes_and_resume_wakes_them(
    postgres_storage: Storage, downstream: FakeDownstream, tmp_path: Path
) -> None:
    """`pause_and_resume` on PostgreSQL: a `serve` process (the intake and the API) and two
    `worker` processes, each with at most 6 requests in flight and 6 attempts settling (12 < 20
    chats: both always have work) and a 5 s poll: only the pause in the claim statement holds
    them, and only the resume's NOTIFY wakes them sooner than the poll."""
    url = postgres_storage.url()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = environment(url, f"{downstream.url}/hook", worker_concurrency=6, poll_interval_seconds=5)
    with processes(tmp_path) as start:
        serve = start("serve", environment(url, None, port=port, api_keys=KEY), "serve")
        workers = [start(f"worker-{name}", env, "worker") for name in ("a", "b")]
        async with httpx.AsyncClient(timeout=10) as client:
            await healthy(client, serve, base)
            for worker in workers:
                await eventually(worker.started, within=STARTUP)
            await pause_and_resume(url, downstream, client, base, "postgresql, 2 workers")
        assert_clean(serve, *workers)


async def test_a_pause_binds_a_run_process_on_sqlite_and_resume_wakes_it(
    sqlite_storage: Storage, downstream: FakeDownstream, tmp_path: Path
) -> None:
    """`pause_and_resume` on SQLite: one `run` process (intake, API and worker together, as
    SQLite runs), 12 attempts in flight at most and a 5 s poll: the resume's own wake-up, not
    the poll, brings the first attempt after it."""
    url = sqlite_storage.url()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = environment(
        url,
        f"{downstream.url}/hook",
        port=port,
        api_keys=KEY,
        worker_concurrency=12,
        poll_interval_seconds=5,
    )
    with processes(tmp_path) as start:
        run = start("run", env, "run")
        async with httpx.AsyncClient(timeout=10) as client:
            await healthy(client, run, base)
            await pause_and_resume(url, downstream, client, base, "sqlite, 1 run process")
        assert_clean(run)


# -- redrive ----------------------------------------------------------------------------------


async def test_a_paced_redrive_of_10000_exhaustions_delivers_each_once_in_chat_order(
    postgres_storage: Storage, downstream: FakeDownstream, tmp_path: Path
) -> None:
    """10,000 open exhaustions over 100 chats, redriven by filter through the API at 500/s
    while two worker processes run: each arrives exactly once, as its second attempt (the
    numbers continue), each chat in order; and the pacing holds throughout: by t seconds after
    the redrive was asked at most 500*t + 1 updates can be due, so the k-th arrival (from 0)
    comes no sooner than k/500 s after it; the last one no sooner than ~20 s."""
    url = postgres_storage.url()
    chats, rate = 100, 500.0
    updates = interleaved(chats, range(100))
    chat_of = dict(updates)
    setup = time.monotonic()
    await add_messages(url, updates)
    await exhaust_all(url)
    setup = time.monotonic() - setup
    assert Counter(table_rows(url, "state", "attempts")) == {("abandoned", 1): len(updates)}

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with processes(tmp_path) as start:
        serve = start("serve", environment(url, None, port=port, api_keys=KEY), "serve")
        workers = [
            start(f"worker-{name}", environment(url, f"{downstream.url}/hook"), "worker")
            for name in ("a", "b")
        ]
        async with httpx.AsyncClient(timeout=60) as client:
            await healthy(client, serve, base)
            for worker in workers:
                await eventually(worker.started, within=STARTUP)
            await asyncio.sleep(0.5)
            assert downstream.received == []  # exhaustions are not delivered again by themselves

            asked = time.monotonic()
            response = await client.post(
                f"{base}/v1/exhaustions/redrive",
                json={"filter": {"bot": "default"}, "rate_per_second": rate},
                headers=AUTH,
            )
            answered = time.monotonic() - asked
            assert response.status_code == 200, response.text
            assert response.json()["matched"] == response.json()["redriven"] == len(updates)

        await eventually(lambda: len(downstream.received) >= len(updates), within=90)
        await eventually(
            lambda: {s for (s,) in table_rows(url, "state")} == {"completed"}, within=15
        )
        await asyncio.sleep(0.5)  # a duplicate would arrive now, if at all
        received = downstream.received

        assert len(received) == len(updates), "some update arrived more than once"
        assert sorted(r.update_id for r in received) == sorted(chat_of)
        # The attempt numbers continue: 2, or more where a forward failed on a loaded machine
        # (one CI run: the breaker opened after five in a row) and was retried; never 1.
        assert min(r.attempt for r in received) == 2
        assert_chat_order(received, chat_of)
        arrived = {r.update_id: r.attempt for r in received}  # each row counts its own
        rows = table_rows(url, "update_id", "state", "attempts")
        assert {(int(u), s, int(a)) for u, s, a in rows} == {
            (update_id, "completed", attempt) for update_id, attempt in arrived.items()
        }

        # Paced: the k-th arrival no sooner than k/rate after the redrive was asked (its `at`
        # is later still), less 50 ms for the processes' clocks agreeing to within a sync.
        times = sorted(r.at - asked for r in received)
        early = [(k, t) for k, t in enumerate(times) if t < k / rate - 0.05]
        assert early == [], early[:10]
        took = times[-1]
        assert took >= len(updates) / rate * 0.9
        lag = max(t - k / rate for k, t in enumerate(times))
        per_second = Counter(int(t) for t in times)
        print(
            f"\nredrive (postgresql, 2 workers): setup {setup:.1f} s; the API answered in "
            f"{answered:.1f} s; 10,000 delivered {took:.1f} s after the redrive "
            f"(paced: {len(updates) / rate:.0f} s); at most {lag:.2f} s behind the pacing; "
            f"arrivals a second: {[per_second[second] for second in range(int(took) + 1)]}"
        )
        assert_clean(serve, *workers)


# -- the rate limit ---------------------------------------------------------------------------

LIMIT = 50.0  # attempts a second, for every worker process together
WINDOW = 8.0  # seconds measured, once every process runs and a second of warm-up has passed


async def limited_backlog(url: str) -> None:
    """3,000 updates over 500 chats (a minute's backlog at the limit), the limit set."""
    await add_messages(url, interleaved(500, range(6)))
    store = await open_store(url)
    try:
        await store.set_rate_limit("default", LIMIT, at=now_ms(), by="test")
    finally:
        await store.close()


async def measure_rate(
    url: str, downstream: FakeDownstream, children: list[Process], label: str
) -> None:
    """Once every process has started and a first update arrived, a second of warm-up, then
    an 8 s window: the attempts started in it (the database's `started_at`) and the arrivals
    downstream are within 10% of the limit (see the rate test for the allowance); every
    process (named by its hook URL's `worker`) took a share; and no throttled update spent an
    attempt."""
    delivered_by: dict[int, str] = {}

    async def answer(received: Received, request: Request) -> Response:
        delivered_by[received.update_id] = request.query_params["worker"]
        return await ok(received, request)

    downstream.answer = answer
    await eventually(lambda: downstream.received, within=STARTUP)
    begin = time.monotonic() + 1.0  # the warm-up
    begin_ms = now_ms() + 1_000
    await asyncio.sleep(1.0 + WINDOW + 0.5)
    end = begin + WINDOW
    history = attempt_starts(url)
    # Every attempt started by now arrives (on a loaded machine, not always within 0.5 s).
    started_ids = {h[0] for h in history}
    await eventually(lambda: started_ids <= {r.update_id for r in downstream.received}, within=90)
    received = downstream.received
    rows = table_rows(url, "state", "attempts")

    arrived = [r for r in received if begin <= r.at < end]
    started = [h for h in history if begin_ms <= h[2] < begin_ms + WINDOW * 1000]
    shares = Counter(delivered_by[r.update_id] for r in arrived)
    print(
        f"\nrate limit {LIMIT:.0f}/s, {label}: {len(started) / WINDOW:.2f} attempts started "
        f"a second, {len(arrived) / WINDOW:.2f} arrivals a second over {WINDOW:.0f} s; "
        f"shares {dict(sorted(shares.items()))}; {len(received)} delivered in all"
    )
    for measured in (len(arrived), len(started)):
        assert measured <= 1.10 * LIMIT * WINDOW + 2, (measured, label)
        assert measured >= 0.90 * LIMIT * WINDOW, (measured, label)
    names = {child.name.removeprefix("worker-") for child in children}
    assert set(shares) == names, shares  # every process took tokens of the one bucket

    # A throttled update spends no attempt: every one delivered went as attempt 1, and the
    # rows still waiting have spent none.
    assert {r.attempt for r in received} == {1}
    assert {h[1] for h in history} == {1}
    assert {h[0] for h in history} <= {r.update_id for r in received}
    states = Counter(rows)
    assert set(states) <= {("pending", 0), ("processing", 1), ("completed", 1)}, states
    assert states[("pending", 0)] > 0, "the backlog ran out: the limit was not what held it"
    assert_clean(*children)


@pytest.mark.parametrize("count", [1, 2, 4])
async def test_a_rate_limit_holds_across_worker_processes(
    count: int, postgres_storage: Storage, downstream: FakeDownstream, tmp_path: Path
) -> None:
    """A bot limited to 50 attempts a second, with a backlog far larger, served by `count`
    worker processes on PostgreSQL: `measure_rate`, whichever the number of processes.

    The bucket holds at most a second's worth of tokens, so a window may in principle open
    on a full bucket and let 50 more through. The warm-up drains the burst the bucket saved
    while the processes started; from then on, under a backlog, every take empties the
    bucket to below one token (what a claim could not use goes back and is taken at once), so
    the window's allowance is 2 attempts beyond the 10%: the fraction of a token at its start
    and an attempt started just before it that arrives just after it."""
    url = postgres_storage.url()
    await limited_backlog(url)
    with processes(tmp_path) as start:
        workers = [
            start(
                f"worker-{name}", environment(url, f"{downstream.url}/hook?worker={name}"), "worker"
            )
            for name in "abcd"[:count]
        ]
        for worker in workers:
            await eventually(worker.started, within=STARTUP)
        await measure_rate(url, downstream, workers, f"postgresql, {count} worker process(es)")


async def test_a_rate_limit_holds_in_a_run_process_on_sqlite(
    sqlite_storage: Storage, downstream: FakeDownstream, tmp_path: Path
) -> None:
    """`measure_rate` on SQLite, in one `run` process."""
    url = sqlite_storage.url()
    await limited_backlog(url)
    port = free_port()
    env = environment(url, f"{downstream.url}/hook?worker=run", port=port)
    with processes(tmp_path) as start:
        run = start("run", env, "run")
        await eventually(lambda: run.answers(f"http://127.0.0.1:{port}/healthz"), within=STARTUP)
        await measure_rate(url, downstream, [run], "sqlite, 1 run process")


async def test_the_bucket_s_clock_never_goes_back(storage: Storage) -> None:
    """The fix the 4-process measurement called for (`take_tokens`): a take whose `now` is
    behind the bucket's last refill (read before it waited for the bucket's lock, or on a
    process whose clock is a few ms behind) refills nothing and leaves the refill time where it
    was. Moved back, the next take is paid again for the same time: with 4 processes taking in
    turn the limit let 10-20% more through."""
    store = await open_store(storage.url())
    try:
        await store.set_rate_limit("default", 100, at=10_000, by="test")
        assert await store.take_tokens("default", 10, now=10_050) == 5  # 50 ms: 5 tokens
        assert await store.take_tokens("default", 10, now=10_030) == 0  # behind: nothing
        # 50 ms after the last refill (10,050), not 70 after the take behind it (10,030).
        assert await store.take_tokens("default", 10, now=10_100) == 5
    finally:
        await store.close()
