"""Background upkeep beside the dispatcher: delivering exhaustions, pruning settled rows.

Exhaustions (durable bots) are delivered to the bot's `exhaustion_url` and acknowledged on a
2xx. Each sweep pages through every open exhaustion with the `(bot, update_id)` cursor, so a
restart recovers them all and a row whose delivery keeps failing is passed over until its
next try, never holding back the rows after it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from app.dispatch.clock import DatabaseClock, wait_or_timeout
from app.dispatch.forward import Downstream
from app.logs import AttemptLog
from app.metrics import AttemptMeters
from app.store import ClaimIdentity, DurableUpdateStore, Exhaustion, StoreError

log = logging.getLogger(__name__)

PAGE = 100
CONCURRENCY = 16
MAX_RETRY_SECONDS = 3600.0
MIN_SWEEP_SECONDS = 1.0


def exhaustion_payload(exhaustion: Exhaustion) -> str:
    """The JSON sent to `exhaustion_url`: the identity, the error, and the update verbatim."""
    identity = exhaustion.identity
    head = json.dumps(
        {
            "bot": identity.bot,
            "update_id": identity.update_id,
            "attempt": identity.attempt,
            "claim_id": identity.claim_id,
            "error": exhaustion.error,
            "exhausted_at": exhaustion.exhausted_at,
        }
    )
    return f'{head[:-1]}, "update": {exhaustion.body}}}'


class ExhaustionDelivery:
    """Delivers the open exhaustions of the bots that have an `exhaustion_url`."""

    def __init__(
        self,
        store: DurableUpdateStore,
        clock: DatabaseClock,
        downstreams: dict[str, Downstream],
        *,
        retry_seconds: float,
        meters: dict[str, AttemptMeters],
    ) -> None:
        self._store = store
        self._clock = clock
        self._downstreams = downstreams
        self._deliveries = {bot: meters[bot].exhaustion_deliveries for bot in downstreams}
        self._retry = retry_seconds
        self._wake = asyncio.Event()
        self._gate = asyncio.Semaphore(CONCURRENCY)
        # Identity -> (failures so far, monotonic time of the next try).
        self._failing: dict[ClaimIdentity, tuple[int, float]] = {}

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while True:
            self._wake.clear()
            began = time.monotonic()
            try:
                await self.sweep()
            except StoreError as error:
                log.warning("exhaustion delivery: %s", error)
            except Exception:  # a bug must not end delivery for the life of the process
                log.exception("exhaustion delivery failed")
            # A sweep reads every open exhaustion: in a storm of new ones, one a second.
            await asyncio.sleep(max(0.0, MIN_SWEEP_SECONDS - (time.monotonic() - began)))
            await wait_or_timeout(self._wake, self._retry)

    async def sweep(self) -> int:
        """One pass over every open exhaustion; how many were delivered and acknowledged."""
        bots = sorted(self._downstreams)
        after: tuple[str, int] | None = None
        seen: set[ClaimIdentity] = set()
        delivered = 0
        while True:
            page = await self._store.due_exhaustions(limit=PAGE, after=after, bots=bots)
            seen.update(exhaustion.identity for exhaustion in page)
            now = time.monotonic()
            due = [e for e in page if self._failing.get(e.identity, (0, now))[1] <= now]
            results = await asyncio.gather(*(self._deliver(e) for e in due), return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException):
                    raise result  # after every delivery of the page has ended
            delivered += sum(1 for result in results if result)
            if len(page) < PAGE:
                break
            after = (page[-1].identity.bot, page[-1].identity.update_id)
        self._failing = {key: value for key, value in self._failing.items() if key in seen}
        return delivered

    async def _deliver(self, exhaustion: Exhaustion) -> bool:
        identity = exhaustion.identity
        async with self._gate:
            downstream = self._downstreams[identity.bot]
            outcome = await downstream.deliver_exhaustion(identity, exhaustion_payload(exhaustion))
        if outcome.kind not in ("completed", "deferred"):  # any 2xx
            self._deliveries[identity.bot]["failed"].inc()
            failures = self._failing.get(identity, (0, 0.0))[0] + 1
            pause = min(self._retry * 2 ** min(failures - 1, 20), MAX_RETRY_SECONDS)
            self._failing[identity] = (failures, time.monotonic() + pause)
            AttemptLog.of(log, identity).warning(
                "exhaustion not delivered (%s); next try in %.0f s", outcome.error, pause
            )
            return False
        self._failing.pop(identity, None)
        self._deliveries[identity.bot]["delivered"].inc()
        return await self._store.acknowledge_exhaustion(identity, self._clock.now())


async def prune_forever(
    store: DurableUpdateStore, clock: DatabaseClock, *, retention_ms: int, interval: float
) -> None:
    """Delete completed and acknowledged rows settled more than `retention_ms` ago."""
    while True:
        try:
            deleted = await store.prune(clock.now() - retention_ms)
        except StoreError as error:
            log.warning("prune: %s", error)
        except Exception:  # a bug must not end pruning for the life of the process
            log.exception("prune failed")
        else:
            if deleted:
                log.info("pruned %d settled rows", deleted)
        await asyncio.sleep(interval)
