"""The circuit breaker, on a `ManualClock`: its cool-down is exact, and no test sleeps."""

from __future__ import annotations

from app.dispatch.breaker import Breaker
from tests.downstream import ManualClock


def opened(clock: ManualClock, *, failures: int = 3, cooldown: float = 1.0) -> Breaker:
    """A breaker that has just opened, on `clock`."""
    breaker = Breaker("shop", failures=failures, cooldown=cooldown, monotonic_ns=clock.monotonic_ns)
    for _ in range(failures):
        breaker.record(failed=True)
    assert breaker.state == "open"
    return breaker


def test_breaker_opens_after_consecutive_failures_and_probes_after_the_cooldown() -> None:
    clock = ManualClock()
    breaker = Breaker("shop", failures=3, cooldown=0.2, monotonic_ns=clock.monotonic_ns)
    for _ in range(2):
        breaker.record(failed=True)
    breaker.record(failed=False)  # a success resets the count
    for _ in range(2):
        breaker.record(failed=True)
    assert breaker.allowance(10) == 10
    breaker.record(failed=True)
    assert breaker.state == "open"
    assert breaker.allowance(10) == 0
    clock.advance(0.2)
    assert breaker.state == "half-open"
    assert breaker.allowance(10) == 1  # one probe
    assert breaker.started(1)
    assert breaker.allowance(10) == 0  # while the probe is out
    breaker.record(failed=True)
    assert breaker.state == "open"  # the probe failed: another cool-down
    clock.advance(0.2)
    assert breaker.started(breaker.allowance(10))
    breaker.record(failed=False)
    assert breaker.state == "closed"
    assert breaker.allowance(10) == 10


def test_breaker_stays_open_until_the_cooldown_has_passed() -> None:
    clock = ManualClock()
    breaker = opened(clock, cooldown=1.0)
    clock.advance(0.999)
    assert (breaker.state, breaker.allowance(5)) == ("open", 0)
    clock.advance(0.001)
    assert (breaker.state, breaker.allowance(5)) == ("half-open", 1)


def test_breaker_counts_the_cooldown_down_to_the_probe() -> None:
    clock = ManualClock()
    breaker = opened(clock, cooldown=2.0)
    assert breaker.seconds_until_probe() == 2.0
    clock.advance(1.5)
    assert breaker.seconds_until_probe() == 0.5
    clock.advance(10)
    assert breaker.seconds_until_probe() == 0.0  # overdue: never negative
    assert breaker.started(breaker.allowance(5))
    assert breaker.seconds_until_probe() is None  # a probe is out: nothing waits on the clock


def test_breaker_failed_probe_restarts_the_cooldown_from_its_answer() -> None:
    clock = ManualClock()
    breaker = opened(clock, cooldown=1.0)
    clock.advance(5)  # long past the cool-down before the probe goes out
    assert breaker.started(breaker.allowance(5))
    clock.advance(0.3)  # the probe's request took this long
    breaker.record(failed=True)
    assert breaker.seconds_until_probe() == 1.0
    clock.advance(0.999)
    assert breaker.state == "open"


def test_breaker_probe_ended_unjudged_lets_the_next_claim_probe() -> None:
    clock = ManualClock()
    breaker = opened(clock, cooldown=1.0)
    clock.advance(1)
    assert breaker.started(breaker.allowance(5))
    assert breaker.allowance(5) == 0
    breaker.probe_ended_unjudged()  # expired, lost or handed back: no answer to judge by
    assert breaker.allowance(5) == 1
    assert breaker.state == "half-open"


def test_breaker_started_is_a_probe_only_when_half_open() -> None:
    clock = ManualClock()
    breaker = Breaker("shop", failures=3, cooldown=1.0, monotonic_ns=clock.monotonic_ns)
    assert not breaker.started(5)  # closed: ordinary attempts
    breaker = opened(clock)
    clock.advance(1)
    assert not breaker.started(0)  # nothing was claimed: no probe is out
    assert breaker.allowance(5) == 1


def test_breaker_with_zero_failures_never_opens() -> None:
    breaker = Breaker("shop", failures=0, cooldown=60)
    for _ in range(100):
        breaker.record(failed=True)
    assert breaker.allowance(5) == 5
