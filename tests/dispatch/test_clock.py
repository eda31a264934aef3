"""The database's clock as each process reads it, on a `ManualClock`: exact, no sleeping."""

from __future__ import annotations

from typing import cast

from app.dispatch.clock import DatabaseClock
from app.store import DurableUpdateStore
from tests.downstream import ManualClock

DATABASE_MS = 1_750_000_000_000  # the database's clock, epoch ms, when the stub is asked
WALL_NS = 1_700_000_000_000 * 1_000_000  # this host's wall clock: well behind the database


class Database:
    """Answers `database_time` after a round trip of `round_trip` seconds on `clock`."""

    def __init__(self, clock: ManualClock, round_trip: float) -> None:
        self._clock = clock
        self._round_trip = round_trip

    async def database_time(self) -> int:
        self._clock.advance(self._round_trip / 2)
        at = DATABASE_MS
        self._clock.advance(self._round_trip / 2)
        return at


def database_clock(local: ManualClock, *, round_trip: float = 0.010) -> DatabaseClock:
    store = cast(DurableUpdateStore, Database(local, round_trip))
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
    # The database answered 5 ms into a 10 ms round trip; the trip has ended since.
    assert clock.now() == DATABASE_MS + 5


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
