"""What the minute samples offer: the processes add what they counted, one process a minute
samples the backlog, the console reads a window (docs/design.md decision 8)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from app.store.operator_types import MinuteCounts, Sample


class Samples(Protocol):
    """Counts per bot, destination and minute (revision 0011)."""

    async def add_samples(self, counts: Sequence[MinuteCounts]) -> None:
        """Add each of `counts` to its minute's row (made at zero when there is none): what
        several processes counted in one minute adds up. Negative counts and a minute that
        is not a whole minute are refused (ValueError) before anything is written."""
        ...

    async def sample_backlog(self, minute: int, *, now: int) -> bool:
        """Sample the backlog for `minute` if no process has yet: each bot's (and each
        destination's) undelivered updates and the age of the oldest at `now`, into the
        minute's rows. Whether this call was the one that sampled it."""
        ...

    async def samples(
        self,
        bots: Sequence[str],
        *,
        since: int,
        until: int,
        destinations: Sequence[str] | None = None,
    ) -> list[Sample]:
        """The rows of `bots` (and of `destinations`, when given) whose minute is in
        [`since`, `until`), by bot, destination and minute."""
        ...

    async def prune_samples(self, before: int) -> int:
        """Delete the rows of minutes before `before`; how many."""
        ...
