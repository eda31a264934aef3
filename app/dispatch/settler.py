"""Batched settles: the attempts that end together share one fenced statement.

Each attempt hands its `(identity, settlement)` in and learns whether it took effect; False
means it had lost its claim (a rival holds the update, or the lease lapsed), never success.
On PostgreSQL the batch is one `UPDATE ... FROM unnest(...)` matching all four identity
fields (about ten times the rate of one statement a row); on SQLite one transaction.
"""

from __future__ import annotations

import asyncio

from app.batching import Batcher
from app.store import ClaimIdentity, Settlement, SqlUpdateStore

Item = tuple[ClaimIdentity, Settlement]


class Settler(Batcher[Item, bool]):
    def __init__(self, store: SqlUpdateStore, *, max_batch: int = 256) -> None:
        super().__init__(max_batch=max_batch)
        self._store = store

    async def _flush(self, batch: list[tuple[Item, asyncio.Future[bool]]]) -> None:
        # A key may appear once per statement; a second settle of the same key (a reclaim by
        # this very process) waits for the next one.
        seen: set[tuple[str, int]] = set()
        now: list[tuple[Item, asyncio.Future[bool]]] = []
        later: list[tuple[Item, asyncio.Future[bool]]] = []
        for entry in batch:
            identity = entry[0][0]
            key = (identity.bot, identity.update_id)
            (later if key in seen else now).append(entry)
            seen.add(key)
        try:
            results = await self._store.settle_many_owned([item for item, _ in now])
        except Exception as error:
            self._fail(now, error)
        else:
            for (_, future), settled in zip(now, results, strict=True):
                if not future.done():
                    future.set_result(settled)
        if later:
            await self._flush(later)
