"""Background upkeep beside the dispatcher: delivering exhaustions, pruning settled rows,
keeping the planner's statistics of the table fresh and its dead rows' space reusable.

Exhaustions (durable bots) are delivered to the bot's `exhaustion_url` and acknowledged on a
2xx. Each delivery first takes its exhaustion under a lease in the database
(`take_exhaustions`), so across every process each exhaustion is delivered once while none
dies, and again only after a lease lapses (at least once). A failed delivery's backoff is
kept in the row (`delivery_failed`), so a restart does not reset it, and a sweep reads only
the rows due now. With tracing on, each delivery is a span of the update's trace (of its own
for an update recorded with tracing off): the POST within it (its `traceparent` sent), and the
acknowledgement.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from app import tracing
from app.dispatch.clock import DatabaseClock, wait_or_timeout
from app.dispatch.forward import Downstream, in_client_span
from app.logs import AttemptLog
from app.metrics import AttemptMeters
from app.policy import Outcome
from app.store import Exhaustion, OperatorStore, StoreError, UpdateStore
from app.store.storage import failure_level
from app.store.types import DEFAULT_DESTINATION

if TYPE_CHECKING:
    from opentelemetry.trace import Span

log = logging.getLogger(__name__)

CONCURRENCY = 16  # deliveries at once, and the exhaustions one take leases
MAX_RETRY_SECONDS = 3600.0
MIN_SWEEP_SECONDS = 1.0
LEASE_MARGIN_SECONDS = 30.0


def exhaustion_payload(exhaustion: Exhaustion) -> str:
    """The JSON sent to `exhaustion_url`: the identity, the error, and the update verbatim
    (null, with why, when the key ring cannot open it: docs/privacy.md)."""
    identity = exhaustion.identity
    fields = {
        "bot": identity.bot,
        # Beside `default` (docs/destinations.md): which delivery this is.
        **(
            {}
            if identity.destination == DEFAULT_DESTINATION
            else {"destination": identity.destination}
        ),
        "update_id": identity.update_id,
        "attempt": identity.attempt,
        "claim_id": identity.claim_id,
        "error": exhaustion.error,
        "exhausted_at": exhaustion.exhausted_at,
    }
    if exhaustion.unreadable is not None:
        return json.dumps(fields | {"update": None, "unreadable": exhaustion.unreadable})
    return f'{json.dumps(fields)[:-1]}, "update": {exhaustion.body}}}'


class ExhaustionDelivery:
    """Delivers the open exhaustions of the destinations (of bots) that have an
    `exhaustion_url`: `downstreams` by (bot, destination)."""

    def __init__(
        self,
        store: OperatorStore,
        clock: DatabaseClock,
        downstreams: dict[tuple[str, str], Downstream],
        *,
        retry_seconds: float,
        meters: dict[tuple[str, str], AttemptMeters],
    ) -> None:
        self._store = store
        self._clock = clock
        self._downstreams = downstreams
        self._bots: dict[str, list[str]] = {}  # by destination
        for bot, destination in sorted(downstreams):
            self._bots.setdefault(destination, []).append(bot)
        self._deliveries = {key: meters[key].exhaustion_deliveries for key in downstreams}
        self._retry = retry_seconds
        # A delivery holds its exhaustion for the longest request it may make, and a margin.
        longest = max(d.options.forward_timeout_seconds for d in downstreams.values())
        self._lease_ms = int((longest + LEASE_MARGIN_SECONDS) * 1000)
        self._wake = asyncio.Event()
        self._tracer = tracing.tracer()

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        async def wait(took: float) -> None:
            # In a storm of new exhaustions, one sweep a second.
            await asyncio.sleep(max(0.0, MIN_SWEEP_SECONDS - took))
            await wait_or_timeout(self._wake, self._retry)
            self._wake.clear()

        await repeat_forever("exhaustion delivery", self.sweep, wait)

    async def sweep(self) -> int:
        """Deliver every open exhaustion due now, CONCURRENCY at a time, each taken under its
        delivery lease; how many were delivered and acknowledged."""
        delivered = 0
        for destination, bots in self._bots.items():
            delivered += await self._sweep(destination, bots)
        return delivered

    async def _sweep(self, destination: str, bots: list[str]) -> int:
        delivered = 0
        while True:
            now = self._clock.now()
            taken = await self._store.take_exhaustions(
                now=now,
                lease_until=now + self._lease_ms,
                limit=CONCURRENCY,
                bots=bots,
                destination=destination,
            )
            results = await asyncio.gather(
                *(self._deliver(e) for e in taken), return_exceptions=True
            )
            for result in results:
                if isinstance(result, BaseException):
                    raise result  # after every delivery of the round has ended
            delivered += sum(1 for result in results if result)
            # A failed delivery is due later and a taken one is leased: neither comes back.
            if len(taken) < CONCURRENCY:
                return delivered

    async def _deliver(self, exhaustion: Exhaustion) -> bool:
        """Deliver one exhaustion, and acknowledge it once the receiver took it; with tracing
        on, in a span "deliver exhaustion" of the update's trace (of its own when the update
        has none)."""
        identity = exhaustion.identity
        attributes = {
            tracing.BOT: identity.bot,
            tracing.UPDATE_ID: identity.update_id,
            tracing.ATTEMPT: identity.attempt,
            tracing.CLAIM_ID: identity.claim_id,
            "intake.deliveries": exhaustion.deliveries,  # the failed ones before this
        }
        name, parent = "deliver exhaustion", exhaustion.trace_context
        with tracing.span_of(self._tracer, name, parent, attributes) as span:
            downstream = self._downstreams[identity.bot, identity.destination]
            payload = exhaustion_payload(exhaustion)
            outcome = await in_client_span(
                self._tracer,
                downstream.exhaustion_address or {},
                lambda traceparent: downstream.deliver_exhaustion(
                    identity, payload, traceparent=traceparent
                ),
            )
            delivered(span, outcome)
            if outcome.taken:
                self._deliveries[identity.bot, identity.destination]["delivered"].inc()
                return await tracing.recorded(
                    self._tracer,
                    "acknowledge exhaustion",
                    lambda: self._store.acknowledge_exhaustion(identity, self._clock.now()),
                )
            self._deliveries[identity.bot, identity.destination]["failed"].inc()
            pause = backoff_seconds(self._retry, exhaustion.deliveries)
            await self._store.delivery_failed(exhaustion, self._clock.now() + int(pause * 1000))
            AttemptLog.of(log, identity).warning(
                "exhaustion not delivered (%s); next try in %.0f s", outcome.error, pause
            )
            return False


def delivered(span: Span | None, outcome: Outcome) -> None:
    """A delivery's span (None: tracing off) says whether the receiver took it."""
    if span is not None:
        span.set_attribute(tracing.OUTCOME, "delivered" if outcome.taken else "failed")


