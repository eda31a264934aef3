"""What erasure on request offers (revision 0009, docs/privacy.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from app.store.operator_types import Erasure, ErasureKind


class Erasures(Protocol):
    """Durable erasure jobs: requested once, worked by whichever process takes them."""

    async def request_erasure(
        self,
        bot: str,
        *,
        kind: ErasureKind,
        subject: int | None,
        at: int,
        by: str,
        dry_run: bool = False,
    ) -> int:
        """Record a job erasing every stored copy of every update of `bot` that names
        `subject` (a user's or a chat's id) in any role, with its history and its events; or,
        `kind` "bot" with no subject, everything `bot` stored. A dry run only counts. Its id;
        it runs once a process works on it."""
        ...

    async def get_erasure(self, erasure_id: int) -> Erasure | None:
        """The job as it stands: its state and counts, never the id it erases."""
        ...

    async def erase_delivered_bodies(
        self, bot: str, *, settled_before: int, at: int, limit: int = ...
    ) -> int:
        """Retention: erase the bodies of `bot`'s delivered updates (completed, abandoned, or
        exhaustions once acknowledged) settled at or before `settled_before`, with their
        attempts' errors and their delivered events' data; the rows stay, so a re-post is
        still a duplicate. The count erased."""
        ...

    async def work_on_erasures(self, now: Callable[[], int], *, lease_ms: int) -> list[Erasure]:
        """Work each unfinished job no process holds to its end, a bounded batch per
        transaction under a lease of `lease_ms`; the jobs finished here. Deleting an update
        ends the attempt that holds it: `owns`, renewal and settle find no row."""
        ...
