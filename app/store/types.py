"""The values that cross the store boundary: identities, settlements and rows.

All are frozen dataclasses; times are integer epoch milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal, NamedTuple

from app.store import validate

# `unrouted` (revision 0010): an update whose row holds no delivery, since it does not go to
# destination `default` (docs/design.md decision 7); terminal, never claimed.
State = Literal["pending", "processing", "completed", "failed", "abandoned", "unrouted"]
STATES: tuple[State, ...] = (
    "pending",
    "processing",
    "completed",
    "failed",
    "abandoned",
    "unrouted",
)
DELIVERY_STATES: tuple[State, ...] = STATES[:-1]  # what a delivery's own row may be
Capability = Literal["base", "fenced", "durable"]
# The destination whose delivery is the update's row itself (docs/design.md decision 7).
DEFAULT_DESTINATION = "default"
Ordering = Literal["chat", "none"]


@dataclass(frozen=True, slots=True)
class ClaimIdentity:
    """One attempt at one update's delivery to one destination. Every fenced transition
    compares all five fields; `default`'s delivery is the update's row (revision 0010 adds
    the others, docs/design.md decision 7)."""

    bot: str
    update_id: int
    attempt: int
    claim_id: str
    destination: str = DEFAULT_DESTINATION

    def __post_init__(self) -> None:
        validate.bot_name(self.bot)
        validate.update_id(self.update_id)
        validate.attempts("attempt", self.attempt)
        if not isinstance(self.claim_id, str) or not self.claim_id:
            raise ValueError(f"claim_id {self.claim_id!r} is not a non-empty string")
        if self.destination is not DEFAULT_DESTINATION:
            validate.destination_name(self.destination)


def identity_of(row: Any) -> ClaimIdentity:
    """The identity a read or returned row holds (bot, update_id, attempts, claim_id, and on
    the deliveries table its destination)."""
    destination = getattr(row, "destination", DEFAULT_DESTINATION)
    return ClaimIdentity(row.bot, row.update_id, row.attempts, row.claim_id, destination)


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
class StoredDelivery:
    """One delivery beside an update's row (revision 0010), as it stands: its destination and
    the delivery columns, read as `StoredUpdate`'s."""

    destination: str
    state: State
    attempts: int
    due_at: int
    settled_at: int | None
    error: str | None
    claim_id: str | None
    exhausted_at: int | None
    acknowledged_at: int | None


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
    # When its body was erased (retention, revision 0009): `body` is None from then on.
    erased_at: int | None = None
    # Its deliveries to destinations beside `default`, in name order: `get_update` reads them;
    # None where they were not read (a search's summaries).
    deliveries: tuple[StoredDelivery, ...] | None = None
    # Whose delivery the fields above describe: `default`'s (the row's own), or, seen from
    # another destination (`seen_from`, a search by destination), that destination's.
    destination: str = DEFAULT_DESTINATION

    def seen_from(self, destination: str) -> StoredUpdate | None:
        """This update as one destination's service sees it: the delivery fields its
        delivery's, no other delivery listed; None when the update does not go to it."""
        if destination == DEFAULT_DESTINATION:
            if self.state == "unrouted":
                return None
            return replace(self, deliveries=(), destination=destination)
        for delivery in self.deliveries or ():
            if delivery.destination == destination:
                fields = {n: getattr(delivery, n) for n in StoredDelivery.__dataclass_fields__}
                return replace(self, **fields, deliveries=())
        return None


@dataclass(frozen=True, slots=True)
class BotStats:
    """One bot's rows by state (`stats`): how many, the oldest undelivered receipt (pending,
    processing or failed rows), and its open exhaustions (None on a base table); or, with
    `stats(deliveries=True)`, one destination's deliveries beside the rows (revision 0010)."""

    bot: str
    states: dict[State, int]
    oldest_undelivered_at: int | None
    unacknowledged_exhaustions: int | None
    destination: str = DEFAULT_DESTINATION


class Route(NamedTuple):
    """A destination an update goes to, chosen as it is recorded. `ordered`: its delivery
    keeps the update's queue key, and waits for the older updates of that queue (destination
    `default` follows the bot's ordering instead)."""

    destination: str
    ordered: bool = True


# Where an update goes when its bot has one destination: its row's own delivery.
TO_DEFAULT: tuple[Route, ...] = (Route(DEFAULT_DESTINATION),)


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
    # The destinations it goes to (`app.destinations.routing`), revision 0010 beyond
    # `default`: without `default` its row is `unrouted`, and each other one is a row of the
    # deliveries table.
    routes: tuple[Route, ...] = TO_DEFAULT

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
        if self.routes is not TO_DEFAULT:
            validate.routes(self.routes)

    @property
    def to_default(self) -> bool:
        """Whether destination `default` (the row's own delivery) takes it."""
        return self.routes is TO_DEFAULT or any(
            route.destination == DEFAULT_DESTINATION for route in self.routes
        )

    @property
    def elsewhere(self) -> tuple[Route, ...]:
        """The destinations beside `default` that take it: a deliveries row each."""
        if self.routes is TO_DEFAULT:
            return ()
        return tuple(route for route in self.routes if route.destination != DEFAULT_DESTINATION)


class RecordedRow(NamedTuple):
    """A new row as `add_many` inserts it: a `NewUpdate` as stored, its body sealed and its
    identifiers digested by the store's codec (`Sealing._stored_rows`); its fields are
    `records.statements.ADD_COLUMNS`, which the backends' batch statements read."""

    bot: str
    update_id: int
    body: str
    update_type: str | None
    queue_key: str | None
    received_at: int
    trace_context: str | None
    subjects: str
    state: str  # pending, or unrouted when `default` does not take it
    settled_at: int | None  # an unrouted row is settled at its receipt


class DeliveryRow(NamedTuple):
    """A new delivery as `add_many` inserts it beside its update's row (revision 0010): its
    fields are `records.statements.DELIVERY_COLUMNS`."""

    bot: str
    destination: str
    update_id: int
    queue_key: str | None  # the update's, as stored; None when the destination is unordered
    received_at: int
