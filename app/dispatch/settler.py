"""Batched settles: the attempts that end together share one fenced statement.

Each attempt hands its `(identity, settlement)` in and learns whether it took effect (False
means it had lost its claim: a rival holds the update, or the lease lapsed; never success),
and whether its chat has a later update waiting that may be claimable now.
On PostgreSQL the batch is one `UPDATE ... FROM unnest(...)` matching all four identity
fields (about ten times the rate of one statement a row); on SQLite one transaction.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from app.batching import Batcher
from app.store import ClaimIdentity, DurableUpdateStore, Settlement

Item = tuple[ClaimIdentity, Settlement]


@dataclass(frozen=True, slots=True)
class Settled:
    took_effect: bool
    unblocks: bool  # a later update of the same chat is still to deliver


class Settler(Batcher[Item, Settled]):
    def __init__(self, store: DurableUpdateStore, *, max_batch: int = 256) -> None:
        super().__init__(max_batch=max_batch)
        self._store = store

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
            for ((identity, _), future), settled in zip(now, results, strict=True):
                if not future.done():
                    key = (identity.bot, identity.update_id)
                    future.set_result(Settled(settled, key in waiting))
        if later:
            await self._flush(later)
