"""The dispatcher's state: a lane per destination of each bot, and one record per attempt in
flight."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from app.bot_settings import BotSettings
from app.dispatch.breaker import Breaker
from app.dispatch.forward import Downstream
from app.metric_labels import AttemptOutcome
from app.metrics import AttemptMeters
from app.policy import wall_clock_ms
from app.store import Claimed, ClaimIdentity, StoreError
from app.store.types import DEFAULT_DESTINATION, Ordering


class Lane:
    """One destination of one bot in a dispatcher (docs/design.md decision 7): its delivery
    options, downstream, breaker, claim order and attempts in flight. A bot with one
    downstream has one lane, `default`'s."""

    def __init__(
        self,
        bot: BotSettings,
        transport: httpx.AsyncBaseTransport,
        meters: AttemptMeters,
        *,
        destination: str = DEFAULT_DESTINATION,
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
        now: Callable[[], int] = wall_clock_ms,
    ) -> None:
        """`now` (epoch ms): the dispatcher's clock, the database's (`DatabaseClock.now`)."""
        self.bot = bot
        self.name = bot.name
        self.destination = destination
        self.downstream = Downstream(bot, transport, destination, now=now)
        self.options = options = self.downstream.options
        # How logs and breakers name it: the bot, and beside `default` its destination.
        self.label = bot.name if destination == DEFAULT_DESTINATION else f"{bot.name}/{destination}"
        self.plain = options.mode == "plain"
        self.durable = options.mode == "durable"
        self.lease_ms = int(options.lease_seconds * 1000)
        # `default` keeps the bot's ordering; another destination's deliveries carry no queue
        # key when it is unordered, so its claims need not look for one.
        target = self.downstream.target
        self.ordering: Ordering = (
            bot.ordering
            if destination == DEFAULT_DESTINATION
            else ("chat" if target.ordered else "none")
        )
        self.breaker = Breaker(
            self.label,
            failures=options.breaker_failures,
            cooldown=options.breaker_cooldown_seconds,
            monotonic_ns=monotonic_ns,
        )
        self.in_flight = 0
        self.meters = meters
        # The last claim took all it asked for, or the lane is at its limit: more may be due.
        self.saturated = False
        # Operator control: the rate limit as last read, and whether the last claim found its
        # bucket short of what it wanted.
        self.rate_per_second: float | None = None
        self.throttled = False


@dataclass(frozen=True, slots=True)
class ClaimSpan:
    """When the claim statement that took an attempt ran, for the attempt's trace."""

    started_ns: int
    ended_ns: int
    batch: int


@dataclass(eq=False, slots=True)
class Attempt:
    lane: Lane
    claimed: Claimed
    lease_until: int  # the last proven lease: due_at as this attempt last wrote it
    renewed_at: int
    task: asyncio.Task[None] | None = None
    forwarding: bool = True  # the request is in flight (only then is it cancelled)
    renewing: bool = False
    lost: bool = False
    handed_back: bool = False
    unblocks: bool = False  # its end lets a later update of its chat be claimed
    probe: bool = False  # the one attempt a half-open breaker let through
    judged: bool = False  # its answer reached the breaker
    outcome: AttemptOutcome = "unsettled"  # how it ended, counted as it does ("lost" aside)
    # Its settle or exhaustion waits for a database that cannot write (full, or unreachable):
    # retried until it lands or is refused, however long (`AttemptRunner._retrying`).
    stalled: bool = False
    # Why its last renewal failed, None once one lands: a lease that runs out while the
    # database cannot write is handed back, spending nothing (`LeaseKeeper`).
    renewal_error: StoreError | None = None
    # With tracing on, the claim that took it: its statement's start and end (epoch ns), and
    # how many rows that statement took (a claim is batched, before any attempt exists).
    claim: ClaimSpan | None = None

    @property
    def identity(self) -> ClaimIdentity:
        return self.claimed.identity

    @property
    def expires_at(self) -> int | None:
        """When delivering it can no longer help (its type's deadline from receipt), if ever."""
        deadline = self.lane.options.deadline_ms(self.claimed.update_type)
        return None if deadline is None else self.claimed.received_at + deadline

    def renewal_due(self, now: int) -> bool:
        """A third of the lease has passed since it was last proven."""
        return now - self.renewed_at >= self.lane.lease_ms / 3
