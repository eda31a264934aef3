"""A circuit breaker per downstream, so attempts are not burned while it is down.

Closed: claims flow. After `failures` consecutive failed attempts it opens: nothing of the
bot is claimed for `cooldown` seconds, and updates keep their remaining attempts in the table.
Then one probe attempt is let through (half-open): its success closes the breaker, its failure
opens it again for another cool-down. The cool-down runs on the monotonic clock it is given
(`time.monotonic_ns` unless a test passes a fake).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Literal

log = logging.getLogger(__name__)

BreakerState = Literal["closed", "open", "half-open"]


class Breaker:
    def __init__(
        self,
        name: str,
        *,
        failures: int,
        cooldown: float,
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self._name = name
        self._monotonic_ns = monotonic_ns
        self._threshold = failures  # 0: never opens
        self._cooldown = cooldown
        self._failures = 0
        self._opened_at: float | None = None
        self._probing = False
        # Told "open" as the breaker opens and "closed" as it closes again (the bot's row).
        self.on_change: Callable[[str], None] = lambda _: None

    def _monotonic(self) -> float:
        return self._monotonic_ns() / 1_000_000_000

    @property
    def state(self) -> BreakerState:
        if self._opened_at is None:
            return "closed"
        if self._monotonic() - self._opened_at < self._cooldown:
            return "open"
        return "half-open"

    def seconds_until_probe(self) -> float | None:
        """When the next probe may go out; None when none is waiting on the clock (closed,
        or a probe is out)."""
        if self._opened_at is None or self._probing:
            return None
        return max(0.0, self._cooldown - (self._monotonic() - self._opened_at))

    def allowance(self, wanted: int) -> int:
        """How many of `wanted` attempts may start now."""
        state = self.state
        if state == "closed":
            return wanted
        if state == "open" or self._probing:
            return 0
        return min(wanted, 1)

    def started(self, count: int) -> bool:
        """`count` attempts were claimed under the allowance just given; whether they are
        the probe."""
        if count and self.state == "half-open":
            self._probing = True
            return True
        return False

    def probe_ended_unjudged(self) -> None:
        """The probe ended with no answer to judge by (expired, lost, handed back): the next
        claim may probe again."""
        self._probing = False

    def record(self, *, failed: bool) -> None:
        if not failed:
            if self._opened_at is not None:
                log.info("downstream of bot %r answers again: breaker closed", self._name)
                self.on_change("closed")
            self._failures, self._opened_at, self._probing = 0, None, False
            return
        self._failures += 1
        if self._threshold and (self._probing or self._failures >= self._threshold):
            if self._opened_at is None or self._probing:
                log.warning(
                    "downstream of bot %r failed %d times in a row: breaker open for %.0f s",
                    self._name,
                    self._failures,
                    self._cooldown,
                )
                if self._opened_at is None:
                    self.on_change("open")
            self._opened_at = self._monotonic()
            self._probing = False
