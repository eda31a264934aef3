"""What operational events offer their users."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from app.store.operator_types import OperationalEvent, WebhookInfo


class Events(Protocol):
    """The outbox of operational events and the watches that write to it (revision 0004)."""

    records_events: bool

    async def take_events(
        self, *, now: int, lease_until: int, limit: int
    ) -> list[OperationalEvent]:
        """Lease up to `limit` undelivered events due now, oldest first, until `lease_until`:
        no other process takes them while the lease holds."""
        ...

    async def event_delivered(self, event: OperationalEvent, at: int) -> bool:
        """The receiver took `event`: never sent again. False when its lease had lapsed."""
        ...

    async def event_failed(self, event: OperationalEvent, retry_at: int) -> bool:
        """A delivery failed: due again at `retry_at`, one more failure counted. False when
        its lease had lapsed."""
        ...

    async def watch_backlog(
        self, bots: Sequence[str], *, now: int, stale_after_ms: int
    ) -> list[str]:
        """Write backlog.stale for each of `bots` whose oldest undelivered row was received
        over `stale_after_ms` ago, once an episode across every process (the episode ends
        when its backlog is fresh again); the bots that began one now."""
        ...

    async def take_webhook_check(self, bot: str, *, now: int, next_at: int) -> bool:
        """True to the one caller that makes `bot`'s getWebhookInfo check now (it is due);
        the next is due at `next_at`, for every process."""
        ...

    async def report_webhook_info(self, bot: str, info: WebhookInfo, *, at: int) -> bool:
        """Keep what a getWebhookInfo check saw (`bot_controls` shows it); a last error
        newer than the one kept writes telegram.webhook_error (True)."""
        ...
