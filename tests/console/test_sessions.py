"""Console sessions that end (docs/security.md): at sign-out, in every process; when the key is
removed or its value changes; after the idle time; at the end of the lifetime. Each is shown on
real servers over one database, with the cookie a browser kept."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from itsdangerous import URLSafeTimedSerializer
from pydantic import SecretStr
from sqlalchemy import text

from app.api_keys import ApiKey
from app.console.session import COOKIE
from app.store import DEFAULT_TABLE
from tests.api.conftest import Api, serving
from tests.conftest import Storage
from tests.console.conftest import Console

OPERATOR_KEY = "session-operator.key-0123456789"
SECRET = "console-secret-0123456789"
SESSIONS = f"{DEFAULT_TABLE}_sessions"


def _keys(value: str = OPERATOR_KEY, name: str = "ops") -> tuple[ApiKey, ...]:
    return (ApiKey(key=SecretStr(value), name=name, scopes=("operator",)),)


@asynccontextmanager
async def _console(url: str, **overrides: Any) -> AsyncIterator[Console]:
    options = {"api_keys": _keys(), "console_secret": SecretStr(SECRET), **overrides}
    async with (
        serving(url, **options) as api,
        httpx.AsyncClient(base_url=api.base, timeout=30) as client,
    ):
        yield Console(api, client)


async def _signed_in(console: Console, key: str = OPERATOR_KEY) -> str:
    """Sign in; the session's cookie, as the browser keeps it."""
    assert (await console.sign_in(key)).status_code == 303
    return console.http.cookies[COOKIE]


async def _opens(console: Console, cookie: str) -> bool:
    """Whether `cookie` opens a page of the console (else: sent to sign in)."""
    async with httpx.AsyncClient(base_url=console.api.base, cookies={COOKIE: cookie}) as browser:
        answer = await browser.get("/console/bots")
    assert answer.status_code in (200, 303), answer.text
    return answer.status_code == 200


async def _age(api: Api, *, seen_ms: int = 0, started_ms: int = 0) -> None:
    """Move every session's last request and start into the past."""
    async with api.store.transaction() as connection:
        await connection.execute(
            text(
                f"UPDATE {SESSIONS} SET seen_at = seen_at - :seen, "
                "started_at = started_at - :started"
            ),
            {"seen": seen_ms, "started": started_ms},
        )


async def test_sign_out_ends_the_session_in_every_process(storage: Storage) -> None:
    url = storage.url()
    async with _console(url) as one, _console(url) as other:
        cookie = await _signed_in(one)
        assert await _opens(one, cookie)
        assert await _opens(other, cookie)
        out = await one.act("/console/sign-out")
        assert (out.status_code, out.headers["location"]) == (303, "/console/sign-in")
        # The cookie saved before signing out opens nothing, here or in the other process.
        assert not await _opens(one, cookie)
        assert not await _opens(other, cookie)


async def test_a_session_survives_a_restart_but_not_a_change_of_its_keys_value(
    storage: Storage,
) -> None:
    url = storage.url()
    async with _console(url) as before:
        cookie = await _signed_in(before)
    async with _console(url) as restarted:
        assert await _opens(restarted, cookie)
    # The same name and console secret, another value: the session was the old value's.
    async with _console(url, api_keys=_keys("session-operator.key-CHANGED-0")) as changed:
        assert not await _opens(changed, cookie)
    async with _console(url, api_keys=_keys(name="renamed")) as renamed:
        assert await _opens(renamed, cookie)  # the same key under another name is still it
    other = "someone-else.key-0123456789"
    async with _console(url, api_keys=_keys(other, "other")) as removed:
        assert not await _opens(removed, cookie)


async def test_a_session_ends_after_its_idle_time_and_requests_keep_it(storage: Storage) -> None:
    async with _console(storage.url(), console_idle_seconds=600) as console:
        cookie = await _signed_in(console)
        await _age(console.api, seen_ms=590_000)
        assert await _opens(console, cookie)  # within the idle time: this request renews it
        await _age(console.api, seen_ms=590_000)
        assert await _opens(console, cookie)
        await _age(console.api, seen_ms=601_000)
        assert not await _opens(console, cookie)
        # Signing in again starts a new session (and clears the ended one away).
        fresh = await _signed_in(console)
        assert fresh != cookie
        assert await _opens(console, fresh)
        async with console.api.store.transaction() as connection:
            count = await connection.scalar(text(f"SELECT count(*) FROM {SESSIONS}"))
        assert count == 1


async def test_a_busy_session_ends_at_the_end_of_its_lifetime(storage: Storage) -> None:
    async with _console(storage.url(), console_session_seconds=3600) as console:
        cookie = await _signed_in(console)
        await _age(console.api, started_ms=3_599_000)
        assert await _opens(console, cookie)
        await _age(console.api, started_ms=2_000)
        assert not await _opens(console, cookie)


async def test_the_database_never_holds_the_sessions_token(storage: Storage) -> None:
    async with _console(storage.url()) as console:
        cookie = await _signed_in(console)
        async with console.api.store.transaction() as connection:
            rows = (await connection.execute(text(f"SELECT * FROM {SESSIONS}"))).all()
        stored = " ".join(str(value) for row in rows for value in row)
        token = URLSafeTimedSerializer(SECRET.encode(), salt="console-session").loads(cookie)
        assert len(rows) == 1
        assert token not in stored
        assert OPERATOR_KEY not in stored
        assert hashlib.sha256(token.encode()).hexdigest() == rows[0].id


async def test_the_overview_s_own_refresh_does_not_keep_a_session_from_going_idle(
    storage: Storage,
) -> None:
    async with _console(storage.url(), console_idle_seconds=600) as console:
        cookie = await _signed_in(console)
        await _age(console.api, seen_ms=590_000)
        async with httpx.AsyncClient(
            base_url=console.api.base, cookies={COOKIE: cookie}
        ) as browser:  # the page's script, fetching the live part of an open tab
            part = await browser.get("/console/overview.part")
        assert part.status_code == 200
        await _age(console.api, seen_ms=11_000)  # idle for 601 s, refreshes or not
        assert not await _opens(console, cookie)


async def test_the_csrf_token_is_not_the_session_s_token(storage: Storage) -> None:
    async with _console(storage.url()) as console:
        cookie = await _signed_in(console)
        token = URLSafeTimedSerializer(SECRET.encode(), salt="console-session").loads(cookie)
        assert console.csrf
        assert token not in console.csrf
        assert token not in (await console.get("/console/bots")).text
