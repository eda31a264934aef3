"""What a downstream's answer means (docs/contract.md section 6), and when to try again.

2xx but 202: completed. 202: deferred, the downstream settles through the callback API.
408, 425, 429, 3xx, 5xx, a connection error or a timeout: retry with backoff, honouring
`Retry-After` within a cap. Any other 4xx: terminal.
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import httpx

from app.destinations.settings import DeliveryOptions
from app.metric_labels import ForwardAnswer

Kind = Literal["completed", "deferred", "retry", "terminal"]
RETRYABLE_4XX = frozenset({408, 425, 429})
MAX_ERROR_CHARS = 500
FORWARD_ANSWERS: tuple[ForwardAnswer, ...] = ("2xx", "3xx", "4xx", "5xx")


@dataclass(frozen=True, slots=True)
class Outcome:
    """One attempt's result, as the dispatcher acts on it."""

    kind: Kind
    error: str | None = None
    retry_after: float | None = None  # seconds the downstream asked us to wait
    status: int | None = None  # the downstream's HTTP status; None when none came
    no_answer: Literal["timeout", "connection_error"] | None = None  # why none came

    @property
    def answer(self) -> ForwardAnswer:
        """What came back, as the metrics count it: the status's class, or why none came."""
        if self.status is not None and 200 <= self.status < 600:
            return FORWARD_ANSWERS[self.status // 100 - 2]
        return self.no_answer or "other"

    @property
    def taken(self) -> bool:
        """Any 2xx: the receiver took it (a delivery's success: an exhaustion, an event)."""
        return self.kind in ("completed", "deferred")

    @property
    def downstream_failed(self) -> bool:
        """Whether this counts against the downstream's health (the circuit breaker)."""
        return self.kind == "retry"


def wall_clock_ms() -> int:
    """This host's clock, epoch ms: the default where no database clock is given."""
    return time.time_ns() // 1_000_000


def classify(response: httpx.Response, now: Callable[[], int] = wall_clock_ms) -> Outcome:
    """What an httpx response means (`classify_answer`); its body only if it was read."""
    try:
        content = response.content
    except httpx.ResponseNotRead:
        content = b""
    return classify_answer(response.status_code, response.headers.get("retry-after"), content, now)


def classify_answer(
    status: int,
    retry_after_value: str | None,
    content: bytes,
    now: Callable[[], int] = wall_clock_ms,
) -> Outcome:
    """What an answer means, from its status, its `Retry-After` and its body (which explains
    a failure). `now` (epoch ms) is the clock an HTTP-date `Retry-After` counts from: the
    database's, in a worker, so that a host whose clock is off waits what it was told."""
    if status == 202:
        return Outcome("deferred", status=status)
    if 200 <= status < 300:
        return Outcome("completed", status=status)
    error = f"HTTP {status}"
    detail = _detail(content)
    if detail:
        error = f"{error}: {detail}"
    if 400 <= status < 500 and status not in RETRYABLE_4XX:
        return Outcome("terminal", error, status=status)
    delay = retry_after(retry_after_value, now=lambda: now() / 1000)
    return Outcome("retry", error, delay, status=status if 100 <= status <= 599 else None)


def classify_error(error: httpx.HTTPError) -> Outcome:
    """A request that got no response: always worth another attempt."""
    timeout = isinstance(error, httpx.TimeoutException)
    kind = "timeout" if timeout else "connection error"
    message = f"{kind}: {type(error).__name__}: {error}"[:MAX_ERROR_CHARS]
    return Outcome("retry", message, no_answer="timeout" if timeout else "connection_error")


def _detail(content: bytes) -> str:
    text = content.decode("utf-8", "replace").strip()
    return " ".join(text.split())[:MAX_ERROR_CHARS].replace("\x00", "")


def retry_after(value: str | None, *, now: Callable[[], float] = time.time) -> float | None:
    """Seconds from a `Retry-After` header (delta-seconds or an HTTP date, counted from
    `now`, the wall clock in epoch seconds); None if absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now())


def retry_delay_ms(
    bot: DeliveryOptions,
    attempt: int,
    outcome: Outcome,
    *,
    jitter: Callable[[], float] = random.random,  # spreads retries: no secret hangs on it
) -> int:
    """How long to wait before the next attempt. `Retry-After` within its cap wins; otherwise
    exponential backoff with full jitter: uniform in [0, min(cap, base * 2^(attempt-1))],
    drawn as `jitter()` (in [0, 1)) times the ceiling."""
    if outcome.retry_after is not None:
        return int(min(outcome.retry_after, bot.retry_after_cap_seconds) * 1000)
    ceiling = min(bot.retry_cap_seconds, bot.retry_base_seconds * 2 ** min(attempt - 1, 60))
    return int(jitter() * ceiling * 1000)
