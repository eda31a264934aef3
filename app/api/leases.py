"""Concurrent `owns` and `renew` callbacks share one statement each, as the intake's posts
share one commit.

A downstream asks `POST /v1/claims/owns` before each domain write (and a deferring one renews
its lease), so the callback API sees as many requests as the workers deliver updates. Each
request hands its identity to one flusher (`app.batching`), which answers everything waiting
with one `owned_leases` read (or one `renewed_leases` write) at the database clock's now:
under load a batch grows with the requests that arrive while the previous statement is in
flight, and alone a request waits for one statement, as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from app.batching import Batcher, Closed
from app.store import ClaimIdentity, StoreUnavailable
from app.store.claims.roles import FencedClaims

MAX_BATCH = 256  # identities per statement: a few KiB of arrays, one index probe each
Item = TypeVar("Item")


class _SharedLeases(Batcher[Item, int | None]):
    """One statement for every item waiting, each answered with a lease or None; a failed
    statement answers each caller with its error (a 503, a 409)."""

    def __init__(self, store: FencedClaims, now: Callable[[], int]) -> None:
        super().__init__(max_batch=MAX_BATCH)
        self._store = store
        self._now = now

    async def _answer(self, item: Item) -> int | None:
        try:
            return await self.submit(item)
        except Closed as error:  # the service is stopping: the caller asks again elsewhere
            raise StoreUnavailable(str(error)) from None

    async def _statement(self, items: list[Item], now: int) -> list[int | None]:
        raise NotImplementedError

    async def _flush(self, batch: list[tuple[Item, asyncio.Future[int | None]]]) -> None:
        try:
            leases = await self._statement([item for item, _ in batch], self._now())
        except Exception as error:
            self._fail(batch, error)
            return
        for (_, future), lease in zip(batch, leases, strict=True):
            if not future.done():  # a caller that gave up cancelled its future
                future.set_result(lease)


class LeaseChecks(_SharedLeases[ClaimIdentity]):
    """`owned_lease` of each identity handed in, many at a time."""

    async def lease(self, identity: ClaimIdentity) -> int | None:
        """The live lease's expiry of exactly this attempt now (epoch ms), or None."""
        return await self._answer(identity)

    async def _statement(self, items: list[ClaimIdentity], now: int) -> list[int | None]:
        return await self._store.owned_leases(items, now)


class LeaseRenewals(_SharedLeases[tuple[ClaimIdentity, int]]):
    """`renewed_lease` of each (identity, lease_ms) handed in, many at a time: each lease
    extended to `lease_ms` from the flush's now, never shortened."""

    async def renew(self, identity: ClaimIdentity, lease_ms: int) -> int | None:
        """The lease's expiry after renewing exactly this attempt (epoch ms), or None."""
        return await self._answer((identity, lease_ms))

    async def _statement(
        self, items: list[tuple[ClaimIdentity, int]], now: int
    ) -> list[int | None]:
        renewals = [(identity, now + lease_ms) for identity, lease_ms in items]
        return await self._store.renewed_leases(renewals, now)
