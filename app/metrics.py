"""Prometheus metrics: what the service counts as it works (docs/operations.md lists each
metric), and the exposition that adds what it reads from the database when scraped
(`app.database_stats`).

`Metrics` owns a registry of its own, one per app or worker process (never prometheus-client's
global one: several apps in one test process must not collide), and hands each part the
children it counts with, bound to their labels once per bot. A webhook request then costs a
dict lookup, one counter increment and one histogram observation. The label values are the
bounded sets of `app.metric_labels`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar, get_args

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from app.config import Settings
from app.database_stats import DatabaseStats
from app.metric_labels import (
    PREFIX,
    AttemptOutcome,
    CloseReason,
    DeliveryResult,
    ForwardAnswer,
    IntakeResult,
    LostReason,
    PollResult,
    Refusal,
    RenewalResult,
    WebhookCheck,
)
from app.samples import Tally
from app.store import EventType
from app.store.storage import StorageWatch
from app.store.types import DEFAULT_DESTINATION

__all__ = ["CONTENT_TYPE", "AttemptMeters", "IntakeMeters", "Metrics"]

# Each counter's `_created` twin would double the series for a start time nobody graphs.
# Process-wide, as the PROMETHEUS_DISABLE_CREATED_SERIES switch is.
disable_created_metrics()  # type: ignore[no-untyped-call]

# The classic text format, which every Prometheus reads (generate_latest writes it for names
# like ours; prometheus-client's CONTENT_TYPE_LATEST names a newer version since 0.22).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Seconds. The webhook's answer waits for a commit (milliseconds; commit_timeout_ms at worst);
# a forward waits for the bot's own handler (forward_timeout_seconds, default 30).
WEBHOOK_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
FORWARD_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# Receipt to delivery: milliseconds when all is well, minutes to hours through retries.
DELIVERY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)

Key = TypeVar("Key", bound=str)


def _bound(metric: Counter, labels: tuple[str, ...], keys: Iterable[Key]) -> dict[Key, Counter]:
    """The children of `metric` for `labels` (a bot, and a destination) and each key, made now
    (so each series starts at 0)."""
    return {key: metric.labels(*labels, key) for key in keys}


def _by_reason(
    registry: CollectorRegistry, name: str, documentation: str, reasons: Iterable[Key]
) -> dict[Key, Counter]:
    """A counter of no bot, its child for each reason made now (so each series starts at 0)."""
    counter = Counter(PREFIX + name, documentation, ["reason"], registry=registry)
    return {reason: counter.labels(reason) for reason in reasons}


@dataclass(frozen=True, slots=True)
class IntakeMeters:
    """One bot's webhook counters, bound to its labels."""

    requests: Mapping[IntakeResult, Counter]
    duration: Histogram
    commit_wait: Histogram

    def answered(self, result: IntakeResult, seconds: float) -> None:
        self.requests[result].inc()
        self.duration.observe(seconds)


@dataclass(frozen=True, slots=True)
class PollMeters:
    """One bot's long-polling counters, bound to its labels."""

    requests: Mapping[PollResult, Counter]
    updates: Counter
    offset: Gauge
    last_error: Gauge  # when the last getUpdates failed, epoch seconds (0: none yet)


@dataclass(frozen=True, slots=True)
class AttemptMeters:
    """One destination's dispatch counters (a bot's `default` or another), bound to its
    labels."""

    attempts: Mapping[AttemptOutcome, Counter]
    forward_duration: Histogram
    answers: Mapping[ForwardAnswer, Counter]
    delivery: Histogram  # receipt to the 2xx that completed it
    in_flight: Gauge
    renewals: Mapping[RenewalResult, Counter]
    owner_lost: Mapping[LostReason, Counter]
    exhaustion_deliveries: Mapping[DeliveryResult, Counter]


