"""Each bot as an operator sees it at a glance (docs/contract.md section 9's `GET /v1/bots`):
running or paused, its rate limit, its rows by state, open exhaustions, the oldest undelivered
update's age, its breaker, and what Telegram last said of its webhook. One view for the API, the
command line and the console."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.config import Settings
from app.store import OperatorStore, State


@dataclass(frozen=True, slots=True)
class WebhookSeen:
    """What the last getWebhookInfo check saw (bots with a token)."""

    pending_update_count: int
    last_error_date: int | None  # epoch seconds, as Telegram gives it
    last_error_message: str | None
    checked_at: int  # epoch ms


@dataclass(frozen=True, slots=True)
class BotOverview:
    bot: str
    paused: bool
    paused_at: int | None
    paused_by: str | None
    paused_reason: str | None
    rate_limit_per_second: float | None
    counts: dict[State, int]
    open_exhaustions: int
    oldest_undelivered_age_ms: int | None
    breaker: str | None  # closed, open or half_open, as the workers last reported
    webhook: WebhookSeen | None


async def bots_overview(
    store: OperatorStore, settings: Settings, names: Sequence[str], now: int
) -> list[BotOverview]:
    """The overview of the bots named (configured ones, in that order) at `now` (epoch ms by
    the database's clock). A breaker reported open whose cool-down has passed reads
    half_open: a probe may go out."""
    controls = {c.bot: c for c in await store.bot_controls(list(names))}
    stats = {s.bot: s for s in await store.stats()}
    found = []
    for name in names:
        control, counted = controls[name], stats.get(name)
        oldest = None if counted is None else counted.oldest_undelivered_at
        configured = settings.bot(name)
        breaker = control.breaker
        cooled = (
            configured is not None
            and control.breaker_at is not None
            and now - control.breaker_at >= configured.breaker_cooldown_seconds * 1000
        )
        if breaker == "open" and cooled:
            breaker = "half_open"
        webhook = None
        if control.webhook_checked_at is not None:
            webhook = WebhookSeen(
                pending_update_count=control.webhook_pending or 0,
                last_error_date=control.webhook_error_date,
                last_error_message=control.webhook_error_message,
                checked_at=control.webhook_checked_at,
            )
        found.append(
            BotOverview(
                bot=name,
                paused=control.paused,
                paused_at=control.paused_at,
                paused_by=control.paused_by,
                paused_reason=control.paused_reason,
                rate_limit_per_second=control.rate_per_second,
                counts=dict(counted.states) if counted else {},
                open_exhaustions=(counted.unacknowledged_exhaustions or 0) if counted else 0,
                oldest_undelivered_age_ms=None if oldest is None else max(0, now - oldest),
                breaker=breaker,
                webhook=webhook,
            )
        )
    return found
