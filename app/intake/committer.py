"""Group commit: concurrent webhook requests share one INSERT and one commit.

Each request hands its row to `submit` and waits. A flusher takes what is waiting (up to
`max_batch` rows, and at most half the requests in the committer), records it with one
`add_many`, and answers every request of the batch only after that commit. While a commit is
in flight the next batch gathers by itself, so under load batches grow and commits per second
stay flat; alone, a request waits for one commit only (plus `max_wait`, default 0).

Two promises hold whatever the database does:
- A request's budget (`timeout`) runs from its own arrival, the moment its head came, however
  slowly its body came after it and however long it queued behind a flush: past it, the
  request answers 503 (CommitFailed) at once; a request whose budget is spent before its row
  is handed in is refused without inserting it. Telegram delivers the
  update again; a row that did commit after all is then a duplicate, answered 200 and
  changed by nothing. A row whose request has given up before its flush is not inserted.
- What the committer holds is bounded: the bodies of the rows waiting and of the insert in
  flight, `max_pending_bytes` at most. Past it a request answers 503 at once and holds
  nothing. There is never more than one insert in flight: while one hangs (a lock, a
  database that stopped answering) the requests behind it time out instead of piling up
  inserts of their own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from app.batching import Batcher, Closed, Expired
from app.store import NewUpdate, StoreUnavailable
from app.store.records.roles import Recorder

MAX_BATCH_BYTES = 1 << 20  # body bytes one insert carries at most


class CommitFailed(Exception):
    """The batch holding this request's row was not confirmed committed."""


class GroupCommitter(Batcher[NewUpdate, bool]):
    """Batches `add` calls of concurrent requests into shared commits."""

    def __init__(
        self,
        store: Recorder,
        *,
        max_batch: int = 500,
        max_wait: float = 0.0,
        timeout: float = 5.0,
        max_pending_bytes: int = 16 << 20,
        on_added: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(max_batch=max_batch, max_wait=max_wait, timeout=timeout)
        self._store = store
        self._max_pending = max_pending_bytes
        self._on_added = on_added
        self.pending_bytes = 0  # bodies held: waiting, or in the insert in flight
        self._insert: asyncio.Task[set[tuple[str, int]]] | None = None
        self._in_flight: set[int] = set()  # id() of each row in the insert in flight

    async def stop(self) -> None:
        """Commit what is waiting, then stop the flusher."""
        await super().stop()
        if self._insert is not None:
            await asyncio.gather(self._insert, return_exceptions=True)

    async def submit(self, item: NewUpdate, *, arrival: float | None = None) -> bool:
        """Record `item`; True when it was new, False for a duplicate. Returns only after the
        commit holding the row; raises CommitFailed when that commit is not confirmed within
        the budget, counted from `arrival` (the event loop's time the request's head came;
        by default, now), or when the committer holds too much already."""
        size = len(item.body)
        if self.pending_bytes + size > self._max_pending:
            raise CommitFailed(f"{self.pending_bytes} bytes already wait for a commit")
        self.pending_bytes += size
        try:
            return await super().submit(item, arrival=arrival)
        except Expired as error:
            raise CommitFailed(f"no commit within {self._timeout:.3g} s") from error
        except Closed as error:
            raise CommitFailed("the intake is shutting down") from error
        finally:
            if not self._holds(item):
                self.pending_bytes -= size

    def _take(self) -> list[asyncio.Future[bool]]:
        # Rows up to MAX_BATCH_BYTES of body (one row at least): the insert's parameters, and
        # the driver's buffers that grow to the largest statement sent and stay so, are
        # bounded by it, not by max_batch rows of the largest body.
        # And at most half the requests in the committer: the other half is answered and
        # the next requests read while this batch commits. Taking them all, the server falls
        # into lopsided turns (a batch of 62 requests, then one of 2, over and over), and its
        # event loop waits for the big batch's commit with nothing to do.
        limit = min(self._max_batch, (self._callers + 1) // 2)
        taken: list[asyncio.Future[bool]] = []
        size = 0
        for future, row in self._waiting.items():
            size += len(row.body)
            if len(taken) >= limit or (taken and size > MAX_BATCH_BYTES):
                break
            taken.append(future)
        return taken

    def _holds(self, item: NewUpdate) -> bool:
        """Whether `item` is in the insert in flight, which releases its bytes when it ends."""
        return id(item) in self._in_flight

    async def _flush(self, batch: list[tuple[NewUpdate, asyncio.Future[bool]]]) -> None:
        # A request that gave up while it waited (its future is cancelled) is not inserted.
        batch = [(row, future) for row, future in batch if not future.done()]
        if not batch:
            return
        new = await self._insert_rows(batch)
        if isinstance(new, StoreUnavailable):
            self._fail(batch, new)
        elif isinstance(new, Exception):
            # Something about the rows, not the database: commit them one by one, so that one
            # bad row fails alone instead of every update that happened to share its batch.
            # Each request keeps its own budget meanwhile.
            if len(batch) == 1:
                self._fail(batch, new)
                return
            for item in batch:
                await self._flush([item])
        else:
            for row, future in batch:
                if not future.done():  # a request past its budget, or whose client hung up
                    future.set_result((row.bot, row.update_id) in new)
            if new and self._on_added is not None:
                self._on_added()  # wake the workers: new updates are due

    async def _insert_rows(
        self, batch: list[tuple[NewUpdate, asyncio.Future[bool]]]
    ) -> set[tuple[str, int]] | Exception:
        """One insert, awaited to its end however long that takes (the requests answer at
        their own budgets meanwhile). It runs as a task of its own and is never cancelled: a
        driver cancelled mid-statement cleans up only as fast as the database lets it
        (SQLite: the whole busy timeout)."""
        rows = [row for row, _ in batch]
        self._in_flight = {id(row) for row in rows}
        self._insert = asyncio.create_task(self._store.add_many(rows))
        try:
            await asyncio.wait({self._insert})
            return self._insert.result()
        except Exception as error:
            return error
        finally:
            # The bytes of rows whose request is still waiting are released by that request.
            self.pending_bytes -= sum(len(row.body) for row, future in batch if future.done())
            self._in_flight = set()

    @staticmethod
    def _fail(batch: list[tuple[NewUpdate, asyncio.Future[bool]]], error: BaseException) -> None:
        failed = CommitFailed(f"{type(error).__name__}: {error}")
        failed.__cause__ = error  # what the log line's level depends on (a full disk's is DEBUG)
        Batcher._fail(batch, failed)
