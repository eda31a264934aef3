"""The group committer, against a store that records its calls and can be slow or fail."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import pytest

from app.intake.committer import CommitFailed, GroupCommitter
from app.store import NewUpdate, StoreError, StoreUnavailable


class FakeStore:
    """add_many that takes `delay` seconds, and fails as told."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.batches: list[list[int]] = []
        self.bad: set[int] = set()  # update_ids whose batch fails as a data error
        self.unavailable = False

    async def add_many(self, rows: Sequence[NewUpdate]) -> set[tuple[str, int]]:
        self.batches.append([row.update_id for row in rows])
        await asyncio.sleep(self.delay)
        if self.unavailable:
            raise StoreUnavailable("database down")
        if any(row.update_id in self.bad for row in rows):
            raise StoreError("a row the database refused")
        return {(row.bot, row.update_id) for row in rows}


def row(update_id: int) -> NewUpdate:
    return NewUpdate("shop", update_id, f'{{"update_id": {update_id}}}', 0)


async def started(store: FakeStore, **options: float) -> GroupCommitter:
    committer = GroupCommitter(store, **options)  # type: ignore[arg-type]
    await committer.start()
    return committer


async def test_requests_arriving_during_a_commit_share_the_next_one() -> None:
    store = FakeStore(delay=0.05)
    committer = await started(store)
    results = await asyncio.gather(*(committer.submit(row(n)) for n in range(100)))
    await committer.stop()
    assert results == [True] * 100
    assert len(store.batches) < 10  # not one commit per request
    assert sorted(n for batch in store.batches for n in batch) == list(range(100))


async def test_a_batch_takes_at_most_half_the_requests_waiting() -> None:
    # The other half is answered and read again while the batch commits: taking them all,
    # a busy server falls into turns of one big batch and one tiny one.
    store = FakeStore(delay=0.05)
    committer = await started(store)
    await asyncio.gather(*(committer.submit(row(n)) for n in range(64)))
    await committer.stop()
    assert [len(batch) for batch in store.batches[:2]] == [32, 32]
    assert sorted(n for batch in store.batches for n in batch) == list(range(64))


async def test_a_request_alone_is_committed_alone_at_once() -> None:
    store = FakeStore(delay=0.01)
    committer = await started(store)
    assert await committer.submit(row(1)) is True
    await committer.stop()
    assert store.batches == [[1]]


async def test_batches_never_exceed_max_batch() -> None:
    store = FakeStore(delay=0.01)
    committer = await started(store, max_batch=7)
    await asyncio.gather(*(committer.submit(row(n)) for n in range(50)))
    await committer.stop()
    assert max(len(batch) for batch in store.batches) <= 7


async def test_an_unavailable_database_fails_every_request_of_the_batch() -> None:
    store = FakeStore(delay=0.01)
    store.unavailable = True
    committer = await started(store)
    outcomes = await asyncio.gather(
        *(committer.submit(row(n)) for n in range(10)), return_exceptions=True
    )
    await committer.stop()
    assert all(isinstance(outcome, CommitFailed) for outcome in outcomes)


async def test_a_bad_row_fails_alone() -> None:
    store = FakeStore(delay=0.001)
    store.bad = {5}
    committer = await started(store)
    outcomes = await asyncio.gather(
        *(committer.submit(row(n)) for n in range(10)), return_exceptions=True
    )
    await committer.stop()
    failed = [n for n, outcome in enumerate(outcomes) if isinstance(outcome, CommitFailed)]
    assert failed == [5]


async def test_a_commit_over_budget_answers_within_the_budget() -> None:
    store = FakeStore(delay=2.0)
    committer = await started(store, timeout=0.2)
    started_at = time.monotonic()
    with pytest.raises(CommitFailed, match="no commit within"):
        await committer.submit(row(1))
    assert time.monotonic() - started_at < 1.0
    await committer.stop()


