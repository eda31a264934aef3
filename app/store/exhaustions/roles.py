"""What exhaustions offer their users."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from app.store.operator_types import BulkOutcome, ExhaustionFilter
from app.store.types import DEFAULT_DESTINATION, ClaimIdentity, Exhaustion


class Exhaustions(Protocol):
    """The durable level: a terminal failure stays until its exact acknowledgement."""

    async def exhaust(
        self, identity: ClaimIdentity, at: int, error: str, *, status: int | None = None
    ) -> bool:
        """Turn the exact live claim into an unacknowledged exhaustion keeping `error` (and,
        for its history, the downstream's HTTP `status`)."""
        ...

    async def due_exhaustions(
        self,
        *,
        limit: int,
        after: tuple[str, int] | None = None,
        bots: Sequence[str] | None = None,
        destination: str = DEFAULT_DESTINATION,
    ) -> list[Exhaustion]:
        """Unacknowledged exhaustions of deliveries to `destination` after the cursor
        `(bot, update_id)`, in key order."""
        ...

    async def take_exhaustions(
        self,
        *,
        now: int,
        lease_until: int,
        limit: int,
        bots: Sequence[str],
        destination: str = DEFAULT_DESTINATION,
    ) -> list[Exhaustion]:
        """Lease up to `limit` open exhaustions of these bots' deliveries to `destination`
        whose delivery is due (a new exhaustion is due at once; a failed delivery at its retry
        time; a lease lapses after `lease_until`), in key order; their delivery is not due
        again before `lease_until`, so concurrent callers never take the same one. Rows not
        due are not read."""
        ...

    async def delivery_failed(self, exhaustion: Exhaustion, retry_at: int) -> bool:
        """The delivery of `exhaustion` (as `take_exhaustions` gave it) failed: due again at
        `retry_at`, its `deliveries` one more. False and no change when it is no longer that
        open exhaustion with that count (acknowledged, or taken and failed since)."""
        ...

    async def acknowledge_exhaustion(self, identity: ClaimIdentity, at: int) -> bool:
        """Acknowledge the exhaustion with exactly this identity; it becomes prunable, settled
        at `at`. False for any other identity or a row that is not an open exhaustion."""
        ...


class BulkExhaustions(Protocol):
    """Operators' bulk actions over exhaustions (revision 0004)."""

    async def redrive(
        self,
        selection: ExhaustionFilter | Sequence[ClaimIdentity],
        *,
        at: int,
        by: str,
        dry_run: bool = False,
        rate_per_second: float | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> BulkOutcome:
        """Deliver the selected open exhaustions (by filter, or by exact identities) again:
        each stops being an exhaustion and becomes a retry with a fresh attempt budget, due
        from `at`, paced at `rate_per_second` in key order (without one: a selection of one
        bot at that bot's rate limit, else all at once); its attempt numbers continue, so no
        earlier identity matches again. A dry run counts exactly what a real run would
        take now, with a sample, and changes nothing."""
        ...

    async def acknowledge_exhaustions(
        self,
        selection: ExhaustionFilter | Sequence[ClaimIdentity],
        *,
        at: int,
        by: str,
        dry_run: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> BulkOutcome:
        """`acknowledge_exhaustion` of every selected open exhaustion; a dry run counts
        exactly what a real run would take now."""
        ...
