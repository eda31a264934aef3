"""Failures reach a client in fixed words with a request id, and the log with their detail under
the same id (docs/contract.md section 16, `app.http.failures`): the `/v1` API (its lean routes and
the others), the console and the webhook, on a real server whose database went away, whose table
is gone, or whose code raised what nothing expected. On both backends."""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import httpx
import pytest
from fastapi import APIRouter
from sqlalchemy.engine import make_url

from app.store import SqlUpdateStore
from app.store.engine import create_store_engine
from tests.api.conftest import KEY, Api, serving, wire
from tests.conftest import POSTGRES_URL, Storage, rename_table
from tests.console.conftest import Console

FAILURES = "app.http.failures"
TABLE = "telegram_updates"
# What a driver's message names: none of it may reach a client.
NAMED = ("FATAL", "connection", "127.0.0.1", "5432", "psycopg", "sqlite", TABLE, "does not exist")


def dead_url(storage: Storage, tmp_path: Path) -> tuple[str, str]:
    """A URL to a database that cannot be reached, and the name it gives it: on PostgreSQL a
    database the server does not have (the driver answers with FATAL, the host, the port and
    the name), on SQLite a path that is a directory."""
    name = f"gone_{uuid.uuid4().hex[:12]}"
    if storage.backend == "sqlite":
        (tmp_path / name).mkdir()
        return f"sqlite+aiosqlite:///{tmp_path / name}", name
    url = make_url(POSTGRES_URL).set(drivername="postgresql+psycopg", database=name)
    return url.render_as_string(hide_password=False), name


@asynccontextmanager
async def database_gone(api: Api, storage: Storage, tmp_path: Path) -> AsyncIterator[str]:
    """The served app's routes and webhook stand on a store whose database cannot be reached
    (opened lazily: the first statement fails); yields the database's name."""
    url, name = dead_url(storage, tmp_path)
    dead = SqlUpdateStore(create_store_engine(url), TABLE, api.store.revision)
    services = api.app.state.services
    # The webhook's group committer runs in the server's event loop: it keeps running, and
    # its inserts go to the dead store.
    committer = api.app.state.intake._committer
    live = committer._store
    api.app.state.services = dataclasses.replace(services, store=dead, leases=None, renewals=None)
    committer._store = dead
    try:
        yield name
    finally:
        api.app.state.services, committer._store = services, live
        await dead.close()


@contextmanager
def failures(caplog: pytest.LogCaptureFixture) -> Iterator[list[logging.LogRecord]]:
    """The failures logged while the block runs."""
    caplog.set_level(logging.WARNING, logger=FAILURES)
    records: list[logging.LogRecord] = []
    yield records
    records += [record for record in caplog.records if record.name == FAILURES]


def assert_told_nothing(answer: httpx.Response, *names: str) -> str:
    """The answer names none of NAMED or `names`, and carries a request id in its body (JSON)
    or page (HTML) and in X-Request-Id; the id."""
    request_id = answer.headers["x-request-id"]
    assert len(request_id) == 16
    assert set(request_id) <= set("0123456789abcdef")
    if answer.headers["content-type"].startswith("application/json"):
        assert answer.json()["request_id"] == request_id
    else:
        assert f"<code>{request_id}</code>" in answer.text
    # Without the id itself: 16 random hex digits held "5432" (the port) once in a few hundred.
    told = (answer.text.lower() + str(answer.headers).lower()).replace(request_id, "")
    for name in (*NAMED, *names):
        assert name.lower() not in told, (name, answer.text)
    return request_id


def the_record(records: list[logging.LogRecord], request_id: str) -> logging.LogRecord:
    (record,) = [r for r in records if getattr(r, "request_id", None) == request_id]
    assert request_id in record.getMessage()
    return record