def backoff_seconds(retry_seconds: float, failed: int) -> float:
    """How long a delivery that failed waits before the next try: `retry_seconds` doubled for
    each delivery that `failed` before it, up to MAX_RETRY_SECONDS."""
    return min(retry_seconds * 2.0 ** min(failed, 20), MAX_RETRY_SECONDS)


async def repeat_forever(
    what: str, job: Callable[[], Awaitable[object]], wait: Callable[[float], Awaitable[None]]
) -> None:
    """Run `job` again and again, awaiting `wait(seconds the job took)` between runs. A store
    error is logged as a warning and a bug with its traceback: neither ends the loop for the
    life of the process."""
    while True:
        began = time.monotonic()
        try:
            await job()
        except StoreError as error:
            log.log(failure_level(error), "%s: %s", what, error)
        except Exception:
            log.exception("%s failed", what)
        await wait(time.monotonic() - began)


def pause_for(seconds: float) -> Callable[[float], Awaitable[None]]:
    """`repeat_forever`'s wait: `seconds` between the end of one run and the next."""

    async def wait(_took: float) -> None:
        await asyncio.sleep(seconds)

    return wait


SAMPLES_KEPT_MS = 8 * 86_400_000  # the console's week, and a day beside it


async def prune_forever(
    store: OperatorStore, clock: DatabaseClock, *, retention_ms: int, interval: float
) -> None:
    """Delete completed and acknowledged rows settled more than `retention_ms` ago, and the
    console's samples older than SAMPLES_KEPT_MS (a table below revision 0011 has none)."""

    async def prune() -> None:
        deleted = await store.prune(clock.now() - retention_ms)
        if deleted:
            log.info("pruned %d settled rows", deleted)
        if store.capability == "durable":
            await store.prune_samples(clock.now() - SAMPLES_KEPT_MS)

    await repeat_forever("prune", prune, pause_for(interval))


