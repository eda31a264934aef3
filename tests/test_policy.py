"""Outcome classification (SPEC section 6), Retry-After, backoff, and the breaker."""

from __future__ import annotations

import email.utils
import time

import httpx
import pytest
from pydantic import SecretStr

from app.config import BotSettings
from app.dispatch.breaker import Breaker
from app.policy import Outcome, classify, classify_error, retry_after, retry_delay_ms

BOT = BotSettings(name="shop", secret_token=SecretStr("s"))


def answer(code: int, **headers: str) -> Outcome:
    return classify(httpx.Response(code, headers=headers, content=b'{"ok": false}'))


@pytest.mark.parametrize("code", [200, 201, 204, 299])
def test_classify_2xx_but_202_completes(code: int) -> None:
    assert answer(code).kind == "completed"


def test_classify_202_defers_to_the_downstream() -> None:
    assert answer(202).kind == "deferred"


@pytest.mark.parametrize("code", [301, 302, 307, 408, 425, 429, 500, 502, 503, 504])
def test_classify_retries_3xx_408_425_429_and_5xx(code: int) -> None:
    outcome = answer(code)
    assert outcome.kind == "retry"
    assert outcome.error == f'HTTP {code}: {{"ok": false}}'
    assert outcome.downstream_failed


@pytest.mark.parametrize("code", [400, 401, 403, 404, 409, 410, 422])
def test_classify_other_4xx_is_terminal(code: int) -> None:
    outcome = answer(code)
    assert outcome.kind == "terminal"
    assert not outcome.downstream_failed


def test_classify_keeps_errors_short_and_printable() -> None:
    response = httpx.Response(500, content=b"x\x00y\n" + b"z" * 10_000)
    error = classify(response).error
    assert error is not None
    assert len(error) < 600
    assert "\x00" not in error
    assert "\n" not in error


def test_classify_error_retries_timeouts_and_connection_errors() -> None:
    timeout = classify_error(httpx.ReadTimeout("slow"))
    refused = classify_error(httpx.ConnectError("refused"))
    assert (timeout.kind, refused.kind) == ("retry", "retry")
    assert timeout.error is not None
    assert timeout.error.startswith("timeout")
    assert refused.error is not None
    assert refused.error.startswith("connection error")


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after("7") == 7.0
    assert retry_after(" 0 ") == 0.0
    in_a_minute = email.utils.formatdate(time.time() + 60, usegmt=True)
    assert 55 <= (retry_after(in_a_minute) or 0) <= 61
    assert retry_after(email.utils.formatdate(time.time() - 60, usegmt=True)) == 0.0
    for unreadable in (None, "", "soon", "-5", "1.5e9", "Mon, 99 Foo 2026"):
        assert retry_after(unreadable) is None


def test_a_429_carries_its_retry_after() -> None:
    assert answer(429, **{"retry-after": "12"}).retry_after == 12.0


def test_retry_delay_is_full_jitter_under_the_exponential_ceiling() -> None:
    bot = BOT.model_copy(update={"retry_base_seconds": 2, "retry_cap_seconds": 600})
    retry = Outcome("retry", "HTTP 500")
    for attempt, ceiling in ((1, 2_000), (3, 8_000), (9, 512_000), (10, 600_000), (60, 600_000)):
        delays = [retry_delay_ms(bot, attempt, retry) for _ in range(300)]
        assert all(0 <= d <= ceiling for d in delays)
        assert max(delays) > ceiling * 0.8  # spread over the whole range, not clustered
        assert min(delays) < ceiling * 0.2


def test_retry_after_wins_over_backoff_within_its_cap() -> None:
    bot = BOT.model_copy(update={"retry_after_cap_seconds": 30})
    assert retry_delay_ms(bot, 1, Outcome("retry", "429", retry_after=5)) == 5_000
    assert retry_delay_ms(bot, 1, Outcome("retry", "429", retry_after=3_600)) == 30_000


def test_breaker_opens_after_consecutive_failures_and_probes_after_the_cooldown() -> None:
    breaker = Breaker("shop", failures=3, cooldown=0.2)
    for _ in range(2):
        breaker.record(failed=True)
    breaker.record(failed=False)  # a success resets the count
    for _ in range(2):
        breaker.record(failed=True)
    assert breaker.allowance(10) == 10
    breaker.record(failed=True)
    assert breaker.state == "open"
    assert breaker.allowance(10) == 0
    time.sleep(0.25)
    assert breaker.state == "half-open"
    assert breaker.allowance(10) == 1  # one probe
    breaker.started(1)
    assert breaker.allowance(10) == 0  # while the probe is out
    breaker.record(failed=True)
    assert breaker.state == "open"  # the probe failed: another cool-down
    time.sleep(0.25)
    breaker.started(breaker.allowance(10))
    breaker.record(failed=False)
    assert breaker.state == "closed"
    assert breaker.allowance(10) == 10


def test_breaker_with_zero_failures_never_opens() -> None:
    breaker = Breaker("shop", failures=0, cooldown=60)
    for _ in range(100):
        breaker.record(failed=True)
    assert breaker.allowance(5) == 5
