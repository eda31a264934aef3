"""What recording offers its users."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from app.store.types import (
    NewUpdate,
)


class Recorder(Protocol):
    """Records updates: the intake's group commit and the long poller need nothing else."""

    async def add_many(self, rows: Sequence[NewUpdate]) -> set[tuple[str, int]]:
        """`add` for a batch, in one commit: the keys that were new. A key already recorded, in
        any state, is left exactly as it was; a key twice in the batch is recorded once, from
        its first row. The intake's group commit; nothing is recorded if the commit fails."""
        ...


class Records(Recorder, Protocol):
    """Records updates one at a time or many, and keeps the table: prune, statistics, space."""

    async def add(
        self,
        bot: str,
        update_id: int,
        body: str,
        received_at: int,
        *,
        update_type: str | None = None,
        queue_key: str | None = None,
    ) -> bool:
        """Record a new update as pending; False and no change when the key exists in any state."""
        ...

    async def prune(self, before: int) -> int:
        """Delete completed, abandoned and unrouted rows with `settled_at < before` whose
        deliveries beside them (revision 0010) are all completed or abandoned with
        `settled_at < before` too, with those deliveries; the count of rows deleted.
        Unacknowledged exhaustions have no `settled_at` and are never pruned. Deletes in
        bounded batches, each its own transaction, so a large prune never holds the table
        (or SQLite's one write lock) for long; one process at a time prunes a table, and a
        prune that finds another one at work returns what it has deleted so far."""
        ...

    async def refresh_statistics(
        self, *, min_changes: int = 1000, min_age_seconds: float = 10.0
    ) -> bool:
        """Gather the planner's statistics of the table again when they never were, or when at least
        `min_changes` rows were written since and they are `min_age_seconds` old or the table has
        since seen more writes than it then had rows (a burst into an empty or small table); whether
        they were gathered now. One process at a time: a call that finds another one at it returns
        False. Upkeep, not a transition: no row changes."""
        ...

    async def reclaim_space(
        self, *, min_dead_rows: int = 1000, scale: float = 0.05, min_age_seconds: float = 10.0
    ) -> bool:
        """Make the space of deleted and superseded rows reusable (PostgreSQL's `VACUUM`) when at
        least `min_dead_rows` plus `scale` times the live rows are dead and the table was last
        vacuumed, by anyone (autovacuum too), `min_age_seconds` ago or never; whether this call
        vacuumed. A vacuum already at work on the table makes a call return at once. Upkeep, not
        a transition: no row changes."""
        ...
