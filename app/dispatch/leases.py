"""The lease keeper: renew the lease of every attempt in flight, or raise owner-lost.

Every lease/3 while its request runs, an attempt's lease is renewed with `renew_owned(...,
now=)` (`renew` for a plain bot), which never revives a lapsed lease. A refused renewal, or
the last proven lease within two ticks of its end (renewals timing out, say), calls `lost`:
the owner-lost signal, which cancels the request while more than a tick of the lease is
left. When its renewals failed because the database cannot write at all (a full disk, a lost
connection), it calls `hand_back` instead: the attempt is not the update's, and spends none
of its budget. The tick is a sixth of the shortest lease, at most 1 s.

An attempt whose settle waits for such a database (`stalled`) keeps its lease renewed too,
where a renewal can still be written: a rival takes nothing from it meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection

from app.dispatch.attempt import Attempt
from app.logs import AttemptLog
from app.metric_labels import LostReason
from app.store import OperatorStore, StoreError, StoreTimedOut, StoreUnavailable
from app.store.storage import failure_level

log = logging.getLogger(__name__)


class LeaseKeeper:
    def __init__(
        self,
        store: OperatorStore,
        now: Callable[[], int],
        attempts: Collection[Attempt],
        lost: Callable[[Attempt, LostReason], None],
        hand_back: Callable[[Attempt, StoreError], None],
        *,
        tick: float,
        beat: Callable[[], None] = lambda: None,
    ) -> None:
        self._store = store
        self._now = now
        self._attempts = attempts
        self._lost = lost
        self._hand_back = hand_back
        self._tick = tick
        self._beat = beat  # every tick, for the worker's health
        self._renewals: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        tick_ms = self._tick * 1000
        try:
            while True:
                await asyncio.sleep(self._tick)
                self._beat()
                now = self._now()
                for attempt in list(self._attempts):
                    if attempt.lost or attempt.handed_back:
                        continue
                    if not attempt.forwarding and not attempt.stalled:
                        continue  # settling: its settle lands in a moment
                    if attempt.forwarding and now + 2 * tick_ms >= attempt.lease_until:
                        # It could lapse before the look after next: stop the request while
                        # at least a look's worth of the lease still holds (more than a tick
                        # even when this look came late), rather than let it run unowned.
                        error = attempt.renewal_error
                        if isinstance(error, StoreUnavailable) and not isinstance(
                            error, StoreTimedOut
                        ):
                            self._hand_back(attempt, error)
                        else:
                            self._lost(attempt, "lease_ran_out")
                    elif (
                        not attempt.renewing
                        and now - attempt.renewed_at >= attempt.lane.lease_ms / 3
                    ):
                        attempt.renewing = True
                        renewal = asyncio.create_task(self._renew(attempt, now))
                        self._renewals.add(renewal)
                        renewal.add_done_callback(self._renewals.discard)
        finally:
            for renewal in self._renewals:
                renewal.cancel()

    async def _renew(self, attempt: Attempt, now: int) -> None:
        identity = attempt.identity
        lease_until = now + attempt.lane.lease_ms
        try:
            if attempt.lane.plain:
                renewed = await self._store.renew(
                    identity.bot, identity.update_id, identity.attempt, lease_until, now=now
                )
            else:
                renewed = await self._store.renew_owned(identity, lease_until, now=now)
        except StoreError as error:
            attempt.renewal_error = error
            attempt.lane.meters.renewals["failed"].inc()
            AttemptLog.of(log, attempt.identity).log(
                failure_level(error), "renewal failed (%s); will retry", error
            )
            return
        finally:
            attempt.renewing = False
        attempt.renewal_error = None
        if attempt.lost or not (attempt.forwarding or attempt.stalled):
            return  # the attempt ended meanwhile: a refusal now means nothing
        attempt.lane.meters.renewals["renewed" if renewed else "refused"].inc()
        if renewed:
            attempt.lease_until = max(attempt.lease_until, lease_until)
            attempt.renewed_at = now
        elif attempt.forwarding:
            self._lost(attempt, "renewal_refused")
        # A stalled settle's renewal refused: its settle, fenced alike, is refused too, unless
        # the lease only lapsed (no other claim), when it still lands.