# How soon a burst of new rows (after a quiet period, or into an empty table) gets statistics
# that know of it, and how many written rows make a burst; across the cluster the statistics
# are gathered at most once every UPKEEP_MIN_AGE_SECONDS (the store's rule). The table's dead
# rows are vacuumed by the same rule of age, once RECLAIM_MIN_DEAD_ROWS plus RECLAIM_SCALE of
# the live rows are dead.
UPKEEP_CHECK_SECONDS = 1.0
UPKEEP_MIN_AGE_SECONDS = 10.0
STATISTICS_MIN_CHANGES = 1000
RECLAIM_MIN_DEAD_ROWS = 1000
RECLAIM_SCALE = 0.05
RECLAIM_BACKOFF_SECONDS = 60.0
RECLAIM_BACKOFF_MAX_SECONDS = 3600.0


async def keep_table_forever(store: UpdateStore) -> None:
    """The table's upkeep, from the workers: its planner statistics gathered again whenever
    enough rows were written since the last time (the claim and settle plans then hold without
    waiting for autovacuum's analyze), and the space of its dead rows made reusable whenever
    enough are dead (the table and its indexes then stay the size of what they retain, with
    autovacuum off or behind). Each check is one read of the database's counters. A vacuum
    that failed (cancelled by `statement_timeout_ms` on a table too bloated to finish in it)
    is not tried again for RECLAIM_BACKOFF_SECONDS, doubling up to RECLAIM_BACKOFF_MAX_SECONDS."""
    failures, reclaim_after = 0, 0.0
    while True:
        await _upkeep(
            "planner statistics",
            "gathered the planner's statistics of the table",
            store.refresh_statistics(
                min_changes=STATISTICS_MIN_CHANGES, min_age_seconds=UPKEEP_MIN_AGE_SECONDS
            ),
        )
        if time.monotonic() >= reclaim_after:
            done = await _upkeep(
                "reclaiming space (VACUUM; raise statement_timeout_ms, or vacuum it yourself)",
                "vacuumed the table: its dead rows' space is reusable",
                store.reclaim_space(
                    min_dead_rows=RECLAIM_MIN_DEAD_ROWS,
                    scale=RECLAIM_SCALE,
                    min_age_seconds=UPKEEP_MIN_AGE_SECONDS,
                ),
            )
            failures = 0 if done is not None else failures + 1
            if failures:
                backoff = RECLAIM_BACKOFF_SECONDS * 2 ** (failures - 1)
                reclaim_after = time.monotonic() + min(backoff, RECLAIM_BACKOFF_MAX_SECONDS)
        await asyncio.sleep(UPKEEP_CHECK_SECONDS)


async def _upkeep(what: str, done: str, job: Awaitable[bool]) -> bool | None:
    """Run one upkeep job: whether it did its work, None when it failed (logged)."""
    try:
        did = await job
    except StoreError as error:
        log.log(failure_level(error), "%s: %s", what, error)
        return None
    except Exception:  # a bug must not end this upkeep for the life of the process
        log.exception("%s failed", what)
        return None
    if did:
        log.info(done)
    return did
