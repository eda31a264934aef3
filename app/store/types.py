"""The values that cross the store boundary: identities, settlements and rows.

All are frozen dataclasses; times are integer epoch milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from app.store import validate

State = Literal["pending", "processing", "completed", "failed", "abandoned"]
STATES: tuple[State, ...] = ("pending", "processing", "completed", "failed", "abandoned")
Capability = Literal["base", "fenced", "durable"]
Ordering = Literal["chat", "none"]


@dataclass(frozen=True, slots=True)
class ClaimIdentity:
    """One attempt at one update. Every fenced transition compares all four fields."""

    bot: str
    update_id: int
    attempt: int
    claim_id: str

    def __post_init__(self) -> None:
        validate.bot_name(self.bot)
        validate.update_id(self.update_id)
        validate.attempts("attempt", self.attempt)
        if not isinstance(self.claim_id, str) or not self.claim_id:
            raise ValueError(f"claim_id {self.claim_id!r} is not a non-empty string")


@dataclass(frozen=True, slots=True)
class Completed:
    """The attempt delivered the update. `status`: the downstream's HTTP status, for the
    attempt's history (None: no answer, or the callback API settled it)."""

    at: int
    status: int | None = None

    def __post_init__(self) -> None:
        validate.millis("at", self.at)
        validate.status("status", self.status)


@dataclass(frozen=True, slots=True)
class Failed:
    """The attempt failed; the update is due again at `retry_at`."""

    at: int
    retry_at: int
    error: str
    status: int | None = None

    def __post_init__(self) -> None:
        validate.millis("at", self.at)
        validate.millis("retry_at", self.retry_at)
        validate.text("error", self.error)
        validate.status("status", self.status)
        if self.retry_at < self.at:
            raise ValueError(f"retry_at {self.retry_at} is before at {self.at}")


@dataclass(frozen=True, slots=True)
class Abandoned:
    """The attempt gave up on the update for good (not a durable exhaustion)."""

    at: int
    error: str
    status: int | None = None

    def __post_init__(self) -> None:
        validate.millis("at", self.at)
        validate.text("error", self.error)
        validate.status("status", self.status)


@dataclass(frozen=True, slots=True)
class HandedBack:
    """The attempt was cut short by its worker (a shutdown): the update is due again at `at`,
    and the attempt spends none of its budget (revision 0003 counts it in `uncounted`; below,
    it counts). The error of the last real attempt stays."""

    at: int

    def __post_init__(self) -> None:
        validate.millis("at", self.at)


Settlement = Completed | Failed | Abandoned | HandedBack


@dataclass(frozen=True, slots=True)
class DueUpdate:
    """A row that a claim would take now (with what a worker needs to judge its deadline)."""

    bot: str
    update_id: int
    body: str
    update_type: str | None = None
    received_at: int | None = None
    # Why the body could not be read (its key is not in the ring, or it was altered); `body`
    # is then empty, and a worker ends the attempt rather than forward it (docs/privacy.md).
    unreadable: str | None = None


@dataclass(frozen=True, slots=True)
class Claimed:
    """A row taken by `claim_next_owned`, with the identity that now holds it."""

    identity: ClaimIdentity
    body: str
    update_type: str | None
    queue_key: str | None
    received_at: int
    # This attempt's place in the budget: its number less the attempts that spent none
    # (hand-backs, redrives). It ends the update when it reaches max_attempts.
    counted: int
    # The update's trace (`NewUpdate.trace_context`): None when it has none, or below 0007.
    trace_context: str | None = None
    # As `DueUpdate.unreadable`: the attempt is ended, never forwarded.
    unreadable: str | None = None


@dataclass(frozen=True, slots=True)
class Exhaustion:
    """A terminal failure kept until its exact acknowledgement."""

    identity: ClaimIdentity
    body: str
    error: str | None
    exhausted_at: int
    deliveries: int = 0  # deliveries to exhaustion_url that failed so far
    # The update's trace (revision 0007): its delivery joins it. None when it has none.
    trace_context: str | None = None
    # As `DueUpdate.unreadable`: `body` is empty, the exhaustion's receiver gets no update.
    unreadable: str | None = None


@dataclass(frozen=True, slots=True)
class StoredUpdate:
    """One row as it stands, for operators (`get_update`). The revision 0002 fields are None
    on a base table. `due_at` is the lease's end while processing, the retry time while
    failed, the receipt while pending, the settlement time once terminal."""

    bot: str
    update_id: int
    state: State
    attempts: int
    update_type: str | None
    queue_key: str | None
    received_at: int
    due_at: int
    settled_at: int | None
    error: str | None
    claim_id: str | None
    exhausted_at: int | None
    acknowledged_at: int | None
    body: str | None = None  # the raw update: `get_update` reads it, a search leaves it out


@dataclass(frozen=True, slots=True)
class BotStats:
    """One bot's rows by state (`stats`): how many, the oldest undelivered receipt (pending,
    processing or failed rows), and its open exhaustions (None on a base table)."""

    bot: str
    states: dict[State, int]
    oldest_undelivered_at: int | None
    unacknowledged_exhaustions: int | None


@dataclass(frozen=True, slots=True)
class NewUpdate:
    """One row for `add_many`, the batched form of `add` used by the intake's group commit."""

    bot: str
    update_id: int
    body: str
    received_at: int
    update_type: str | None = None
    queue_key: str | None = None
    # The W3C traceparent of the span that recorded it (tracing on), from revision 0007.
    trace_context: str | None = None
    # Every user and chat id it names (`app.privacy.subjects`), from revision 0009: what an
    # erasure and a search by user find it by.
    subjects: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        validate.bot_name(self.bot)
        validate.update_id(self.update_id)
        validate.body(self.body)
        validate.millis("received_at", self.received_at)
        validate.optional_text("update_type", self.update_type)
        validate.optional_text("queue_key", self.queue_key)
        validate.trace_context(self.trace_context)
        if not isinstance(self.subjects, tuple) or any(
            type(subject) is not int for subject in self.subjects
        ):
            raise ValueError(f"subjects {self.subjects!r:.80} is not a tuple of ids")


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

    def __post_init__(self) -> None:
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

    def __post_init__(self) -> None:
        if isinstance(self.bots, str) or not self.bots:
            raise ValueError("bots must be a non-empty sequence of bot names")
        for bot in self.bots:
            validate.bot_name(bot)
        if self.state is not None and self.state not in STATES:
            raise ValueError(f"state {self.state!r} is not one of {', '.join(STATES)}")
        validate.optional_text("chat", self.chat)
        validate.optional_text("update_type", self.update_type)
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
