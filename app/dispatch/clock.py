"""One clock for every host: the database's.

Leases are compared against `due_at`, which every worker on every host writes. Each process
reads the database's clock now and then and keeps its offset from the local monotonic clock,
so `now()` costs no round trip, never jumps with the host's wall clock, and agrees across
hosts to within a round trip's half (well under a millisecond on one network).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections.abc import Callable

from app.store import StoreError
from app.store.lifecycle import Lifecycle

log = logging.getLogger(__name__)

# A host's wall clock this far from the database's is said once in the log (and again after
# it came back within it): the service does not need it right, but whoever reads its
# signatures and its logs' times does.
HOST_OFF_SECONDS = 60.0


class DatabaseClock:
    """Epoch milliseconds by the database's clock, read through the local monotonic clock
    (`monotonic_ns`; `time_ns` is the wall clock, the guess until the first sync)."""

    def __init__(
        self,
        store: Lifecycle,
        *,
        resync_seconds: float = 30.0,
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
        time_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self._store = store
        self._resync = resync_seconds
        self._monotonic_ns = monotonic_ns
        self._time_ns = time_ns
        # Until the first sync: the local wall clock, the best guess there is.
        self._offset = time_ns() / 1_000_000 - self._monotonic_ms()
        self._told_off = False  # whether this process said its host's clock is off

    def now(self) -> int:
        return int(self._monotonic_ms() + self._offset)

    def seconds_until(self, at: int) -> float:
        """How long from now until `now()` reaches `at` (0 when it has)."""
        return max(0.0, (at - self._monotonic_ms() - self._offset) / 1000)

    async def sync(self, reads: int = 3) -> None:
        """Read the database's clock `reads` times in a row and keep the offset of the shortest
        round trip, taken at its midpoint: its error is at most half that trip. One read is
        not enough: the first may wait for a connection (seconds, on a loaded host) before the
        database reads its clock, and a midpoint taken across that wait would set this clock
        ahead by half of it, judging every lease early."""
        best: tuple[float, float] | None = None  # (round trip, offset)
        for _ in range(reads):
            before = self._monotonic_ms()
            database = await self._store.database_time()
            after = self._monotonic_ms()
            if best is None or after - before < best[0]:
                best = (after - before, database - (before + after) / 2)
        assert best is not None, "reads must be at least 1"
        self._offset = best[1]
        off = self.host_offset_seconds()
        if abs(off) >= HOST_OFF_SECONDS and not self._told_off:
            self._told_off = True
            log.warning(
                "this host's clock is %.1f s %s the database's: every time the service "
                "decides by is the database's, but a receiver checks signatures' timestamps "
                "against its own clock (docs/operations.md)",
                abs(off),
                "behind" if off > 0 else "ahead of",
            )
        elif abs(off) < HOST_OFF_SECONDS:
            self._told_off = False

    def host_offset_seconds(self) -> float:
        """The database's clock minus this host's wall clock, in seconds, as last read."""
        return (self.now() - self._time_ns() / 1_000_000) / 1000

    async def run(self) -> None:
        """Resync forever; a failed read keeps the last offset (clocks drift slowly)."""
        while True:
            await asyncio.sleep(self._resync)
            try:
                await self.sync()
            except StoreError as error:
                log.warning("could not read the database clock: %s", error)
            except Exception:  # keep the last offset; a bug must not end the resync
                log.exception("could not read the database clock")

    def _monotonic_ms(self) -> float:
        return self._monotonic_ns() / 1_000_000


async def wait_or_timeout(event: asyncio.Event, seconds: float) -> bool:
    """Wait until `event` is set or `seconds` pass; whether it was set."""
    if event.is_set():
        return True
    try:
        await asyncio.wait_for(event.wait(), seconds)
    except TimeoutError:
        return False
    return True


class Alarm:
    """Calls `ring` when each of the times given falls due by `clock`, with one timer armed
    for the earliest (thousands of pending retries cost one timer, not thousands)."""

    def __init__(self, clock: DatabaseClock, ring: Callable[[], None]) -> None:
        self._clock = clock
        self._ring = ring
        self._times: list[int] = []
        self._timer: asyncio.TimerHandle | None = None

    def at(self, when: int) -> None:
        heapq.heappush(self._times, when)
        if self._times[0] == when:
            self._arm()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None

    def _arm(self) -> None:
        self.cancel()
        if self._times:
            # A little late rather than early: uvloop's timers round to whole milliseconds.
            delay = self._clock.seconds_until(self._times[0]) + 0.002
            self._timer = asyncio.get_running_loop().call_later(delay, self._due)

    def _due(self) -> None:
        now = self._clock.now()
        while self._times and self._times[0] <= now:
            heapq.heappop(self._times)
        self._ring()
        self._arm()
