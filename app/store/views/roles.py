"""What operators read."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from app.store.operator_types import (
    ActivitySlot,
    AttemptRecord,
    AuditEntry,
    SearchCursor,
    SearchPage,
    UpdateFilter,
)
from app.store.types import DEFAULT_DESTINATION, BotStats, StoredUpdate


class Views(Protocol):
    """The base level's views: one update, and counts by bot and state."""

    async def get_update(self, bot: str, update_id: int) -> StoredUpdate | None:
        """The row of `(bot, update_id)` as it stands, or None."""
        ...

    async def stats(self, *, deliveries: bool = False) -> list[BotStats]:
        """Rows by bot and state, the oldest undelivered row's receipt, open exhaustions (None
        below revision 0002); in bot order. One scan: an operator's call, not the hot path.
        With `deliveries`, the same of the deliveries beside the rows (revision 0010), by bot
        and destination."""
        ...


class OperatorViews(Protocol):
    """Search, attempt history, activity and the audit log (revision 0004)."""

    async def search_updates(
        self, chosen: UpdateFilter, *, after: SearchCursor | None = None, limit: int = 50
    ) -> SearchPage:
        """Rows matching `chosen`, newest first by (received_at, bot, update_id), a page at a
        time after the cursor; pages neither skip nor repeat a row."""
        ...

    async def attempt_history(
        self, bot: str, update_id: int, *, destination: str = DEFAULT_DESTINATION
    ) -> list[AttemptRecord] | None:
        """Every attempt of the update's delivery to `destination` (default: its row's own),
        oldest first, kept as long as its row; None when no such update (or delivery) is
        recorded."""
        ...

    async def audit_log(
        self, *, after: int | None = None, limit: int = 100, bots: Sequence[str] | None = None
    ) -> list[AuditEntry]:
        """Operator actions, newest first (`after`: the last id of the previous page). With
        `bots` (a key limited to them), only the entries that concern at least one bot and
        none outside `bots`; an entry of every bot (a filter that named none) is left out."""
        ...

    async def activity(
        self, bots: Sequence[str], *, since: int, until: int, slot_ms: int
    ) -> list[ActivitySlot]:
        """Updates received, and delivered (completed), per bot in each slot of `slot_ms`
        from `since` until `until`, every slot with its zeros, oldest first (each slot's bots
        in name order). Delivered counts what is still retained."""
        ...
