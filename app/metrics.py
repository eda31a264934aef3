"""Prometheus metrics: what the service counts as it works, and what it reads from the database
when scraped (docs/operations.md lists each metric).

`Metrics` owns a registry of its own, one per app or worker process (never prometheus-client's
global one: several apps in one test process must not collide), and hands each part the
children it counts with, bound to their labels once per bot. A webhook request then costs a
dict lookup, one counter increment and one histogram observation.

The database's part (rows by bot and state, open exhaustions, the oldest undelivered age) comes
from `store.stats()` at scrape time, cached for a few seconds so that frequent scrapes cannot
hammer the database, with at most one query in flight. A failed or slow query never fails the
scrape: `telegram_intake_database_up` is 0 and the database's series are left out.

Label values stay bounded: bots are the configured ones (an unknown bot's requests count under
`(unknown)`, rows of bots not configured here under `(other)`); results, outcomes and reasons are
the fixed sets below. Never an update id or a claim id.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import math
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal, TypeVar, get_args

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.config import Settings
from app.store import BotControl, BotStats, EventType, OperatorStore, StoreError
from app.store.types import STATES

__all__ = [
    "CONTENT_TYPE",
    "AttemptMeters",
    "CloseReason",
    "DatabaseStats",
    "IntakeMeters",
    "Metrics",
    "Refusal",
]

log = logging.getLogger(__name__)

# Each counter's `_created` twin would double the series for a start time nobody graphs.
# Process-wide, as the PROMETHEUS_DISABLE_CREATED_SERIES switch is.
disable_created_metrics()  # type: ignore[no-untyped-call]

PREFIX = "telegram_intake_"
# The classic text format, which every Prometheus reads (generate_latest writes it for names
# like ours; prometheus-client's CONTENT_TYPE_LATEST names a newer version since 0.22).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
UNKNOWN_BOT = "(unknown)"  # never a bot name: those match ^[a-z0-9][a-z0-9_-]{0,31}$
OTHER_BOTS = "(other)"

IntakeResult = Literal[
    "accepted",  # recorded: 200 after the commit
    "duplicate",  # already recorded: 200, nothing changed
    "forbidden",  # unknown bot or wrong secret token: 403
    "source_refused",  # outside allowed_sources: 403
    "encoded",  # a Content-Encoding, which nothing here decodes: 415
    "too_large",  # 413
    "invalid",  # not a Telegram update: 400
    "disconnected",  # the client went away before its body was read: 400
    "unavailable",  # no commit confirmed in time: 503, Telegram delivers it again
]
AttemptOutcome = Literal[
    "completed",  # 2xx, settled completed
    "deferred",  # 202: the downstream settles it through /v1/claims
    "retry",  # settled failed, due again after backoff
    "terminal",  # a 4xx that is not retried: exhausted (durable) or abandoned
    "spent",  # a retryable answer to the last allowed attempt: ended as terminal is
    "expired",  # past its update type's deadline: ended as terminal is
    "lost",  # owner lost: the claim was taken or lapsed; nothing written
    "handed_back",  # the worker stopped mid-request: made due again at once
    "unsettled",  # the database failed the settle: redelivered once the lease lapses
]
RenewalResult = Literal["renewed", "refused", "failed"]
LostReason = Literal["renewal_refused", "lease_ran_out", "settle_refused", "exhaust_refused"]
DeliveryResult = Literal["delivered", "failed"]
WebhookCheck = Literal["checked", "failed"]  # a getWebhookInfo call answered, or not
# A getUpdates call's result (app.intake.polling): answered, 409 (a webhook is set, or another
# poller runs elsewhere), 429, 401 (the token is refused: polling stops), anything else.
PollResult = Literal["ok", "conflict", "rate_limited", "unauthorized", "failed"]
# Why the server closed a client connection (app.http.server), and what the request guard
# refused before any route ran (app.http.guard).
CloseReason = Literal["header_timeout", "body_timeout", "keep_alive", "header_too_large", "evicted"]
Refusal = Literal["duplicate_header", "unauthenticated", "throttled", "encoding", "too_large"]

# Seconds. The webhook's answer waits for a commit (milliseconds; commit_timeout_ms at worst);
# a forward waits for the bot's own handler (forward_timeout_seconds, default 30).
WEBHOOK_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
FORWARD_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

Key = TypeVar("Key", bound=str)


def _bound(metric: Counter, bot: str, keys: Iterable[Key]) -> dict[Key, Counter]:
    """The children of `metric` for `bot` and each key, made now (so each series starts at 0)."""
    return {key: metric.labels(bot, key) for key in keys}


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
    """One bot's dispatch counters, bound to its labels."""

    attempts: Mapping[AttemptOutcome, Counter]
    forward_duration: Histogram
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
            "Delivery attempts ended, by outcome.",
            ["bot", "outcome"],
            registry=registry,
        )
        self._forward_duration = Histogram(
            PREFIX + "forward_duration_seconds",
            "Downstream requests that got an answer or failed (not those cancelled).",
            ["bot"],
            registry=registry,
            buckets=FORWARD_BUCKETS,
        )
        self._in_flight = Gauge(
            PREFIX + "attempts_in_flight",
            "Attempts this process is running now.",
            ["bot"],
            registry=registry,
        )
        self._renewals = Counter(
            PREFIX + "lease_renewals",
            "Lease renewals of attempts still in flight, by what the database answered.",
            ["bot", "result"],
            registry=registry,
        )
        self._owner_lost = Counter(
            PREFIX + "owner_lost",
            "Attempts that lost their claim: the request is cancelled, nothing is settled.",
            ["bot", "reason"],
            registry=registry,
        )
        self._deliveries = Counter(
            PREFIX + "exhaustion_deliveries",
            "Exhaustion records sent to exhaustion_url, by result.",
            ["bot", "result"],
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
            _bound(self._requests, bot, get_args(IntakeResult)),
            self._request_duration.labels(bot),
            self._commit_wait.labels(bot),
        )

    def polling(self, bot: str) -> PollMeters:
        """The long poller's counters of `bot`."""
        return PollMeters(
            requests=_bound(self._polls, bot, get_args(PollResult)),
            updates=self._polled.labels(bot),
            offset=self._poll_offset.labels(bot),
            last_error=self._poll_error.labels(bot),
        )

    def operational_event(self, kind: EventType, result: DeliveryResult) -> None:
        self._events.labels(kind, result).inc()

    def webhook_check(self, bot: str, result: WebhookCheck) -> None:
        self._webhook_checks.labels(bot, result).inc()

    def connection_closed(self, reason: CloseReason) -> None:
        self._closed[reason].inc()

    def request_refused(self, reason: Refusal) -> None:
        self._refused[reason].inc()

    def dispatch(self, bot: str) -> AttemptMeters:
        """The dispatch counters of `bot`, for a dispatcher that delivers its updates."""
        return AttemptMeters(
            attempts=_bound(self._attempts, bot, get_args(AttemptOutcome)),
            forward_duration=self._forward_duration.labels(bot),
            in_flight=self._in_flight.labels(bot),
            renewals=_bound(self._renewals, bot, get_args(RenewalResult)),
            owner_lost=_bound(self._owner_lost, bot, get_args(LostReason)),
            exhaustion_deliveries=_bound(self._deliveries, bot, get_args(DeliveryResult)),
        )

    async def exposition(self, bots: Collection[str] | None = None) -> bytes:
        """Every metric in the Prometheus text format, the database's part refreshed (or from
        its cache); with `bots`, only their series and those of no bot."""
        await self.database.refresh()
        if bots is None:
            return generate_latest(self.registry)
        return generate_latest(_OnlyBots(self.registry, frozenset(bots)))


