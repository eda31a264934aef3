"""What crosses the store boundary for operators: attempt history, bot controls, the filters
of search and bulk actions, their pages and outcomes, operational events, the audit log
(revision 0004 on), erasure jobs (0009) and the console's minute samples (0011). All frozen
dataclasses; times in epoch ms."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, get_args

from app.store import validate
from app.store.types import DEFAULT_DESTINATION, STATES, Exhaustion, State, StoredUpdate

# -- operator control (revision 0004) -----------------------------------------------------------

# How an attempt ended, as its history says: recorded by the statement that ended it, or, for an
# attempt that never did, "running" (its lease is the row's) or "lost" (its lease lapsed).
AttemptEnd = Literal[
    "completed", "failed", "abandoned", "exhausted", "handed_back", "parked", "running", "lost"
]


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One attempt of an update (`attempts`): its claim, when it started and ended, how, the
    downstream's HTTP status, an excerpt of its error, and the worker that ran it."""

    attempt: int
    claim_id: str
    started_at: int
    ended_at: int | None
    outcome: AttemptEnd
    status_code: int | None
    error: str | None
    worker: str | None

    @property
    def duration_ms(self) -> int | None:
        return None if self.ended_at is None else self.ended_at - self.started_at


@dataclass(frozen=True, slots=True)
class BotControl:
    """A bot's controls as every process sees them (`bot_controls`): paused since when, by
    whom and why; its rate limit; the last breaker transition a worker reported."""

    bot: str
    paused_at: int | None = None
    paused_by: str | None = None
    paused_reason: str | None = None
    rate_per_second: float | None = None
    breaker: str | None = None
    breaker_at: int | None = None
    # What the last getWebhookInfo check saw (bots with a token): Telegram's pending update
    # count, its last error's date (epoch seconds) and message, and when it looked (epoch ms).
    webhook_pending: int | None = None
    webhook_error_date: int | None = None
    webhook_error_message: str | None = None
    webhook_checked_at: int | None = None
    # Whose controls these are: the bot's own (its pause, and destination `default`'s rate
    # and breaker), or one destination's beside `default` (revision 0010).
    destination: str = DEFAULT_DESTINATION

    @property
    def paused(self) -> bool:
        return self.paused_at is not None


@dataclass(frozen=True, slots=True)
class ExhaustionFilter:
    """Which open exhaustions a bulk redrive or acknowledgement takes: all of the criteria
    given. `bots` bounds it to the bots the caller may act for (None: every bot)."""

    bots: tuple[str, ...] | None = None
    update_type: str | None = None
    chat: str | None = None
    error_contains: str | None = None
    exhausted_after: int | None = None
    exhausted_before: int | None = None
    # Whose deliveries' exhaustions: the rows' own (`default`), or one other destination's.
    destination: str = DEFAULT_DESTINATION

    def __post_init__(self) -> None:
        validate.destination_name(self.destination)
        if self.bots is not None:
            if isinstance(self.bots, str):
                raise ValueError("bots must be a sequence of bot names, not one string")
            for bot in self.bots:
                validate.bot_name(bot)
        validate.optional_text("update_type", self.update_type)
        validate.optional_text("chat", self.chat)
        validate.optional_text("error_contains", self.error_contains)
        for name in ("exhausted_after", "exhausted_before"):
            value = getattr(self, name)
            if value is not None:
                validate.millis(name, value)


@dataclass(frozen=True, slots=True)
class UpdateFilter:
    """What `search_updates` looks for: rows of `bots` matching every criterion given.
    `contains` is a substring of the raw body, searched only among rows the others select."""

    bots: tuple[str, ...]
    state: State | None = None
    chat: str | None = None
    update_type: str | None = None
    received_after: int | None = None
    received_before: int | None = None
    contains: str | None = None
    # A user's or a chat's id named anywhere in the update (its subjects, revision 0009).
    user: str | None = None
    # Seen from one destination's deliveries (revision 0010): the updates that go to it, with
    # `state` and each summary's delivery fields its delivery's. None: the rows as they stand
    # (`default`'s delivery, or `unrouted`).
    destination: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.bots, str) or not self.bots:
            raise ValueError("bots must be a non-empty sequence of bot names")
        for bot in self.bots:
            validate.bot_name(bot)
        if self.destination is not None:
            validate.destination_name(self.destination)
        if self.state is not None and self.state not in STATES:
            raise ValueError(f"state {self.state!r} is not one of {', '.join(STATES)}")
        validate.optional_text("chat", self.chat)
        validate.optional_text("update_type", self.update_type)
        validate.optional_text("user", self.user)
        if self.contains is not None and not validate.text("contains", self.contains):
            raise ValueError("contains is empty")
        for name in ("received_after", "received_before"):
            value = getattr(self, name)
            if value is not None:
                validate.millis(name, value)


