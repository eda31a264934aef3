"""What long polling offers its users."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from app.store.types import (
    NewUpdate,
)


class Polling(Protocol):
    """One poller of a bot across every process, and the batches it records."""

    async def take_poller(self, bot: str, *, holder: str, now: int, lease_until: int) -> int | None:
        """Take or renew the lease of `bot`'s one getUpdates poller across every process until
        `lease_until`: the offset to ask for (0: none yet) to the holder, None to any other
        caller while the lease holds."""
        ...

    async def record_polled(
        self, bot: str, rows: Sequence[NewUpdate], *, holder: str, now: int, offset: int
    ) -> set[tuple[str, int]] | None:
        """Record a polled batch (as `add_many`) and move the bot's offset to `offset`, in one
        transaction, only while `holder` holds the lease: the new keys, or None (nothing
        written) when the lease was lost."""
        ...

    async def release_poller(self, bot: str, *, holder: str) -> bool:
        """Give up the poller's lease, so another process takes over at once."""
        ...
