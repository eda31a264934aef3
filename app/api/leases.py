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

from app.batching import Batcher, Closed
from app.store import ClaimIdentity, FencedUpdateStore, StoreUnavailable

MAX_BATCH = 256  # identities per read: a few KiB of arrays, one index probe each


class LeaseRenewals(Batcher[tuple[ClaimIdentity, int], int | None]):
    """`renewed_lease` of each (identity, lease_ms) handed in, many at a time: each lease
    extended to `lease_ms` from the flush's now, never shortened."""

    def __init__(self, store: FencedUpdateStore, now: Callable[[], int]) -> None:
        super().__init__(max_batch=MAX_BATCH)
        self._store = store
        self._now = now

    async def renew(self, identity: ClaimIdentity, lease_ms: int) -> int | None:
        """The lease's expiry after renewing exactly this attempt (epoch ms), or None."""
        try:
            return await self.submit((identity, lease_ms))
        except Closed as error:  # the service is stopping: the caller asks again elsewhere
            raise StoreUnavailable(str(error)) from None

    async def _flush(
        self, batch: list[tuple[tuple[ClaimIdentity, int], asyncio.Future[int | None]]]
    ) -> None:
        now = self._now()
        renewals = [(identity, now + lease_ms) for (identity, lease_ms), _ in batch]
        try:
            leases = await self._store.renewed_leases(renewals, now)
        except Exception as error:  # each caller answers with it (a 503, a 409)
            self._fail(batch, error)
            return
        for (_, future), lease in zip(batch, leases, strict=True):
            if not future.done():  # a caller that gave up cancelled its future
                future.set_result(lease)


class LeaseChecks(Batcher[ClaimIdentity, int | None]):
    """`owned_lease` of each identity handed in, many at a time."""

    def __init__(self, store: FencedUpdateStore, now: Callable[[], int]) -> None:
        super().__init__(max_batch=MAX_BATCH)
        self._store = store
        self._now = now

    async def lease(self, identity: ClaimIdentity) -> int | None:
        """The live lease's expiry of exactly this attempt now (epoch ms), or None."""
        try:
            return await self.submit(identity)
        except Closed as error:  # the service is stopping: the caller asks again elsewhere
            raise StoreUnavailable(str(error)) from None

    async def _flush(self, batch: list[tuple[ClaimIdentity, asyncio.Future[int | None]]]) -> None:
        try:
            leases = await self._store.owned_leases(
                [identity for identity, _ in batch], self._now()
            )
        except Exception as error:  # each caller answers with it (a 503, a 409)
            self._fail(batch, error)
            return
        for (_, future), lease in zip(batch, leases, strict=True):
            if not future.done():  # a caller that gave up cancelled its future
                future.set_result(lease)