class DatabaseStats(Collector):
    """The database's part, from `store.stats()`: refreshed by `refresh` (async, before a
    scrape), reported by `collect` (sync, as prometheus-client calls it)."""

    def __init__(
        self, bots: Iterable[str], *, cache_seconds: float, timeout_seconds: float
    ) -> None:
        self._bots = tuple(bots)
        self._cache_seconds = cache_seconds
        self._timeout_seconds = timeout_seconds
        self._store: OperatorStore | None = None
        self._now: Callable[[], int] = lambda: time.time_ns() // 1_000_000
        self._rows: list[BotStats] | None = None  # None: the last query failed
        self._controls: list[BotControl] = []  # what the webhook watch saw (revision 0004)
        self._query_seconds = 0.0
        self._taken_at = -math.inf  # monotonic
        self._query: asyncio.Task[_Answer] | None = None

    def watch(self, store: OperatorStore, now: Callable[[], int]) -> None:
        """Report on `store`; `now` is epoch ms by the clock the rows' times are by."""
        self._store, self._now = store, now
        self._rows, self._taken_at = None, -math.inf

    async def unwatch(self) -> None:
        """Stop (before the store closes): end a query still in flight."""
        self._store = None
        query, self._query = self._query, None
        if query is not None:
            query.cancel()
            await asyncio.gather(query, return_exceptions=True)

    async def refresh(self) -> None:
        """Query the database unless the last answer is recent; never raises for its sake."""
        store = self._store
        if store is None or time.monotonic() - self._taken_at < self._cache_seconds:
            return
        if self._query is None:
            # Its own task, never cancelled here: a slow query keeps running and the next
            # scrape waits for the same one, so scrapes never pile queries onto the database.
            self._query = asyncio.create_task(_timed_stats(store))
            self._query.add_done_callback(_retrieve)
        query = self._query
        done, _ = await asyncio.wait({query}, timeout=self._timeout_seconds)
        self._taken_at = time.monotonic()
        if not done:
            log.warning("metrics: the stats query took over %g s", self._timeout_seconds)
            self._rows = None
            return
        if self._query is query:
            self._query = None
        if query.cancelled():
            self._rows = None
            return
        try:
            self._rows, self._controls, self._query_seconds = query.result()
        except StoreError as error:
            log.warning("metrics: no stats from the database: %s", error)
            self._rows = None
        except Exception:  # a bug must not fail the whole scrape
            log.exception("metrics: the stats query failed")
            self._rows = None

    def describe(self) -> Iterator[Metric]:
        return iter(_families())

    def collect(self) -> Iterator[Metric]:
        families = _families()
        rows, exhaustions, oldest, up, seconds, pending, error_date = families
        stats = self._rows
        up.add_metric([], 0 if stats is None else 1)
        if stats is not None:
            seconds.add_metric([], self._query_seconds)
            now = self._now()
            # Revision 0001 has no exhaustions to count.
            durable = self._store is not None and self._store.capability != "base"
            for bot, counts in _by_bot(stats, self._bots).items():
                for state in STATES:
                    rows.add_metric([bot, state], counts.states.get(state, 0))
                if durable:
                    exhaustions.add_metric([bot], counts.exhaustions)
                age = 0 if counts.oldest is None else max(0, now - counts.oldest) / 1000
                oldest.add_metric([bot], age)
            for control in self._controls:
                if control.bot not in self._bots or control.webhook_checked_at is None:
                    continue
                pending.add_metric([control.bot], control.webhook_pending or 0)
                error_date.add_metric([control.bot], control.webhook_error_date or 0)
        return iter(families)


