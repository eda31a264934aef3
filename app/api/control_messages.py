"""The request and response messages of operator control over HTTP (`app.api.control`): the
bots, pause and rate limit, search and attempt history, bulk redrive and acknowledgement, park,
the audit log. Each checks its input as it is read: a field out of bounds, a blank reason or an
empty bulk filter (unless `all: true` or a dry run) is a 422 naming the field.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictInt, StringConstraints, model_validator

from app.store import ClaimIdentity, ExhaustionFilter
from app.store.validate import MAX_RATE, MIN_RATE
from telegram_intake_kit.wire import (
    DEFAULT_DESTINATION,
    MAX_BIGINT,
    NO_NUL,
    Attempt,
    BotName,
    ClaimId,
    DestinationName,
    EpochMillis,
    Identity,
    Message,
    UpdateId,
    UpdateView,
)

State = Literal["pending", "processing", "completed", "failed", "abandoned"]
IDENTITY_FIELDS = ("bot", "update_id", "attempt", "claim_id")
Text = Annotated[str, Field(min_length=1, max_length=500, pattern=NO_NUL)]
# A reason that must say something: blank is refused here, not by the store (a 500).
Reason = Annotated[
    str, StringConstraints(strip_whitespace=True, min_length=1, max_length=500, pattern=NO_NUL)
]
# A number (never a string or a boolean), in the store's bounds.
Rate = Annotated[float, Field(strict=True, ge=MIN_RATE, le=MAX_RATE)]


class WebhookItem(Message):
    pending_update_count: int = Field(description="updates Telegram holds for the webhook")
    last_error_date: int | None = Field(description="epoch seconds, as Telegram gives it")
    last_error_message: str | None
    checked_at: EpochMillis


class BotItem(Message):
    bot: BotName
    paused: bool
    paused_at: EpochMillis | None
    paused_by: str | None
    paused_reason: str | None
    rate_limit_per_second: float | None
    counts: dict[str, int]
    open_exhaustions: int
    oldest_undelivered_age_ms: int | None
    breaker: Literal["closed", "open", "half_open"] | None
    webhook: WebhookItem | None = Field(
        description="what the last getWebhookInfo check saw (bots with a bot_token)"
    )


class BotList(Message):
    items: list[BotItem]


class PauseRequest(Message):
    reason: Text | None = None


class BotAction(Message):
    bot: BotName
    changed: bool = Field(description="false when the bot already was as asked")


class RateLimitRequest(Message):
    per_second: Rate | None = Field(
        description="attempts per second across every worker process; null lifts the limit"
    )


class RateLimitSet(Message):
    bot: BotName
    rate_limit_per_second: float | None


class ReplayRequest(Message):
    destination: DestinationName = Field(description="where the updates go")
    first_update_id: UpdateId
    last_update_id: UpdateId = Field(description="inclusive")
    dry_run: bool = Field(default=False, description="count them, change nothing")


class Replayed(Message):
    bot: BotName
    destination: DestinationName
    matched: int = Field(description="the updates in the range that the destination never had")
    replayed: int = Field(description="0 for a dry run")


class UpdatePage(Message):
    items: list[UpdateView]
    next: str | None = Field(description="pass as `after` for the next page; null at the end")


class AttemptItem(Message):
    attempt: int
    claim_id: str
    started_at: EpochMillis
    ended_at: EpochMillis | None
    outcome: str = Field(
        description="completed, failed, abandoned, exhausted, handed_back, "
        "parked; running while leased; lost when its lease lapsed unended"
    )
    status_code: int | None
    error: str | None
    duration_ms: int | None
    worker: str | None


class AttemptList(Message):
    items: list[AttemptItem]


class Filter(Message):
    """Open exhaustions matching every criterion given."""

    bot: BotName | None = None
    update_type: Text | None = None
    chat: Text | None = None
    error_contains: Text | None = None
    exhausted_after: Annotated[StrictInt, Field(ge=0, le=MAX_BIGINT)] | None = None
    exhausted_before: Annotated[StrictInt, Field(ge=0, le=MAX_BIGINT)] | None = None
    destination: DestinationName = Field(
        default=DEFAULT_DESTINATION,
        description="whose deliveries' exhaustions: the bots' own by default",
    )

    def empty(self) -> bool:
        """No criterion narrows it (a destination chooses where, not which)."""
        return not self.model_dump(exclude_none=True, exclude={"destination"})

    def within(self, bots: Iterable[str] | None) -> ExhaustionFilter:
        """These criteria as the store takes them, bounded to `bots` (None: every bot)."""
        criteria = self.model_dump(exclude={"bot"})
        return ExhaustionFilter(bots=None if bots is None else tuple(bots), **criteria)


class BulkRequest(Message):
    """A bulk action: by `filter` or by exact `identities` (one of them), a dry run or not."""

    filter: Filter | None = None
    identities: Annotated[list[Identity], Field(max_length=10_000)] | None = None
    dry_run: StrictBool = False
    all: StrictBool = Field(
        default=False, description="required to act on every open exhaustion (an empty filter)"
    )

    @model_validator(mode="after")
    def _one_selection(self) -> BulkRequest:
        if (self.filter is None) == (self.identities is None):
            raise ValueError("give exactly one of filter and identities")
        destinations = sorted({identity.destination for identity in self.identities or ()})
        if len(destinations) > 1:  # each destination's deliveries are a table of their own
            raise ValueError(
                f"identities of destinations {destinations}: one action per destination"
            )
        if self.filter is not None and self.filter.empty() and not (self.all or self.dry_run):
            raise ValueError(
                "filter is empty: name what to act on, or pass all: true to act on every one"
            )
        return self


class AcknowledgeRequest(BulkRequest):
    """`POST /v1/exhaustions/acknowledge`: one exact identity (`bot`, `update_id`, `attempt`,
    `claim_id`), or, with an operator key, a bulk selection as for a redrive."""

    bot: BotName | None = None
    update_id: UpdateId | None = None
    attempt: Attempt | None = None
    claim_id: ClaimId | None = None
    destination: DestinationName = DEFAULT_DESTINATION

    @model_validator(mode="before")
    @classmethod
    def _one_form(cls, value: Any) -> Any:
        if not isinstance(value, dict) or "filter" in value or "identities" in value:
            return value  # a bulk selection: BulkRequest's rules
        missing = [name for name in IDENTITY_FIELDS if name not in value]
        if missing:
            raise ValueError(
                f"give an identity (missing {', '.join(missing)}), or a filter or identities"
            )
        return {**value, "identities": []}  # the one identity is the selection

    @model_validator(mode="after")
    def _not_both(self) -> AcknowledgeRequest:
        given = [name for name in IDENTITY_FIELDS if getattr(self, name) is not None]
        if given and (self.filter is not None or self.identities):
            raise ValueError(f"give an identity or a selection, not both ({', '.join(given)})")
        if given and (self.dry_run or self.all):
            # The single form acts at once: a dry run of it would acknowledge for real.
            raise ValueError("dry_run and all go with a filter or identities, not one identity")
        return self

    def identity(self) -> ClaimIdentity | None:
        """The one identity of the single form, or None for a bulk selection."""
        if self.bot is None or self.update_id is None or self.attempt is None:
            return None
        if self.claim_id is None or self.identities:
            return None
        return ClaimIdentity(
            self.bot, self.update_id, self.attempt, self.claim_id, self.destination
        )


class RedriveRequest(BulkRequest):
    rate_per_second: Rate | None = Field(
        default=None,
        description="pace the redriven updates at this many per second (default: the bot's "
        "rate limit, if any; else all due at once)",
    )


class BulkSample(Identity):
    error: str | None
    exhausted_at: EpochMillis


class BulkAnswer(Message):
    matched: int = Field(description="the open exhaustions selected (a dry run: now)")
    sample: list[BulkSample] = Field(description="the first ones selected, in key order")


class Redriven(BulkAnswer):
    redriven: int = Field(description="0 for a dry run")


class AcknowledgedInBulk(BulkAnswer):
    acknowledged: int = Field(description="0 for a dry run")


class ParkRequest(Message):
    attempt: Attempt
    claim_id: ClaimId
    reason: Reason
    destination: DestinationName = Field(
        default=DEFAULT_DESTINATION, description="whose delivery: the bot's own by default"
    )
    bot: BotName | None = Field(default=None, description="if given, the path's")
    update_id: UpdateId | None = Field(default=None, description="if given, the path's")


class Parked(Message):
    parked: bool = Field(description="false when that attempt no longer holds the update")


class AuditItem(Message):
    id: int
    at: EpochMillis
    key_name: str
    action: str
    target: str
    detail: dict[str, Any] | None = Field(description="the action's filter, reason or rate")
    matched: int | None
    changed: int | None


class AuditPage(Message):
    items: list[AuditItem]
    next: int | None
