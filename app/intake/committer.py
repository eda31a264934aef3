"""Group commit: concurrent webhook requests share one INSERT and one commit.

Each request hands its row to `submit` and waits. A flusher takes everything waiting (up to
`max_batch` rows), records it with one `add_many`, and answers every request of the batch only
after that commit. While a commit is in flight the next batch gathers by itself, so under load
batches grow and commits per second stay flat; alone, a request waits for one commit only
(plus `max_wait`, default 0). A batch that fails or overruns `timeout` fails every request in
it, which then answers 503: Telegram delivers those updates again, and a row that did commit
after all is then a duplicate, answered 200 and changed by nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from app.batching import Batcher, Closed
from app.store import DurableUpdateStore, NewUpdate, StoreUnavailable


class CommitFailed(Exception):
    """The batch holding this request's row was not confirmed committed."""


class GroupCommitter(Batcher[NewUpdate, bool]):
    """Batches `add` calls of concurrent requests into shared commits."""

    def __init__(
        self,
        store: DurableUpdateStore,
        *,
        max_batch: int = 500,
        max_wait: float = 0.0,
        timeout: float = 5.0,
        on_added: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(max_batch=max_batch, max_wait=max_wait)
        self._store = store
        self._timeout = timeout
        self._on_added = on_added
        self._inserts: set[asyncio.Task[set[tuple[str, int]]]] = set()

    async def stop(self) -> None:
        """Commit what is waiting, then stop the flusher."""
        await super().stop()
        await asyncio.gather(*self._inserts, return_exceptions=True)

    async def submit(self, item: NewUpdate) -> bool:
        """Record `item`; True when it was new, False for a duplicate. Returns only after the
        commit holding the row; raises CommitFailed when that commit is not confirmed."""
        try:
            return await super().submit(item)
        except Closed as error:
            raise CommitFailed("the intake is shutting down") from error

    async def _flush(self, batch: list[tuple[NewUpdate, asyncio.Future[bool]]]) -> None:
        # The insert runs as its own task and is never cancelled: a driver cancelled mid-
        # statement cleans up only as fast as the database lets it (SQLite: the whole busy
        # timeout). Past the budget the batch answers 503 at once and the insert finishes on
        # its own; if it commits after all, Telegram's redelivery is a duplicate.
        rows = [row for row, _ in batch]
        insert = asyncio.create_task(self._store.add_many(rows))
        self._inserts.add(insert)
        insert.add_done_callback(self._forget)
        done, _ = await asyncio.wait({insert}, timeout=self._timeout)
        if not done:
            self._fail(batch, TimeoutError(f"no commit within {self._timeout:.3g} s"))
            return
        try:
            new = insert.result()
        except StoreUnavailable as error:
            self._fail(batch, error)
        except Exception as error:
            # Something about the rows, not the database: commit them one by one, so that one
            # bad row fails alone instead of every update that happened to share its batch.
            if len(batch) == 1:
                self._fail(batch, error)
                return
            deadline = asyncio.get_running_loop().time() + self._timeout
            for index, item in enumerate(batch):
                if asyncio.get_running_loop().time() > deadline:
                    # The rest would wait past their budget behind the retries: answer now.
                    self._fail(batch[index:], error)
                    return
                await self._flush([item])
        else:
            for row, future in batch:
                if not future.done():  # a client that hung up cancelled its future
                    future.set_result((row.bot, row.update_id) in new)
            if new and self._on_added is not None:
                self._on_added()  # wake the workers: new updates are due

    def _forget(self, insert: asyncio.Task[set[tuple[str, int]]]) -> None:
        self._inserts.discard(insert)
        if not insert.cancelled():
            insert.exception()  # retrieved here too, for an insert that outlived its budget

    @staticmethod
    def _fail(batch: list[tuple[NewUpdate, asyncio.Future[bool]]], error: BaseException) -> None:
        Batcher._fail(batch, CommitFailed(f"{type(error).__name__}: {error}"))
