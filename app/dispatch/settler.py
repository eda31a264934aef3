"""Batched settles: the attempts that end together share one fenced statement.

Each attempt hands its `(identity, settlement)` in and learns whether it took effect (False
means it had lost its claim: a rival holds the update, or the lease lapsed; never success),
and whether its chat has a later update waiting that may be claimable now.
On PostgreSQL the batch is one `UPDATE ... FROM unnest(...)` matching all four identity
fields (about ten times the rate of one statement a row); on SQLite one transaction.

A row another transaction holds locked is skipped by the batch (the store answers None for
it) and settled on its own, beside the flusher: only its own attempt waits for the lock, never
the batches of every other attempt.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from app.batching import Batcher
from app.store import ClaimIdentity, Settlement
from app.store.settles.roles import FencedSettles

Item = tuple[ClaimIdentity, Settlement]


@dataclass(frozen=True, slots=True)
class Settled:
    took_effect: bool
    unblocks: bool  # a later update of the same chat is still to deliver


class Settler(Batcher[Item, Settled]):
    def __init__(self, store: FencedSettles, *, max_batch: int = 256) -> None:
        super().__init__(max_batch=max_batch)
        self._store = store
        self._alone: set[asyncio.Task[None]] = set()  # settles of rows that were locked

    async def stop(self) -> None:
        await super().stop()
        await asyncio.gather(*self._alone, return_exceptions=True)

    async def _flush(self, batch: list[tuple[Item, asyncio.Future[Settled]]]) -> None:
        # A key may appear once per statement; a second settle of the same key (a reclaim by
        # this very process) waits for the next one.
        seen: set[tuple[str, int]] = set()
        now: list[tuple[Item, asyncio.Future[Settled]]] = []
        later: list[tuple[Item, asyncio.Future[Settled]]] = []
        for entry in batch:
            identity = entry[0][0]
            key = (identity.bot, identity.update_id)
            (later if key in seen else now).append(entry)
            seen.add(key)
        waiting: set[tuple[str, int]] = set()
        try:
            items = [item for item, _ in now]
            results = await self._store.settle_many_owned(items, waiting=waiting)
        except Exception as error:
            self._fail(now, error)
        else:
            for (item, future), settled in zip(now, results, strict=True):
                if settled is None:
                    task = asyncio.create_task(self._settle_alone(item, future))
                    self._alone.add(task)
                    task.add_done_callback(self._alone.discard)
                elif not future.done():
                    key = (item[0].bot, item[0].update_id)
                    future.set_result(Settled(settled, key in waiting))
        if later:
            await self._flush(later)

    async def _settle_alone(self, item: Item, future: asyncio.Future[Settled]) -> None:
        """One settle that waits for its locked row (as long as the store's lock timeout)."""
        try:
            took_effect = await self._store.settle_owned(*item)
        except Exception as error:
            if not future.done():
                future.set_exception(error)
        else:
            if not future.done():  # whether its chat waits is unknown: look (a superset)
                future.set_result(Settled(took_effect, unblocks=took_effect))
