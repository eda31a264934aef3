"""GET /metrics on a real uvicorn server: the counts move as requests and attempts happen, the
database's part matches the table, the route needs an operations key, and a database that
fails or is unreachable leaves the scrape up with `telegram_intake_database_up` at 0."""

from __future__ import annotations

import asyncio
import collections
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr
from sqlalchemy import text
from sqlalchemy.engine import make_url
from starlette.requests import Request
from starlette.responses import Response

from app.bot_settings import BotSettings
from app.config import Settings
from app.http.connection_limits import ConnectionLimits
from app.main import create_app
from app.metrics import Metrics
from app.store import NewUpdate, open_store
from app.store.engine import create_sync_engine
from app.store.types import Route
from tests.api.conftest import API_KEYS, CALLBACK_KEY, OPERATIONS_KEY, SHOP_KEY
from tests.conftest import Storage, rename_table, serve_asgi, table_rows
from tests.downstream import (
    SECRET,
    FakeDownstream,
    Received,
    bot,
    by_attempt,
    eventually,
    hang,
    message,
    now_ms,
    ok,
    settings_for,
)

P = "telegram_intake_"
STATES = ("pending", "processing", "completed", "failed", "abandoned")


class Scrape:
    """One scrape, parsed: `scrape(name, **labels)` is a sample's value."""

    def __init__(self, exposition: str) -> None:
        self.samples = {
            (sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(exposition)
            for sample in family.samples
        }

    def __call__(self, name: str, **labels: str) -> float:
        return self.samples[(P + name, frozenset(labels.items()))]

    def has(self, name: str) -> bool:
        return any(sample_name == P + name for sample_name, _ in self.samples)

    def bots(self) -> set[str]:
        return {value for _, labels in self.samples for key, value in labels if key == "bot"}


@dataclass
class Service:
    app: Any
    url: str  # the database's
    http: httpx.AsyncClient

    def post(self, bot_name: str, body: str | bytes, secret: str = SECRET) -> Any:
        headers = {"x-telegram-bot-api-secret-token": secret, "content-type": "application/json"}
        return self.http.post(f"/telegram/{bot_name}", content=body, headers=headers)

    async def get_metrics(self, key: str | None = OPERATIONS_KEY) -> httpx.Response:
        headers = {} if key is None else {"authorization": f"Bearer {key}"}
        return await self.http.get("/metrics", headers=headers)

    async def scrape(self, key: str = OPERATIONS_KEY) -> Scrape:
        response = await self.get_metrics(key)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        return Scrape(response.text)


@asynccontextmanager
async def serving(
    settings: Settings, *, workers: bool = False, cache_seconds: float = 0
) -> AsyncIterator[Service]:
    """The app over `settings` under uvicorn, its connection limits counted as `serve` counts
    them; no stats cache unless asked, so that each scrape reads the table as it is."""
    metrics = Metrics.of(settings, stats_cache_seconds=cache_seconds)
    app = create_app(settings, workers=workers, metrics=metrics)
    limits = ConnectionLimits.of(settings, metrics.connection_closed)
    async with (
        serve_asgi(app, limits=limits) as base,
        httpx.AsyncClient(base_url=base, timeout=30) as http,
    ):
        yield Service(app, settings.database_url, http)


def intake_settings(url: str, **options: Any) -> Settings:
    bots = tuple(
        BotSettings(name=name, secret_token=SecretStr(SECRET)) for name in ("shop", "news")
    )
    return Settings(database_url=url, bots=bots, api_keys=API_KEYS, **options)


def rows_by_state(url: str) -> dict[tuple[str, str], int]:
    return dict(collections.Counter(table_rows(url, "bot", "state")))


def assert_rows_match_table(scrape: Scrape, url: str, bots: tuple[str, ...]) -> None:
    table = rows_by_state(url)
    for name in bots:
        for state in STATES:
            assert scrape("rows", bot=name, state=state) == table.get((name, state), 0)


async def test_webhook_requests_are_counted_by_bot_and_result(storage: Storage) -> None:
    url = storage.url()
    async with serving(intake_settings(url, max_body_bytes=1024)) as service:
        answers = [
            await service.post("shop", message(1)),
            await service.post("shop", message(1)),  # Telegram's redelivery
            await service.post("shop", message(2), secret="wrong-secret"),
            await service.post("nobody", message(3)),
            await service.post("shop", "{not json"),
            await service.post("shop", json.dumps({"update_id": 4, "text": "x" * 2000})),
            await service.post("news", message(1)),
        ]
        assert [a.status_code for a in answers] == [200, 200, 403, 403, 400, 413, 200]
        store = await open_store(url)
        try:  # a row of a bot this process does not serve
            assert await store.add("legacy", 9, message(9), 0)
            # Deliveries beside a row (revision 0010), as the intake records them for a bot
            # with destinations: one to payments, pending.
            routes = (Route("payments"),)
            await store.add_many([NewUpdate("shop", 7, message(7), now_ms(), routes=routes)])
        finally:
            await store.close()
        scrape = await service.scrape()
    expected = {
        ("shop", "accepted"): 1,
        ("shop", "duplicate"): 1,
        ("shop", "forbidden"): 1,
        ("shop", "invalid"): 1,
        ("shop", "too_large"): 1,
        ("shop", "unavailable"): 0,
        ("shop", "source_refused"): 0,
        ("(unknown)", "forbidden"): 1,
        ("(unknown)", "accepted"): 0,
        ("news", "accepted"): 1,
    }
    for (name, result), count in expected.items():
        assert scrape("webhook_requests_total", bot=name, result=result) == count, (name, result)
    assert scrape("webhook_request_duration_seconds_count", bot="shop") == 5
    assert scrape("webhook_request_duration_seconds_count", bot="(unknown)") == 1
    assert 0 < scrape("webhook_request_duration_seconds_sum", bot="shop") < 5
    assert scrape("webhook_commit_wait_seconds_count", bot="shop") == 2  # accepted, duplicate
    assert scrape("database_up") == 1
    assert_rows_match_table(scrape, url, ("shop", "news"))
    assert scrape("rows", bot="shop", state="pending") == 1
    assert scrape("rows", bot="shop", state="unrouted") == 1  # 7: not default's
    assert scrape("deliveries", bot="shop", destination="payments", state="pending") == 1
    assert scrape("deliveries", bot="shop", destination="payments", state="failed") == 0
    assert scrape("delivery_unacknowledged_exhaustions", bot="shop", destination="payments") == 0
    oldest = scrape("delivery_oldest_undelivered_age_seconds", bot="shop", destination="payments")
    assert 0 <= oldest < 60
    assert scrape("rows", bot="(other)", state="pending") == 1  # legacy's row
    assert scrape("unacknowledged_exhaustions", bot="shop") == 0
    assert 0 <= scrape("oldest_undelivered_age_seconds", bot="shop") < 60
    assert scrape("oldest_undelivered_age_seconds", bot="(other)") > 1e6  # received at 0
    assert not scrape.has("attempts_in_flight")  # no workers in this process


async def test_attempts_are_counted_by_bot_and_outcome(
    storage: Storage, downstream: FakeDownstream
) -> None:
    """shop: update 1 answered 200; update 2 answered 500, then 200 on its retry; update 3
    answered 400 (kept as an exhaustion). news: update 1 answered 400, its exhaustion
    delivered to exhaustion_url and acknowledged there."""
    answers = {("shop", 2, 1): 500, ("shop", 3, 1): 400, ("news", 1, 1): 400}

    async def answer(received: Received, _request: Request) -> Response:
        key = (received.headers["x-intake-bot"], received.update_id, received.attempt)
        return Response("{}", answers.get(key, 200), media_type="application/json")

    downstream.answer = answer
    url = storage.url()
    exhaustion_url = f"{downstream.url}/exhausted"
    settings = settings_for(
        url,
        bot(downstream, "shop"),
        bot(downstream, "news", exhaustion_url=exhaustion_url),
        api_keys=API_KEYS,
    )
    async with serving(settings, workers=True) as service:
        for bot_name, update_id in (("shop", 1), ("shop", 2), ("shop", 3), ("news", 1)):
            assert (await service.post(bot_name, message(update_id))).status_code == 200

        async def settled() -> Scrape | None:
            scrape = await service.scrape()
            done = (
                scrape("attempts_total", bot="shop", destination="default", outcome="completed")
                == 2
                and scrape("attempts_total", bot="shop", destination="default", outcome="terminal")
                == 1
                and scrape(
                    "exhaustion_deliveries_total",
                    bot="news",
                    destination="default",
                    result="delivered",
                )
                == 1
                and scrape("unacknowledged_exhaustions", bot="news") == 0
            )
            return scrape if done else None

        scrape = await eventually(settled)
    shop = {
        o: scrape("attempts_total", bot="shop", destination="default", outcome=o)
        for o in ("completed", "retry")
    }
    assert shop == {"completed": 2, "retry": 1}
    assert scrape("attempts_total", bot="news", destination="default", outcome="terminal") == 1
    for outcome in ("deferred", "spent", "expired", "lost", "handed_back", "unsettled"):
        assert scrape("attempts_total", bot="shop", destination="default", outcome=outcome) == 0
    assert scrape("forward_duration_seconds_count", bot="shop", destination="default") == 4
    answered = {
        answer: scrape("forward_answers_total", bot="shop", destination="default", answer=answer)
        for answer in ("2xx", "4xx", "5xx", "timeout", "connection_error")
    }
    assert answered == {"2xx": 2, "4xx": 1, "5xx": 1, "timeout": 0, "connection_error": 0}
    # Receipt to delivery: observed for the two delivered, within the test's few seconds.
    assert scrape("delivery_seconds_count", bot="shop", destination="default") == 2
    assert 0 <= scrape("delivery_seconds_sum", bot="shop", destination="default") < 30
    assert scrape("forward_duration_seconds_count", bot="news", destination="default") == 1
    assert scrape("attempts_in_flight", bot="shop", destination="default") == 0
    assert (
        scrape("owner_lost_total", bot="shop", destination="default", reason="renewal_refused") == 0
    )
    assert scrape("webhook_requests_total", bot="shop", result="accepted") == 3
    assert scrape("unacknowledged_exhaustions", bot="shop") == 1
    assert scrape("oldest_undelivered_age_seconds", bot="shop") == 0
    assert_rows_match_table(scrape, url, ("shop", "news"))
    assert scrape("rows", bot="shop", state="completed") == 2
    assert scrape("rows", bot="shop", state="abandoned") == 1


async def test_renewals_and_a_lost_claim_are_counted(
    storage: Storage, downstream: FakeDownstream
) -> None:
    """The request hangs and its lease is renewed; then a rival takes the claim (its claim_id
    changes under the worker): the next renewal is refused, the owner is lost, and once the
    lease lapses the worker's second attempt completes."""
    downstream.answer = by_attempt(hang, ok)
    url = storage.url()
    settings = settings_for(url, bot(downstream, "shop", lease_seconds=1), api_keys=API_KEYS)
    async with serving(settings, workers=True) as service:
        await service.post("shop", message(1))

        async def renewed() -> bool:
            scrape = await service.scrape()
            return (
                scrape("lease_renewals_total", bot="shop", destination="default", result="renewed")
                >= 1
            )

        await eventually(renewed)
        assert (await service.scrape())(
            "attempts_in_flight", bot="shop", destination="default"
        ) == 1
        engine = create_sync_engine(url)
        try:
            with engine.begin() as connection:
                connection.execute(text("UPDATE telegram_updates SET claim_id = 'a-rival'"))
        finally:
            engine.dispose()

        async def completed() -> Scrape | None:
            scrape = await service.scrape()
            done = (
                scrape("attempts_total", bot="shop", destination="default", outcome="completed")
                == 1
            )
            return scrape if done else None

        scrape = await eventually(completed)
    assert scrape("lease_renewals_total", bot="shop", destination="default", result="refused") == 1
    assert (
        scrape("owner_lost_total", bot="shop", destination="default", reason="renewal_refused") == 1
    )
    assert scrape("attempts_total", bot="shop", destination="default", outcome="lost") == 1
    assert (
        scrape("forward_duration_seconds_count", bot="shop", destination="default") == 1
    )  # the cancelled one: not
    assert [r.attempt for r in downstream.received] == [1, 2]


async def test_metrics_needs_a_key_with_the_operations_scope(sqlite_storage: Storage) -> None:
    async with serving(intake_settings(sqlite_storage.url())) as service:
        refused = await service.get_metrics(key=None)
        wrong_key = await service.get_metrics(key="not-a-configured-key-0123")
        callback_only = await service.get_metrics(key=CALLBACK_KEY)
        await service.scrape()  # OPERATIONS_KEY
        shop_only = await service.scrape(key=SHOP_KEY)
    assert refused.status_code == wrong_key.status_code == 401
    assert refused.headers["www-authenticate"] == "Bearer"
    assert callback_only.status_code == 403
    assert shop_only.bots() == {"shop"}  # a key limited to shop sees shop's series only
    assert shop_only("database_up") == 1


async def test_refusals_before_any_route_and_closed_connections_are_counted(
    sqlite_storage: Storage,
) -> None:
    settings = intake_settings(sqlite_storage.url(), header_timeout_seconds=0.5)
    async with serving(settings) as service:
        before = await service.scrape()
        assert (await service.http.get("/v1/stats")).status_code == 401
        doubled = [("authorization", f"Bearer {OPERATIONS_KEY}")] * 2
        assert (await service.http.get("/v1/stats", headers=doubled)).status_code == 400
        port = int(str(service.http.base_url).rstrip("/").rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as silent:
            silent.settimeout(5)
            assert silent.recv(100) == b""  # closed at the header timeout
        after = await service.scrape()
    for name, labels, moved in (
        ("requests_refused_total", {"reason": "unauthenticated"}, 1),
        ("requests_refused_total", {"reason": "duplicate_header"}, 1),
        ("requests_refused_total", {"reason": "too_large"}, 0),
        ("connections_closed_total", {"reason": "header_timeout"}, 1),
        ("connections_closed_total", {"reason": "evicted"}, 0),
    ):
        assert after(name, **labels) - before(name, **labels) == moved, (name, labels)


async def test_a_failing_stats_query_leaves_the_scrape_up_with_the_database_at_0(
    storage: Storage,
) -> None:
    url = storage.url()

    async with serving(intake_settings(url)) as service:
        await service.post("shop", message(1))
        assert (await service.scrape())("database_up") == 1
        rename_table(url, "telegram_updates", "hidden_updates")
        failing = await service.scrape()
        rename_table(url, "hidden_updates", "telegram_updates")
        again = await service.scrape()
    assert failing("database_up") == 0
    assert not failing.has("rows")  # nothing rather than stale figures
    assert failing("webhook_requests_total", bot="shop", result="accepted") == 1
    assert again("database_up") == 1
    assert again("rows", bot="shop", state="pending") == 1


class Proxy:
    """A TCP proxy to PostgreSQL that the test can cut: the database becomes unreachable."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._server: asyncio.Server | None = None
        self._streams: list[asyncio.StreamWriter] = []
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._connect, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        self._streams += [writer, upstream]
        await asyncio.gather(_pipe(reader, upstream), _pipe(upstream_reader, writer))

    def cut(self) -> None:
        assert self._server is not None
        self._server.close()
        for stream in self._streams:
            stream.transport.abort()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.transport.abort()


async def test_a_scrape_while_postgres_is_unreachable_answers_with_the_database_at_0(
    postgres_storage: Storage,
) -> None:
    direct = make_url(postgres_storage.url())
    proxy = Proxy(direct.host or "127.0.0.1", direct.port or 5432)
    await proxy.start()
    url = direct.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    async with serving(intake_settings(url, commit_timeout_ms=2000)) as service:
        assert (await service.post("shop", message(1))).status_code == 200
        assert (await service.scrape())("database_up") == 1
        proxy.cut()
        refused = await service.post("shop", message(2))
        scrape = await service.scrape()
    assert refused.status_code == 503
    assert scrape("database_up") == 0
    assert not scrape.has("rows")
    assert scrape("webhook_requests_total", bot="shop", result="accepted") == 1
    assert scrape("webhook_requests_total", bot="shop", result="unavailable") == 1


async def test_scrapes_within_the_cache_share_one_stats_query(sqlite_storage: Storage) -> None:
    async with serving(intake_settings(sqlite_storage.url()), cache_seconds=60) as service:
        store = service.app.state.store
        queries: list[dict[str, Any]] = []
        original = store.stats

        async def counted(**options: Any) -> Any:
            queries.append(options)
            await asyncio.sleep(0.2)  # slow enough that the scrapes overlap
            return await original(**options)

        store.stats = counted
        scrapes = await asyncio.gather(*(service.scrape() for _ in range(5)))
        await service.post("shop", message(1))
        later = await service.scrape()
    assert queries == [{}, {"deliveries": True}]  # one refresh: the rows, their deliveries
    assert all(scrape("database_up") == 1 for scrape in scrapes)
    assert later("rows", bot="shop", state="pending") == 0  # from the cache, as it was


async def test_two_apps_in_one_process_keep_their_counts_apart(sqlite_storage: Storage) -> None:
    settings = intake_settings(sqlite_storage.url())
    first, second = create_app(settings).state.metrics, create_app(settings).state.metrics
    first.intake("shop").answered("accepted", 0.001)
    second.intake("shop")  # bound, as its intake would at start-up
    counted = Scrape((await first.exposition()).decode())
    untouched = Scrape((await second.exposition()).decode())
    assert counted("webhook_requests_total", bot="shop", result="accepted") == 1
    assert untouched("webhook_requests_total", bot="shop", result="accepted") == 0
