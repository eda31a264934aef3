"""Failed authentications slowed per source address (issue 29, docs/contract.md section 16;
`app.http.throttle`): the limiter alone on a made-up clock, then the request guard's bearer
keys and the console's sign-in on a real uvicorn server, a second source being a second
loopback address (127.0.0.2) or an address a trusted proxy forwards. Nothing here depends on
the database: SQLite."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from app.config import Settings
from app.http.throttle import AuthThrottle
from tests.api.conftest import KEY, VIEWER_KEY, Api, bearer, serving
from tests.conftest import Storage

BURST = 3
# Per failure on the servers: room for a slow machine between a test's steps (it sleeps the
# Retry-After it is given). The limiter alone runs on a made-up clock, one second a failure.
SECONDS = 2.0
WRONG = "wrong-key.0123456789abcdef"
OTHER_SOURCE = "127.0.0.2"  # the whole of 127/8 is this host's loopback


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def throttle(clock: Clock, **options: Any) -> AuthThrottle:
    return AuthThrottle(burst=BURST, seconds=1, clock=clock, **options)


def scope(peer: str | None, forwarded: str | None = None) -> dict[str, Any]:
    headers = [] if forwarded is None else [(b"x-forwarded-for", forwarded.encode())]
    return {"type": "http", "client": None if peer is None else (peer, 5000), "headers": headers}


# -- the limiter ------------------------------------------------------------------------------


def test_a_source_may_fail_a_burst_then_one_more_each_interval() -> None:
    clock = Clock()
    limiter = throttle(clock)
    for _ in range(BURST):
        assert limiter.retry_after("198.51.100.1") == 0
        limiter.failed("198.51.100.1")
    assert limiter.retry_after("198.51.100.1") == 1
    clock.now += 0.5
    assert limiter.retry_after("198.51.100.1") == 1  # at least 1: never "retry after 0"
    clock.now += 0.5
    assert limiter.retry_after("198.51.100.1") == 0
    limiter.failed("198.51.100.1")  # the one more the interval allows
    assert limiter.retry_after("198.51.100.1") == 1
    # Failures while throttled (none reach it through the guard) push the wait further.
    for _ in range(5):
        limiter.failed("198.51.100.1")
    assert limiter.retry_after("198.51.100.1") == 6
    clock.now += 6
    assert limiter.retry_after("198.51.100.1") == 0


def test_a_source_that_is_not_failing_is_never_throttled_whatever_others_do() -> None:
    clock = Clock()
    limiter = throttle(clock, max_sources=50)
    for n in range(10_000):
        limiter.failed(f"10.0.{n // 256}.{n % 256}")
        limiter.failed("198.51.100.1")
    assert limiter.retry_after("198.51.100.2") == 0
    assert limiter.retry_after("198.51.100.1") > 0


def test_the_table_stays_bounded_under_a_flood_of_sources() -> None:
    clock = Clock()
    limiter = throttle(clock, max_sources=100)
    for n in range(100_000):
        limiter.failed(str(ipaddress.IPv4Address(0x0A000000 + n)))
        assert len(limiter) <= 100
    # The latest are remembered; the first, forgotten to make room, may guess again.
    newest = str(ipaddress.IPv4Address(0x0A000000 + 99_999))
    for _ in range(BURST - 1):
        limiter.failed(newest)
    assert limiter.retry_after(newest) == 1
    assert limiter.retry_after("10.0.0.0") == 0
    # Once their buckets refill, sources are forgotten as soon as anyone fails again.
    clock.now += BURST
    limiter.failed("198.51.100.1")
    assert len(limiter) == 1


def test_the_source_is_read_as_the_webhook_s_allowlist_reads_it() -> None:
    proxy = ipaddress.ip_network("10.9.0.0/16")
    limiter = throttle(Clock(), trusted_proxies=[proxy])
    assert limiter.source(scope("203.0.113.5")) == "203.0.113.5"
    # X-Forwarded-For counts from a trusted proxy only: a client cannot pick its address.
    assert limiter.source(scope("203.0.113.5", "192.0.2.1")) == "203.0.113.5"
    assert limiter.source(scope("10.9.0.1", "192.0.2.1, 10.9.0.2")) == "192.0.2.1"
    assert limiter.source(scope("::ffff:203.0.113.5")) == "203.0.113.5"
    # An IPv6 host holds its /64 whole: its addresses are one source.
    assert limiter.source(scope("2001:db8:1:2::5")) == "2001:db8:1:2::/64"
    assert limiter.source(scope("2001:db8:1:2:ffff::1")) == "2001:db8:1:2::/64"
    assert limiter.source(scope(None)) == "(unknown)"


def test_a_source_that_cannot_be_told_is_never_throttled() -> None:
    # On a unix socket every request would be "(unknown)": one stranger must not be able to
    # spend one shared allowance for every client.
    limiter = AuthThrottle(burst=2, seconds=60)
    unknown = limiter.source({"type": "http", "client": None, "headers": []})
    for _ in range(10):
        limiter.failed(unknown)
    assert limiter.retry_after(unknown) == 0
    assert len(limiter) == 0


# -- bearer keys, through the request guard ----------------------------------------------------


@asynccontextmanager
async def served(
    storage: Storage, **overrides: Any
) -> AsyncIterator[tuple[Api, httpx.AsyncClient]]:
    """The service with a small allowance, and a client of it from a second address."""
    options = {"auth_failures_burst": BURST, "auth_failure_seconds": SECONDS, **overrides}
    transport = httpx.AsyncHTTPTransport(local_address=OTHER_SOURCE)
    async with (
        serving(storage.url(), **options) as api,
        httpx.AsyncClient(base_url=api.base, transport=transport, timeout=30) as other,
    ):
        yield api, other


def assert_throttled(answer: httpx.Response, case: str = "") -> int:
    """A 429 saying when to come back, in whole seconds: those seconds."""
    assert answer.status_code == 429, (case, answer.status_code, answer.text)
    wait = int(answer.headers["retry-after"])
    assert 1 <= wait <= BURST * SECONDS, case
    return wait


async def test_wrong_bearer_keys_past_the_burst_throttle_that_address_alone(
    sqlite_storage: Storage,
) -> None:
    async with served(sqlite_storage) as (api, other):
        for _ in range(BURST):
            assert (await api.get("/v1/stats", key=WRONG)).status_code == 401
        wrong = await api.get("/v1/stats", key=WRONG)
        right = await api.get("/v1/stats")  # the valid key too: refused before it is looked at
        for case, answer in {"wrong key": wrong, "valid key": right}.items():
            assert_throttled(answer, case)
            assert answer.json()["error"].startswith("too many failed authentications"), case
        assert_throttled(await api.post("/v1/claims/owns", {}))  # a lean route alike
        # Another address is not slowed at all.
        assert (await other.get("/v1/stats", headers=bearer(KEY))).status_code == 200
        # Telegram's route and the probes need no key: never throttled.
        assert (await api.get("/healthz", key=None)).status_code == 200
        assert (await api.get("/readyz", key=None)).json() == {"status": "ready"}
        update = {"update_id": 1, "message": {"text": "hi"}}
        secret = {"x-telegram-bot-api-secret-token": "shop-secret"}
        assert (await api.http.post("/telegram/shop", json=update, headers=secret)).is_success
        # After Retry-After the valid key works again; one wrong key more is allowed, and no
        # second.
        await asyncio.sleep(assert_throttled(await api.get("/v1/stats")))
        assert (await api.get("/v1/stats")).status_code == 200
        assert (await api.get("/v1/stats", key=WRONG)).status_code == 401
        assert_throttled(await api.get("/v1/stats"))
        scraped = await other.get("/metrics", headers=bearer(KEY))
    assert 'telegram_intake_requests_refused_total{reason="throttled"} 5.0' in scraped.text


async def test_a_request_with_no_key_counts_no_failure(sqlite_storage: Storage) -> None:
    async with served(sqlite_storage) as (api, _):
        for _ in range(BURST * 3):
            assert (await api.get("/v1/stats", key=None)).status_code == 401
        assert (await api.get("/v1/stats")).status_code == 200


async def test_a_wrong_key_at_readyz_is_401_and_counts(sqlite_storage: Storage) -> None:
    async with served(sqlite_storage) as (api, _):
        for _ in range(BURST):
            wrong = await api.get("/readyz", key=WRONG)
            assert wrong.status_code == 401
            assert wrong.headers["www-authenticate"] == "Bearer"
        assert_throttled(await api.get("/readyz", key=VIEWER_KEY))
        assert_throttled(await api.get("/v1/stats"))
        # Without a key it is the public probe still.
        assert (await api.get("/readyz", key=None)).json() == {"status": "ready"}


async def test_behind_a_trusted_proxy_each_forwarded_address_is_its_own_source(
    sqlite_storage: Storage,
) -> None:
    async with served(sqlite_storage, trusted_proxies=("127.0.0.0/8",)) as (api, _):
        guesser = {"x-forwarded-for": "203.0.113.7"}
        for _ in range(BURST):
            answer = await api.http.get("/v1/stats", headers={**guesser, **bearer(WRONG)})
            assert answer.status_code == 401
        assert_throttled(await api.http.get("/v1/stats", headers={**guesser, **bearer(KEY)}))
        for elsewhere in ({"x-forwarded-for": "203.0.113.8"}, {}):  # another client, the proxy
            answer = await api.http.get("/v1/stats", headers={**elsewhere, **bearer(KEY)})
            assert answer.status_code == 200, elsewhere


async def test_an_untrusted_peer_cannot_escape_by_naming_other_addresses(
    sqlite_storage: Storage,
) -> None:
    async with served(sqlite_storage) as (api, _):
        for n in range(BURST):
            forwarded = {"x-forwarded-for": f"203.0.113.{n}"}
            answer = await api.http.get("/v1/stats", headers={**forwarded, **bearer(WRONG)})
            assert answer.status_code == 401
        forwarded = {"x-forwarded-for": "203.0.113.200"}
        assert_throttled(await api.http.get("/v1/stats", headers={**forwarded, **bearer(KEY)}))


# -- the console's sign-in ----------------------------------------------------------------------


async def sign_in(client: httpx.AsyncClient, key: str) -> httpx.Response:
    return await client.post("/console/sign-in", data={"key": key})


async def test_wrong_sign_ins_past_the_burst_throttle_that_address_alone(
    sqlite_storage: Storage,
) -> None:
    async with served(sqlite_storage) as (api, other):
        for _ in range(BURST):
            assert (await sign_in(api.http, WRONG)).status_code == 401
        wrong = await sign_in(api.http, WRONG)
        right = await sign_in(api.http, VIEWER_KEY)
        for case, answer in {"wrong key": wrong, "valid key": right}.items():
            assert_throttled(answer, case)
            assert "Too many failed sign-ins from your address" in answer.text, case
            assert "set-cookie" not in answer.headers, case
            assert answer.headers["content-type"].startswith("text/html"), case
        assert (await sign_in(other, VIEWER_KEY)).status_code == 303
        await asyncio.sleep(assert_throttled(await sign_in(api.http, VIEWER_KEY)))
        signed_in = await sign_in(api.http, VIEWER_KEY)
        assert signed_in.status_code == 303
        assert "set-cookie" in signed_in.headers


async def test_an_empty_sign_in_counts_no_failure(sqlite_storage: Storage) -> None:
    async with served(sqlite_storage) as (api, _other):
        for _ in range(BURST * 2):
            assert (await sign_in(api.http, "")).status_code == 401
        assert (await sign_in(api.http, VIEWER_KEY)).status_code == 303


async def test_the_guard_and_the_console_count_against_one_allowance(
    sqlite_storage: Storage,
) -> None:
    async with served(sqlite_storage) as (api, other):
        for _ in range(BURST - 1):
            assert (await api.get("/v1/stats", key=WRONG)).status_code == 401
        assert (await sign_in(api.http, WRONG)).status_code == 401
        assert_throttled(await api.get("/v1/stats"))
        assert_throttled(await sign_in(api.http, VIEWER_KEY))
        for _ in range(BURST):
            assert (await sign_in(other, WRONG)).status_code == 401
        assert_throttled(await other.get("/v1/stats", headers=bearer(KEY)))


@pytest.mark.parametrize(
    "setting",
    [{"auth_failures_burst": 0}, {"auth_failure_seconds": 0}, {"auth_failures_burst": 1.5}],
)
def test_the_settings_are_validated(setting: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match=next(iter(setting))):
        Settings(**setting)