# A search's position: the last row's (received_at, bot, update_id); pages go newest first.
SearchCursor = tuple[int, str, int]


@dataclass(frozen=True, slots=True)
class SearchPage:
    """One page of `search_updates`: the rows, and where the next page starts (None: no
    more). A page may hold fewer rows than asked, even none, while `next` is set: a body
    search reads a bounded number of rows per page."""

    items: list[StoredUpdate]
    next: SearchCursor | None


@dataclass(frozen=True, slots=True)
class BulkOutcome:
    """What a bulk action matched and changed, with a sample of the identities it matched
    (the first ones in key order)."""

    matched: int
    changed: int
    sample: list[Exhaustion]


@dataclass(frozen=True, slots=True)
class ActivitySlot:
    """One bot's traffic in one slot of time (`activity`): updates received, and updates
    delivered (completed), from `start` (epoch ms) for the slot's length."""

    bot: str
    start: int
    received: int
    delivered: int


@dataclass(frozen=True, slots=True)
class MinuteCounts:
    """What one process counted for a bot's destination in one minute (epoch ms of its start,
    UTC), by the names of `schema_beside.SAMPLE_COUNTS`; a name left out counts 0."""

    bot: str
    destination: str
    minute: int
    counts: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class Sample:
    """One minute of a bot's destination as the samples hold it: every count of
    `SAMPLE_COUNTS`, and the backlog and its oldest update's age (ms) when the minute was
    sampled (None otherwise)."""

    bot: str
    destination: str
    minute: int
    counts: Mapping[str, int]
    backlog: int | None
    oldest_age_ms: int | None


# The operational events (docs/contract.md section 9), as `operations_url` receives them.
EventType = Literal[
    "exhaustion.created",
    "breaker.opened",
    "breaker.closed",
    "backlog.stale",
    "bot.paused",
    "bot.resumed",
    "redrive.finished",
    "telegram.webhook_error",
    "erasure.completed",
    "storage.full",
    "storage.recovered",
]
EVENT_TYPES: tuple[EventType, ...] = get_args(EventType)


@dataclass(frozen=True, slots=True)
class OperationalEvent:
    """One event of the outbox, taken for delivery (`take_events`) until `lease_until`:
    `payload` is the JSON body to send, verbatim; `deliveries` the failed ones so far."""

    id: int
    type: EventType
    payload: str
    created_at: int
    deliveries: int
    lease_until: int
    # The trace of the update it tells of (revision 0008; exhaustion.created): its delivery
    # joins it. None for an event about no one update.
    trace_context: str | None = None

    @property
    def message_id(self) -> str:
        """The Standard Webhooks `webhook-id`: the same for every delivery of this event."""
        return f"evt_{self.created_at}_{self.id}"


@dataclass(frozen=True, slots=True)
class WebhookInfo:
    """What one getWebhookInfo call said of a bot's webhook (`report_webhook_info`)."""

    url: str
    pending_update_count: int
    last_error_date: int | None = None  # epoch seconds, as Telegram gives it
    last_error_message: str | None = None


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One operator action as the audit log keeps it. `detail` is JSON text."""

    id: int
    at: int
    key_name: str
    action: str
    target: str
    detail: str | None
    matched: int | None
    changed: int | None


# -- personal data (revision 0009) ---------------------------------------------------------------

ErasureKind = Literal["user", "chat", "bot"]
ErasureState = Literal["pending", "running", "done"]


@dataclass(frozen=True, slots=True)
class Erasure:
    """An erasure job as it stands (`request_erasure`, `get_erasure`): what it erases (never
    which id), where it is, and what it erased (or, for a dry run, would erase) so far."""

    id: int
    bot: str
    kind: ErasureKind
    dry_run: bool
    state: ErasureState
    requested_at: int
    requested_by: str
    finished_at: int | None
    updates: int
    attempts: int
    events: int