async def test_stop_commits_what_waits_and_returns() -> None:
    store = FakeStore(delay=0.1)
    committer = await started(store)
    first = asyncio.create_task(committer.submit(row(1)))
    await asyncio.sleep(0.02)  # row 1 is committing
    second = asyncio.create_task(committer.submit(row(2)))  # row 2 waits behind it
    await asyncio.sleep(0)
    async with asyncio.timeout(3):
        await committer.stop()
    assert (await first, await second) == (True, True)
    with pytest.raises(CommitFailed, match="shutting down"):
        await committer.submit(row(3))


class CountingStore(FakeStore):
    """FakeStore that also counts the inserts running at once."""

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__(delay)
        self.running = 0
        self.most_at_once = 0

    async def add_many(self, rows: Sequence[NewUpdate]) -> set[tuple[str, int]]:
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        try:
            return await super().add_many(rows)
        finally:
            self.running -= 1


async def answered_within(committer: GroupCommitter, update_id: int) -> tuple[object, float]:
    """What `submit` gave (a result or its exception) and how long after the call."""
    began = time.monotonic()
    try:
        outcome: object = await committer.submit(row(update_id))
    except CommitFailed as error:
        outcome = error
    return outcome, time.monotonic() - began


async def test_the_budget_runs_from_each_requests_own_arrival() -> None:
    store = CountingStore(delay=2.0)  # a commit that hangs past every budget
    committer = await started(store, timeout=0.3)
    first = asyncio.create_task(answered_within(committer, 1))
    await asyncio.sleep(0.2)  # 1 is committing; 2 queues behind it
    second = asyncio.create_task(answered_within(committer, 2))
    (one, one_took), (two, two_took) = await first, await second
    await committer.stop()
    assert isinstance(one, CommitFailed)
    assert isinstance(two, CommitFailed)
    # 0.3 s each, with room for a loaded machine (a budget per flush made 2's 2.3 s)
    assert one_took < 0.9
    assert two_took < 0.9
    assert store.batches == [[1]]  # 2 gave up before a flush took it: never inserted
    assert store.most_at_once == 1  # no second insert piled onto the hung one


async def test_a_later_request_that_arrived_earlier_runs_out_first() -> None:
    # A budget runs from the request's arrival (its head), not from its hand-in: a request
    # whose body came slowly hands in after one that arrived later, and must still end first.
    store = CountingStore(delay=2.0)  # hangs past every budget
    committer = await started(store, timeout=0.6)
    loop = asyncio.get_running_loop()
    began = loop.time()
    punctual = asyncio.create_task(committer.submit(row(1), arrival=began))
    await asyncio.sleep(0.05)
    slow_body = asyncio.create_task(committer.submit(row(2), arrival=began - 0.4))
    done, _ = await asyncio.wait({punctual, slow_body}, return_when=asyncio.FIRST_COMPLETED)
    first_end = loop.time() - began
    assert done == {slow_body}  # its budget ended 0.2 s after `began`, the other's at 0.6 s
    with pytest.raises(CommitFailed, match="no commit within"):
        slow_body.result()
    assert not punctual.done()  # the other's budget runs on
    assert first_end < 0.5
    with pytest.raises(CommitFailed):
        await punctual
    assert loop.time() - began >= 0.55
    await committer.stop()


async def test_a_budget_spent_before_the_hand_in_fails_at_once_and_inserts_nothing() -> None:
    store = FakeStore()
    committer = await started(store, timeout=0.5)
    arrival = asyncio.get_running_loop().time() - 0.6
    with pytest.raises(CommitFailed, match="no commit within"):
        await committer.submit(row(1), arrival=arrival)
    assert committer.pending_bytes == 0
    assert await committer.submit(row(2)) is True  # the next one, in budget, is recorded
    await committer.stop()
    assert store.batches == [[2]]


async def test_budgets_of_callers_that_left_do_not_fire_for_those_behind() -> None:
    # The heap keeps the entries of callers that already have their result until they come
    # up; a live caller behind them ends at its own deadline, not at theirs.
    store = FakeStore(delay=0.01)
    committer = await started(store, timeout=0.3)
    assert await committer.submit(row(1)) is True  # leaves an entry at +0.3 s
    store.delay = 2.0
    await asyncio.sleep(0.2)
    outcome, took = await answered_within(committer, 2)  # its own budget: 0.3 s from now
    assert isinstance(outcome, CommitFailed)
    assert 0.25 <= took < 0.9
    await committer.stop()