async def test_an_unreachable_database_is_503_in_fixed_words_the_detail_logged_under_its_id(
    api: Api, storage: Storage, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    identity = await api.claim()
    with failures(caplog) as records:
        async with database_gone(api, storage, tmp_path) as name:
            answers = {
                "owns (lean)": await api.post("/v1/claims/owns", wire(identity)),
                "settle (lean)": await api.post(
                    "/v1/claims/settle", wire(identity, outcome="completed")
                ),
                "stats": await api.get("/v1/stats"),
                "update": await api.get("/v1/updates/shop/1"),
                "pause": await api.post("/v1/bots/shop/pause", {"reason": "r"}),
            }
    for route, answer in answers.items():
        assert answer.status_code == 503, (route, answer.text)
        assert answer.json()["error"] == "the database is unavailable; retry", route
        assert answer.headers["retry-after"] == "1", route
        request_id = assert_told_nothing(answer, name)
        record = the_record(records, request_id)
        assert record.levelno == logging.WARNING
        detail = record.getMessage()
        assert "StoreUnavailable" in detail, route
        if storage.backend == "postgresql":
            assert "FATAL" in detail, route
            assert name in detail, route
        else:
            assert "unable to open database file" in detail, route


async def test_a_missing_table_is_409_naming_no_table_the_detail_logged_under_its_id(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    identity = await api.claim()
    rename_table(api.url, TABLE, "hidden_updates")
    with failures(caplog) as records:
        answers = [
            await api.post("/v1/claims/owns", wire(identity)),
            await api.get("/v1/stats"),
        ]
    for answer in answers:
        assert answer.status_code == 409, answer.text
        assert "run the migrations" in answer.json()["error"]
        record = the_record(records, assert_told_nothing(answer, "hidden_updates"))
        assert record.levelno == logging.ERROR
        assert "SchemaError" in record.getMessage()
        assert TABLE in record.getMessage()


async def test_a_store_error_of_no_known_kind_is_500_with_its_detail_in_the_log(
    sqlite_api: Api, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.store import StoreError

    async def refused(*_args: object, **_kwargs: object) -> None:
        raise StoreError("database error: permission denied for role intake at 127.0.0.1:5432")

    monkeypatch.setattr(sqlite_api.app.state.services.store, "stats", refused)
    with failures(caplog) as records:
        answer = await sqlite_api.get("/v1/stats")
    assert answer.status_code == 500
    assert answer.json()["error"].startswith("the database refused the request")
    record = the_record(records, assert_told_nothing(answer, "permission", "intake"))
    assert "permission denied for role intake" in record.getMessage()


async def test_an_unexpected_exception_in_a_v1_route_is_a_json_500_with_its_traceback_logged(
    sqlite_storage: Storage, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    router = APIRouter()

    @router.get("/v1/boom")
    async def boom() -> None:
        raise RuntimeError("FATAL: cannot reach 127.0.0.1:5432 as intake")

    async def lean_boom(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("FATAL: cannot reach 127.0.0.1:5432 as intake")

    async with serving(sqlite_storage.url(), routers=[router]) as api:
        identity = await api.claim()
        services = api.app.state.services
        api.app.state.services = dataclasses.replace(services, leases=None)
        monkeypatch.setattr(services.store, "owned_lease", lean_boom)
        with failures(caplog) as records:
            answers = [
                await api.get("/v1/boom"),
                await api.post("/v1/claims/owns", wire(identity)),  # a lean route
            ]
    for answer in answers:
        assert answer.status_code == 500, answer.text
        assert answer.headers["content-type"] == "application/json"
        assert answer.json()["error"].startswith("the server failed to answer this request")
        record = the_record(records, assert_told_nothing(answer, "cannot reach", "intake"))
        assert record.levelno == logging.ERROR
        assert record.exc_info is not None  # the traceback
        assert "cannot reach 127.0.0.1:5432" in record.getMessage()
    # Logged once, under its id: the server did not log the exception again without one.
    assert not [r for r in caplog.records if "Exception in ASGI application" in r.getMessage()]


async def test_a_console_page_over_an_unreachable_database_shows_a_request_id_only(
    api: Api, storage: Storage, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with httpx.AsyncClient(base_url=api.base, timeout=30) as client:
        console = Console(api, client)
        await console.sign_in(KEY)
        with failures(caplog) as records:
            async with database_gone(api, storage, tmp_path) as name:
                page = await console.get("/console/bots")
                action = await console.act("/console/bots/shop/pause", reason="r")
    for answer in (page, action):
        assert answer.status_code == 503, answer.text
        assert "the database is unavailable; retry" in answer.text
        assert answer.headers["content-security-policy"].startswith("default-src 'none'")
        record = the_record(records, assert_told_nothing(answer, name))
        assert "StoreUnavailable" in record.getMessage()


async def test_the_webhooks_503_names_nothing_and_logs_its_reason_under_its_id(
    api: Api, storage: Storage, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    headers = {"x-telegram-bot-api-secret-token": "shop-secret"}
    with failures(caplog) as records:
        async with database_gone(api, storage, tmp_path) as name:
            answer = await api.http.post("/telegram/shop", json={"update_id": 7}, headers=headers)
    assert answer.status_code == 503, answer.text
    assert answer.headers["retry-after"] == "5"
    assert answer.json()["error"] == (
        "the update could not be recorded; Telegram will deliver it again"
    )
    record = the_record(records, assert_told_nothing(answer, name))
    assert "shop, update 7" in record.getMessage()
    detail = name if storage.backend == "postgresql" else "unable to open database file"
    assert detail in record.getMessage()
