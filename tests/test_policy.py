"""Outcome classification (docs/contract.md section 6), Retry-After and backoff (the breaker has
its own tests, under tests/dispatch)."""

from __future__ import annotations

import email.utils
import time

import httpx
import pytest
from pydantic import SecretStr

from app.bot_settings import BotSettings
from app.policy import (
    Outcome,
    classify,
    classify_answer,
    classify_error,
    retry_after,
    retry_delay_ms,
)

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


def test_retry_after_counts_an_http_date_from_the_clock_given() -> None:
    date = "Wed, 21 Oct 2015 07:28:00 GMT"
    at = email.utils.parsedate_to_datetime(date).timestamp()
    assert retry_after(date, now=lambda: at - 90) == 90.0
    assert retry_after(date, now=lambda: at) == 0.0
    assert retry_after(date, now=lambda: at + 5) == 0.0  # a date past is no wait at all


def test_a_429_carries_its_retry_after() -> None:
    assert answer(429, **{"retry-after": "12"}).retry_after == 12.0


def test_retry_delay_by_default_is_random_over_the_whole_range() -> None:
    bot = BOT.model_copy(update={"retry_base_seconds": 2, "retry_cap_seconds": 600})
    retry = Outcome("retry", "HTTP 500")
    for attempt, ceiling in ((1, 2_000), (3, 8_000), (9, 512_000), (10, 600_000), (60, 600_000)):
        delays = [retry_delay_ms(bot, attempt, retry) for _ in range(300)]
        assert all(0 <= d <= ceiling for d in delays)
        assert max(delays) > ceiling * 0.8  # spread over the whole range, not clustered
        assert min(delays) < ceiling * 0.2


@pytest.mark.parametrize(
    ("attempt", "ceiling_ms"), [(1, 2_000), (2, 4_000), (3, 8_000), (9, 512_000), (10, 600_000)]
)
def test_retry_delay_is_the_jitter_times_the_exponential_ceiling(
    attempt: int, ceiling_ms: int
) -> None:
    bot = BOT.model_copy(update={"retry_base_seconds": 2, "retry_cap_seconds": 600})
    retry = Outcome("retry", "HTTP 500")
    for jitter, delay in ((0.0, 0), (0.25, ceiling_ms // 4), (0.5, ceiling_ms // 2)):
        assert retry_delay_ms(bot, attempt, retry, jitter=lambda j=jitter: j) == delay
    # random.random() is below 1: the longest wait falls just short of the ceiling.
    assert retry_delay_ms(bot, attempt, retry, jitter=lambda: 1 - 2**-53) == ceiling_ms - 1


def test_retry_delay_ceiling_stops_doubling_at_the_cap_for_any_attempt() -> None:
    bot = BOT.model_copy(update={"retry_base_seconds": 0.5, "retry_cap_seconds": 30})
    retry = Outcome("retry", "HTTP 503")
    half = [retry_delay_ms(bot, attempt, retry, jitter=lambda: 0.5) for attempt in (1, 6, 7, 10**6)]
    assert half == [250, 8_000, 15_000, 15_000]  # 0.5 s doubled: 16 s, then the 30 s cap


def test_retry_after_wins_over_backoff_within_its_cap() -> None:
    bot = BOT.model_copy(update={"retry_after_cap_seconds": 30})
    assert retry_delay_ms(bot, 1, Outcome("retry", "429", retry_after=5)) == 5_000
    assert retry_delay_ms(bot, 1, Outcome("retry", "429", retry_after=3_600)) == 30_000


def test_each_outcome_says_what_came_back_as_the_metrics_count_it() -> None:
    assert classify_answer(200, None, b"").answer == "2xx"
    assert classify_answer(302, None, b"").answer == "3xx"
    assert classify_answer(404, None, b"").answer == "4xx"
    assert classify_answer(503, None, b"").answer == "5xx"
    assert classify_answer(999, None, b"").answer == "other"
    assert classify_error(httpx.ReadTimeout("slow")).answer == "timeout"
    assert classify_error(httpx.ConnectError("refused")).answer == "connection_error"
