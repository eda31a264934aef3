"""What claiming offers its users."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from sqlalchemy.ext.asyncio import AsyncConnection

from app.store.types import (
    DEFAULT_DESTINATION,
    Claimed,
    ClaimIdentity,
    DueUpdate,
    Ordering,
)


class Claims(Protocol):
    """The base level's claims: by key, fenced by attempt number only."""

    async def claim(
        self,
        bot: str,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> int | None:
        """Lease a claimable row until `lease_until`; the new attempt number.

        Claimable: pending; failed with `due_at <= now` (a retry is due at its time); processing
        with `due_at < now` (a lease is live at exactly `due_at`). None when the row is absent,
        leased, settled, or its attempts are spent; a spent row becomes `abandoned` with error
        'attempts spent' (an unacknowledged exhaustion with `durable_exhaustion`)."""
        ...

    async def renew(
        self, bot: str, update_id: int, attempt: int, lease_until: int, now: int | None = None
    ) -> bool:
        """Extend the lease held by `attempt`; never shortens it. With `now`, a lapsed lease
        (`due_at < now`) is not revived. True when `attempt` holds the row."""
        ...

    async def due(
        self,
        *,
        now: int,
        pending_before: int,
        limit: int,
        bots: Sequence[str] | None = None,
    ) -> list[DueUpdate]:
        """Pending rows received at or before `pending_before` and claimable non-pending rows,
        in `(bot, update_id)` order, at most `limit`; only these `bots` when given."""
        ...


class FencedClaims(Protocol):
    """The fenced level's claims: each mints a claim_id, and the full identity is the fence."""

    async def claim_owned(
        self,
        bot: str,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> ClaimIdentity | None:
        """`claim`, returning the full identity of the new attempt."""
        ...

    async def claim_next_owned(
        self,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        limit: int,
        ordering: Ordering = "chat",
        bots: Sequence[str] | None = None,
        durable_exhaustion: bool = False,
        destination: str = DEFAULT_DESTINATION,
    ) -> list[Claimed]:
        """Claim up to `limit` due deliveries of `destination` in one statement, oldest
        `due_at` first; concurrent callers never take the same row. A pending row is due from
        its `received_at`. With ordering "chat" only the oldest non-terminal delivery of each
        `(bot, queue_key)` of the destination is eligible. The budget is `max_attempts`
        counted attempts (a hand-back counts none); each claimed row's `counted` is its place
        in it. Spent rows met on the way are ended as `claim` ends them and not returned.
        Destinations other than `default` need revision 0010."""
        ...

    async def renew_owned(
        self, identity: ClaimIdentity, lease_until: int, now: int | None = None
    ) -> bool:
        """`renew` for the exact identity."""
        ...

    def transaction(self) -> AbstractAsyncContextManager[AsyncConnection]:
        """A write transaction in the store's own database, for the caller's statements,
        committed on exit: pass it to `owns(..., connection=)` and the check and a domain
        write commit together. No other store method may be called inside it."""
        ...

    async def owns(
        self, identity: ClaimIdentity, at: int, *, connection: AsyncConnection | None = None
    ) -> bool:
        """The write authority: True when `identity` holds a live lease at `at` (live at exactly
        `due_at`). Given the caller's open transaction it runs inside it and, on PostgreSQL,
        locks the row until that transaction ends, so no reclaim passes before its commit."""
        ...

    async def owned_lease(
        self, identity: ClaimIdentity, at: int, *, connection: AsyncConnection | None = None
    ) -> int | None:
        """`owns`, answering with the live lease's expiry (epoch ms) instead of True."""
        ...

    async def renewed_lease(
        self, identity: ClaimIdentity, lease_until: int, now: int | None = None
    ) -> int | None:
        """`renew_owned`, answering with the lease's expiry after it instead of True."""
        ...

    async def owned_leases(self, identities: Sequence[ClaimIdentity], at: int) -> list[int | None]:
        """`owned_lease` of many identities at once, in their order: one statement where the
        database can take them all (the callback API's concurrent `owns` share it)."""
        ...

    async def renewed_leases(
        self, renewals: Sequence[tuple[ClaimIdentity, int]], now: int
    ) -> list[int | None]:
        """`renewed_lease(identity, lease_until, now)` of many renewals at once, in their
        order: one statement where the database can take them all (the callback API's
        concurrent `renew` share it). The same identity twice is renewed to the later time."""
        ...
