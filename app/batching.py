"""Batching: concurrent callers hand in one item each and share one database statement.

A single flusher takes everything waiting (up to `max_batch` items) and hands it to `_flush`,
which must resolve every future of the batch. While a flush is in flight the next batch
gathers by itself, so under load batches grow and statements per second stay flat; alone, a
caller waits for one statement only (plus `max_wait`, default 0). The intake's group commit
and the dispatcher's batched settle are both this shape.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class Closed(Exception):
    """The batcher is stopping and takes no new items."""


class Expired(TimeoutError):
    """The caller's budget (`timeout`) ran out before the flush holding its item was done."""


class Batcher(Generic[Item, Result]):
    """One flusher over the items of concurrent callers; subclasses write `_flush`."""

    def __init__(
        self, *, max_batch: int = 500, max_wait: float = 0.0, timeout: float | None = None
    ) -> None:
        self._max_batch = max_batch
        self._max_wait = max_wait
        # One timer, set for the budget that ends first, serves every caller (a timer of its
        # own per caller, as `asyncio.timeout` sets, was a tenth of the intake's time). A
        # budget runs from the caller's own arrival, which may come before that of a caller
        # that submitted earlier (a body read slowly), so the budgets are a heap by their end.
        # Its entries name the caller by ticket, not by future: a caller that has left holds
        # nothing alive through the heap while its entry waits to come up.
        self._timeout = timeout
        self._deadlines: list[tuple[float, int]] = []
        self._tickets: dict[int, asyncio.Future[Result]] = {}
        self._next_ticket = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        # In arrival order, by future: a caller that gives up takes its item out at once, so
        # nothing it handed in stays held while it waits for a flush.
        self._waiting: dict[asyncio.Future[Result], Item] = {}
        self._callers = 0  # in `submit`: waiting, in a flush, or not yet resumed after it
        self._wake = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._closing = False

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The flusher, once started."""
        return self._flusher

    async def start(self) -> None:
        # One flusher: while its statement is in flight the next batch gathers, so batches
        # grow with load (two flushers halved the intake's batches and cost 12% of throughput).
        self._flusher = asyncio.create_task(self._flush_forever())

    async def stop(self) -> None:
        """Flush what is waiting, then stop the flusher."""
        self._closing = True
        self._wake.set()
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)
        self._flusher = None
        if self._timer is not None and not self._tickets:
            self._timer.cancel()
            self._timer = None

    async def submit(self, item: Item, *, arrival: float | None = None) -> Result:
        """Hand in `item`; returns its result once the flush holding it is done. Raises
        Expired once `timeout` has passed since `arrival` (the event loop's time the caller's
        work began; by default, this call), wherever the item is by then. A budget already
        spent fails at once, and the item is never flushed."""
        if self._closing:
            raise Closed("shutting down")
        loop = asyncio.get_running_loop()
        deadline = 0.0
        if self._timeout is not None:
            deadline = (loop.time() if arrival is None else arrival) + self._timeout
            if deadline <= loop.time():
                raise self._expired()
        future: asyncio.Future[Result] = loop.create_future()
        self._waiting[future] = item
        ticket = -1
        if self._timeout is not None:
            ticket = next(self._next_ticket)
            self._tickets[ticket] = future
            heapq.heappush(self._deadlines, (deadline, ticket))
            if self._timer is None or deadline < self._timer_at:
                self._arm(loop, deadline)
        self._callers += 1
        self._wake.set()
        try:
            return await future
        finally:
            self._callers -= 1
            if self._tickets.pop(ticket, None) is not None:
                self._drop_left()
            self._waiting.pop(future, None)  # still waiting: the caller gave up (cancelled)
            # A failure's traceback holds this frame; without the future in it there is no
            # cycle, and the item is freed as soon as the caller is done with it.
            del future

    def _drop_left(self) -> None:
        """Take a few entries of callers that have left off the top of the budgets' heap, as
        each caller leaves: the heap stays about as long as the callers in it, and is never
        cleared in one go: after 5 s at 14,000 requests/s, popping its 70,000 entries at once
        held the event loop for about 56 ms, the intake's p99 at 64 connections."""
        deadlines, tickets = self._deadlines, self._tickets
        for _ in range(4):  # more than the one entry each caller adds
            if not deadlines or deadlines[0][1] in tickets:
                return
            heapq.heappop(deadlines)

    def _arm(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(deadline, self._expire)
        self._timer_at = deadline

    def _expired(self) -> Expired:
        return Expired(f"no result within {self._timeout:.3g} s")

    def _expire(self) -> None:
        """Fail every caller whose budget has ended; set the timer for the next one. Entries
        of callers that have left are dropped as they come up."""
        self._timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        deadlines = self._deadlines
        while deadlines:
            deadline, ticket = deadlines[0]
            future = self._tickets.get(ticket)
            if future is None:  # the caller has its result, or gave up
                heapq.heappop(deadlines)
                continue
            if deadline > now:
                self._arm(loop, deadline)
                return
            heapq.heappop(deadlines)
            del self._tickets[ticket]
            if not future.done():
                future.set_exception(self._expired())

    async def _flush_forever(self) -> None:
        while True:
            await self._wake.wait()
            if self._max_wait and len(self._waiting) < self._max_batch and not self._closing:
                await asyncio.sleep(self._max_wait)
            batch = [(self._waiting.pop(future), future) for future in self._take()]
            if not self._waiting:
                self._wake.clear()
            if batch:
                try:
                    await self._flush(batch)
                except Exception as error:  # a bug in _flush must not strand its callers
                    self._fail(batch, error)
            if self._closing and not self._waiting:
                return

    def _take(self) -> list[asyncio.Future[Result]]:
        """The next batch, oldest first: up to `max_batch` of the waiting items."""
        return list(itertools.islice(self._waiting, self._max_batch))

    async def _flush(self, batch: list[tuple[Item, asyncio.Future[Result]]]) -> None:
        raise NotImplementedError

    @staticmethod
    def _fail(batch: list[tuple[Item, asyncio.Future[Result]]], error: BaseException) -> None:
        for _, future in batch:
            if not future.done():  # a caller that gave up cancelled its future
                future.set_exception(error)
