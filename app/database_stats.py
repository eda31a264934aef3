"""The metrics' database part (docs/operations.md lists each metric): rows by bot and state,
open exhaustions, the oldest undelivered age, and what the webhook watch last saw of Telegram.

It comes from `store.stats()` at scrape time, cached for a few seconds so that frequent scrapes
cannot hammer the database, with at most one query in flight. A failed or slow query never fails
the scrape: `telegram_intake_database_up` is 0 and the database's series are left out. Rows of
bots not configured here count under `(other)` (`app.metric_labels`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.metric_labels import OTHER_BOTS, PREFIX
from app.store import BotControl, BotStats, OperatorStore, StoreError
from app.store.types import DELIVERY_STATES, STATES

__all__ = ["DatabaseStats"]

# The metrics' lines, under the one name log filters know them by.
log = logging.getLogger("app.metrics")


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
        self._deliveries: list[BotStats] = []  # beside the rows, by destination (0010)
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
            self._rows, self._deliveries, self._controls, self._query_seconds = query.result()
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
        rows, exhaustions, oldest, up, seconds, pending, error_date, *beside = families
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
            _report_deliveries(self._deliveries, self._bots, now, *beside)
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
        GaugeMetricFamily(
            PREFIX + "deliveries",
            "Deliveries to a bot's destinations other than default, by state (revision 0010).",
            labels=["bot", "destination", "state"],
        ),
        GaugeMetricFamily(
            PREFIX + "delivery_unacknowledged_exhaustions",
            "Exhaustions of deliveries to a destination other than default, not yet acknowledged.",
            labels=["bot", "destination"],
        ),
        GaugeMetricFamily(
            PREFIX + "delivery_oldest_undelivered_age_seconds",
            "Age of the oldest pending, processing or failed delivery to a destination other"
            " than default; 0 when there is none.",
            labels=["bot", "destination"],
        ),
    )


def _report_deliveries(
    stats: Iterable[BotStats],
    bots: tuple[str, ...],
    now: int,
    rows: GaugeMetricFamily,
    exhaustions: GaugeMetricFamily,
    oldest: GaugeMetricFamily,
) -> None:
    """The deliveries' gauges, per configured bot and destination that has any."""
    for row in stats:
        if row.bot not in bots:
            continue
        labels = [row.bot, row.destination]
        for state in DELIVERY_STATES:
            rows.add_metric([*labels, state], row.states.get(state, 0))
        exhaustions.add_metric(labels, row.unacknowledged_exhaustions or 0)
        age = row.oldest_undelivered_at
        oldest.add_metric(labels, 0 if age is None else max(0, now - age) / 1000)


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


_Answer = tuple[list[BotStats], list[BotStats], list[BotControl], float]


async def _timed_stats(store: OperatorStore) -> _Answer:
    started = time.perf_counter()
    rows = await store.stats()
    deliveries = await store.stats(deliveries=True)
    # The bots' controls (what the webhook watch saw) stand beside the table from 0004.
    controls = await store.bot_controls() if store.capability == "durable" else []
    return rows, deliveries, controls, time.perf_counter() - started


def _retrieve(query: asyncio.Task[_Answer]) -> None:
    """Mark a query's failure seen, for one that ended after its scrape gave up on it."""
    if not query.cancelled():
        query.exception()