class Metrics:
    """The metrics of one app or worker process, in a registry of their own."""

    def __init__(
        self,
        bots: Iterable[str],
        *,
        stats_cache_seconds: float = 5.0,
        stats_timeout_seconds: float = 5.0,
    ) -> None:
        self.registry = registry = CollectorRegistry()
        # What the console's charts are drawn from (`app.samples`): counted beside the metrics.
        self.tally = Tally()
        # The process's own: CPU, memory, open files (Linux; nothing elsewhere).
        ProcessCollector(registry=registry)
        self.bots = tuple(bots)
        self._requests = Counter(
            PREFIX + "webhook_requests",
            "Webhook requests answered, by result.",
            ["bot", "result"],
            registry=registry,
        )
        self._request_duration = Histogram(
            PREFIX + "webhook_request_duration_seconds",
            "Webhook requests, from the route's start to its answer (the commit included).",
            ["bot"],
            registry=registry,
            buckets=WEBHOOK_BUCKETS,
        )
        self._commit_wait = Histogram(
            PREFIX + "webhook_commit_wait_seconds",
            "Valid webhook updates, from the body's arrival to the commit's answer (committed or"
            " not): what INTAKE_COMMIT_TIMEOUT_MS bounds.",
            ["bot"],
            registry=registry,
            buckets=WEBHOOK_BUCKETS,
        )
        self._attempts = Counter(
            PREFIX + "attempts",
            "Delivery attempts ended, by destination and outcome.",
            ["bot", "destination", "outcome"],
            registry=registry,
        )
        self._forward_duration = Histogram(
            PREFIX + "forward_duration_seconds",
            "Downstream requests that got an answer or failed (not those cancelled).",
            ["bot", "destination"],
            registry=registry,
            buckets=FORWARD_BUCKETS,
        )
        self._answers = Counter(
            PREFIX + "forward_answers",
            "Downstream requests by what came back: the status's class (2xx, 3xx, 4xx, 5xx), a"
            " timeout or a connection error.",
            ["bot", "destination", "answer"],
            registry=registry,
        )
        self._delivery = Histogram(
            PREFIX + "delivery_seconds",
            "From an update's receipt to the 2xx that completed its delivery, by the"
            " database's clock (retries and backoff included).",
            ["bot", "destination"],
            registry=registry,
            buckets=DELIVERY_BUCKETS,
        )
        self._in_flight = Gauge(
            PREFIX + "attempts_in_flight",
            "Requests to the destination's downstream this process has in flight now.",
            ["bot", "destination"],
            registry=registry,
        )
        self._renewals = Counter(
            PREFIX + "lease_renewals",
            "Lease renewals of attempts still in flight, by what the database answered.",
            ["bot", "destination", "result"],
            registry=registry,
        )
        self._owner_lost = Counter(
            PREFIX + "owner_lost",
            "Attempts that lost their claim: the request is cancelled, nothing is settled.",
            ["bot", "destination", "reason"],
            registry=registry,
        )
        self._deliveries = Counter(
            PREFIX + "exhaustion_deliveries",
            "Exhaustion records sent to exhaustion_url, by result.",
            ["bot", "destination", "result"],
            registry=registry,
        )
        self._events = Counter(
            PREFIX + "operational_events",
            "Deliveries of operational events to operations_url, by type and result.",
            ["type", "result"],
            registry=registry,
        )
        self._webhook_checks = Counter(
            PREFIX + "webhook_checks",
            "getWebhookInfo calls this process made for the webhook watch, by result.",
            ["bot", "result"],
            registry=registry,
        )
        self._polls = Counter(
            PREFIX + "poll_requests",
            "getUpdates calls of this process's long poller, by result.",
            ["bot", "result"],
            registry=registry,
        )
        self._polled = Counter(
            PREFIX + "polled_updates",
            "Updates fetched by getUpdates (each batch recorded before it is confirmed).",
            ["bot"],
            registry=registry,
        )
        self._poll_offset = Gauge(
            PREFIX + "poll_offset",
            "The offset this process's poller asks getUpdates for: what it confirmed.",
            ["bot"],
            registry=registry,
        )
        self._clock_offset = Gauge(
            PREFIX + "clock_offset_seconds",
            "The database's clock minus this host's wall clock, as this process last read it.",
            registry=registry,
        )
        self._storage_full = Gauge(
            PREFIX + "storage_full",
            "1 while this process's writes fail for want of space on the database's disk (an"
            " episode of a full disk), else 0.",
            registry=registry,
        )
        self._storage_full_since = Gauge(
            PREFIX + "storage_full_since_timestamp_seconds",
            "When the episode of a full disk this process sees began; 0 while there is none.",
            registry=registry,
        )
        self._poll_error = Gauge(
            PREFIX + "poll_last_error_timestamp_seconds",
            "When this process's poller last met an error from getUpdates (0: none yet).",
            ["bot"],
            registry=registry,
        )
        self._closed = _by_reason(
            registry,
            "connections_closed",
            "Client connections the server closed for a limit (docs/reliability.md).",
            get_args(CloseReason),
        )
        self._refused = _by_reason(
            registry,
            "requests_refused",
            "Requests refused before any route ran, their body unread, by reason.",
            get_args(Refusal),
        )
        self.database = DatabaseStats(
            self.bots, cache_seconds=stats_cache_seconds, timeout_seconds=stats_timeout_seconds
        )
        self.registry.register(self.database)

    @classmethod
    def of(cls, settings: Settings, **options: float) -> Metrics:
        """Metrics for the bots of `settings`."""
        return cls((bot.name for bot in settings.bots), **options)

    def intake(self, bot: str) -> IntakeMeters:
        """The webhook counters of `bot` (a configured name, or UNKNOWN_BOT)."""
        return IntakeMeters(
            _bound(self._requests, (bot,), get_args(IntakeResult)),
            self._request_duration.labels(bot),
            self._commit_wait.labels(bot),
        )

    def polling(self, bot: str) -> PollMeters:
        """The long poller's counters of `bot`."""
        return PollMeters(
            requests=_bound(self._polls, (bot,), get_args(PollResult)),
            updates=self._polled.labels(bot),
            offset=self._poll_offset.labels(bot),
            last_error=self._poll_error.labels(bot),
        )

    def clock_offset(self, offset: Callable[[], float]) -> None:
        """Read the clock offset gauge from `offset` (`DatabaseClock.host_offset_seconds`)."""
        self._clock_offset.set_function(offset)

    def storage(self, watch: StorageWatch) -> None:
        """Read the full-disk gauges from `watch` (the store's, `app.store.storage`)."""
        self._storage_full.set_function(lambda: 0 if watch.episode is None else 1)
        self._storage_full_since.set_function(
            lambda: 0 if watch.episode is None else watch.episode.began_at / 1000
        )

    def operational_event(self, kind: EventType, result: DeliveryResult) -> None:
        self._events.labels(kind, result).inc()

    def webhook_check(self, bot: str, result: WebhookCheck) -> None:
        self._webhook_checks.labels(bot, result).inc()

    def connection_closed(self, reason: CloseReason) -> None:
        self._closed[reason].inc()

    def request_refused(self, reason: Refusal) -> None:
        self._refused[reason].inc()

    def dispatch(self, bot: str, destination: str = DEFAULT_DESTINATION) -> AttemptMeters:
        """The dispatch counters of `bot`'s `destination`, for a dispatcher that delivers its
        updates there."""
        labels = (bot, destination)
        return AttemptMeters(
            attempts=_bound(self._attempts, labels, get_args(AttemptOutcome)),
            forward_duration=self._forward_duration.labels(*labels),
            answers=_bound(self._answers, labels, get_args(ForwardAnswer)),
            delivery=self._delivery.labels(*labels),
            in_flight=self._in_flight.labels(*labels),
            renewals=_bound(self._renewals, labels, get_args(RenewalResult)),
            owner_lost=_bound(self._owner_lost, labels, get_args(LostReason)),
            exhaustion_deliveries=_bound(self._deliveries, labels, get_args(DeliveryResult)),
        )

    async def exposition(self, bots: Collection[str] | None = None) -> bytes:
        """Every metric in the Prometheus text format, the database's part refreshed (or from
        its cache); with `bots`, only their series and those of no bot."""
        await self.database.refresh()
        if bots is None:
            return generate_latest(self.registry)
        return generate_latest(_OnlyBots(self.registry, frozenset(bots)))


class _OnlyBots(Collector):
    """A registry's samples of some bots only, and those with no bot label."""

    def __init__(self, registry: CollectorRegistry, bots: frozenset[str]) -> None:
        self._registry = registry
        self._bots = bots

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            kept = copy.copy(family)
            kept.samples = [
                sample
                for sample in family.samples
                if "bot" not in sample.labels or sample.labels["bot"] in self._bots
            ]
            yield kept