def _families() -> tuple[GaugeMetricFamily, ...]:
    """The database's metrics, without samples."""
    return (
        GaugeMetricFamily(
            PREFIX + "rows", "Rows in the table, by bot and state.", labels=["bot", "state"]
        ),
        GaugeMetricFamily(
            PREFIX + "unacknowledged_exhaustions",
            "Exhaustions not yet acknowledged (durable bots; schema revision 0002).",
            labels=["bot"],
        ),
        GaugeMetricFamily(
            PREFIX + "oldest_undelivered_age_seconds",
            "Age of the oldest pending, processing or failed row; 0 when there is none.",
            labels=["bot"],
        ),
        GaugeMetricFamily(
            PREFIX + "database_up", "Whether the last stats query succeeded (1) or not (0)."
        ),
        GaugeMetricFamily(
            PREFIX + "database_stats_duration_seconds", "How long the last stats query took."
        ),
        GaugeMetricFamily(
            PREFIX + "telegram_pending_updates",
            "Updates Telegram holds for the bot's webhook, as the last getWebhookInfo said"
            " (bots with a bot_token).",
            labels=["bot"],
        ),
        GaugeMetricFamily(
            PREFIX + "telegram_webhook_last_error_timestamp_seconds",
            "When Telegram last failed to deliver to the webhook (getWebhookInfo's"
            " last_error_date); 0 when it reports none.",
            labels=["bot"],
        ),
    )


@dataclass
class _Counts:
    states: dict[str, int]
    oldest: int | None = None
    exhaustions: int = 0


def _by_bot(stats: Iterable[BotStats], bots: tuple[str, ...]) -> dict[str, _Counts]:
    """Every configured bot (zeros when it has no rows), and rows of other bots together."""
    merged = {bot: _Counts({}) for bot in bots}
    for row in stats:
        counts = merged.setdefault(row.bot if row.bot in merged else OTHER_BOTS, _Counts({}))
        for state, rows in row.states.items():
            counts.states[state] = counts.states.get(state, 0) + rows
        if row.oldest_undelivered_at is not None:
            counts.oldest = min(
                counts.oldest or row.oldest_undelivered_at, row.oldest_undelivered_at
            )
        counts.exhaustions += row.unacknowledged_exhaustions or 0
    return merged


_Answer = tuple[list[BotStats], list[BotControl], float]


async def _timed_stats(store: OperatorStore) -> _Answer:
    started = time.perf_counter()
    rows = await store.stats()
    # The bots' controls (what the webhook watch saw) stand beside the table from 0004.
    controls = await store.bot_controls() if store.capability == "durable" else []
    return rows, controls, time.perf_counter() - started


def _retrieve(query: asyncio.Task[_Answer]) -> None:
    """Mark a query's failure seen, for one that ended after its scrape gave up on it."""
    if not query.cancelled():
        query.exception()


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
