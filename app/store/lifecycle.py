"""What every store offers whatever its level: its capability, its connections, the database's
clock, the wake-ups across processes and whether it can write."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from app.store.storage import StorageWatch
from app.store.types import (
    Capability,
)


class Lifecycle(Protocol):
    """Opening, checking and closing a store; the database's clock; wake-ups."""

    @property
    def capability(self) -> Capability:
        """ "base", "fenced" or "durable": the highest level the live schema serves."""
        ...

    @property
    def storage(self) -> StorageWatch:
        """Whether its database can write: an episode of a full disk while it cannot."""
        ...

    async def close(self) -> None:
        """Release connections; the store is unusable afterwards."""
        ...

    def require(self, level: Capability, feature: str) -> None:
        """Raise SchemaError, naming `feature` and `alembic upgrade head`, when the live schema
        is below `level`; nothing otherwise."""
        ...

    async def ping(self) -> None:
        """One round trip to the database; StoreError when it does not answer."""
        ...

    async def database_time(self) -> int:
        """The database's clock now, epoch ms: the clock every lease is judged by."""
        ...

    async def announce(self) -> None:
        """Wake the workers of every other process now (`add_many` wakes them by itself)."""
        ...

    async def listen(
        self, wake: Callable[[], None], *, listening: asyncio.Event | None = None
    ) -> None:
        """Call `wake` whenever another process commits new updates or announces, until
        cancelled; set `listening` once in place. Returns at once where there is no such
        channel (SQLite: every writer is in this process)."""
        ...