async def test_the_budgets_stay_about_as_many_as_the_requests_waiting() -> None:
    # Each request leaves its budget's entry behind when it is answered; those are taken off
    # as requests leave, never all at once when the oldest budget would have ended (popping
    # 70,000 of them held the event loop for tens of milliseconds).
    store = FakeStore()
    committer = await started(store, timeout=60)
    for start in range(0, 5_000, 50):
        await asyncio.gather(*(committer.submit(row(n)) for n in range(start, start + 50)))
    assert len(committer._deadlines) <= 50
    await committer.stop()


async def test_the_row_by_row_fallback_keeps_each_requests_budget() -> None:
    store = FakeStore(delay=0.15)
    store.bad = {1}
    committer = await started(store, timeout=0.5)
    outcomes = await asyncio.gather(*(answered_within(committer, n) for n in range(1, 9)))
    await committer.stop()
    # 0.5 s, with room for a loaded machine (a fresh budget per row made it 1.35 s)
    assert max(took for _, took in outcomes) < 0.9
    assert isinstance(outcomes[0][0], CommitFailed)  # the bad row fails alone...
    assert outcomes[1][0] is True  # ...the next rows commit one by one in the budget left
    assert any(isinstance(outcome, CommitFailed) for outcome, _ in outcomes[2:])  # then 503


async def test_past_the_pending_bound_a_request_fails_at_once_and_holds_nothing() -> None:
    store = FakeStore(delay=0.3)
    size = len(row(1).body)
    committer = await started(store, max_pending_bytes=3 * size)
    outcomes = await asyncio.gather(*(answered_within(committer, n) for n in range(1, 7)))
    assert committer.pending_bytes == 0
    await committer.stop()
    refused = [(outcome, took) for outcome, took in outcomes if isinstance(outcome, CommitFailed)]
    assert [outcome for outcome, _ in outcomes[:3]] == [True, True, True]
    assert len(refused) == 3
    assert all(took < 0.15 for _, took in refused)  # at once, not after the 0.3 s commit
    assert "already wait for a commit" in str(refused[0][0])
    assert sorted(n for batch in store.batches for n in batch) == [1, 2, 3]


async def test_rows_in_a_hung_insert_stay_counted_until_it_ends() -> None:
    store = FakeStore(delay=0.5)
    size = len(row(1).body)
    committer = await started(store, timeout=0.1)
    outcomes = await asyncio.gather(*(answered_within(committer, n) for n in range(1, 5)))
    assert all(isinstance(outcome, CommitFailed) for outcome, _ in outcomes)
    [hung] = store.batches  # half the four; the other two gave up before a flush took them
    assert len(hung) == 2
    assert committer.pending_bytes == len(hung) * size  # still held by the insert in flight
    await asyncio.sleep(0.6)
    assert committer.pending_bytes == 0
    await committer.stop()


async def test_a_batch_carries_at_most_a_mebibyte_of_bodies_and_one_row_whatever_its_size() -> None:
    store = FakeStore(delay=0.05)
    committer = await started(store, max_pending_bytes=8 << 20)
    big = [NewUpdate("shop", n, f'{{"update_id": {n}, "x": "{"y" * 600_000}"}}', 0) for n in (1, 2)]
    huge = NewUpdate("shop", 3, f'{{"update_id": 3, "x": "{"y" * 1_500_000}"}}', 0)
    small = [row(n) for n in range(4, 10)]
    await asyncio.gather(*(committer.submit(item) for item in [*big, huge, *small]))
    await committer.stop()
    assert store.batches[:3] == [[1], [2], [3]]  # 0.6 + 0.6 MB is over the cap; 1.5 MB alone
    assert sorted(n for batch in store.batches[3:] for n in batch) == list(range(4, 10))
