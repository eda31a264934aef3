"""The database's clock as each process reads it, on a `ManualClock`: exact, no sleeping."""

from __future__ import annotations

from typing import cast

from app.dispatch.clock import DatabaseClock
from app.store import DurableUpdateStore
from tests.downstream import ManualClock

DATABASE_MS = 1_750_000_000_000  # the database's clock, epoch ms, when the stub is asked
WALL_NS = 1_700_000_000_000 * 1_000_000  # this host's wall clock: well behind the database


class Database:
    """A database whose clock reads `DATABASE_MS` at the local clock's zero and runs with it.
    Each read takes a round trip of `round_trip` seconds, the database reading its clock at
    the midpoint; the first read waits `connect` seconds more for a connection first."""

    def __init__(self, clock: ManualClock, round_trip: float, connect: float = 0.0) -> None:
        self._clock = clock
        self._round_trip = round_trip
        self._connect = connect

    async def database_time(self) -> int:
        self._clock.advance(self._connect + self._round_trip / 2)
        self._connect = 0.0
        at = DATABASE_MS + self._clock.monotonic_ns() // 1_000_000
        self._clock.advance(self._round_trip / 2)
        return at


def database_clock(
    local: ManualClock, *, round_trip: float = 0.010, connect: float = 0.0
) -> DatabaseClock:
    store = cast(DurableUpdateStore, Database(local, round_trip, connect))
    return DatabaseClock(store, monotonic_ns=local.monotonic_ns, time_ns=lambda: WALL_NS)


async def test_before_its_first_sync_the_clock_guesses_the_wall_clock() -> None:
    local = ManualClock()
    clock = database_clock(local)
    assert clock.now() == WALL_NS // 1_000_000
    local.advance(1.5)
    assert clock.now() == WALL_NS // 1_000_000 + 1_500


async def test_sync_takes_the_database_clock_at_the_round_trips_midpoint() -> None:
    local = ManualClock()
    clock = database_clock(local, round_trip=0.010)
    await clock.sync()
    # Three reads of 10 ms each: the clock reads the database's own time, to the millisecond.
    assert local.monotonic_ns() == 30_000_000
    assert clock.now() == DATABASE_MS + 30


async def test_a_read_that_waited_for_a_connection_does_not_set_the_clock_ahead() -> None:
    """The first read waits 2.5 s for a connection (a loaded host) before the database reads
    its clock: its midpoint would set the clock 1.25 s ahead, and every lease would be judged
    that much early. The shortest of the reads sets it."""
    local = ManualClock()
    clock = database_clock(local, round_trip=0.010, connect=2.5)
    await clock.sync()
    assert clock.now() == DATABASE_MS + local.monotonic_ns() // 1_000_000
    one_read = database_clock(ManualClock(), round_trip=0.010, connect=2.5)
    await one_read.sync(reads=1)  # the control: one read is set ahead by half the wait
    assert one_read.now() - (DATABASE_MS + 2_510) == 1_250


async def test_now_runs_on_the_local_monotonic_clock_between_syncs() -> None:
    local = ManualClock()
    clock = database_clock(local, round_trip=0.0)
    await clock.sync()
    local.advance(30)
    assert clock.now() == DATABASE_MS + 30_000


async def test_seconds_until_counts_down_to_a_time_and_stops_at_zero() -> None:
    local = ManualClock()
    clock = database_clock(local, round_trip=0.0)
    await clock.sync()
    assert clock.seconds_until(DATABASE_MS + 2_500) == 2.5
    local.advance(1)
    assert clock.seconds_until(DATABASE_MS + 2_500) == 1.5
    local.advance(2)
    assert clock.seconds_until(DATABASE_MS + 2_500) == 0.0
