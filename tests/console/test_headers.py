"""The console's security headers on every answer under /console, whoever made it: a page, an
error page, a redirect, the router's 404 and 405, FastAPI's 422, a static file
(`app.console.forms.SecurityHeaders`); and on nothing outside it."""

from __future__ import annotations

import httpx

from app.console.forms import SECURITY_HEADERS
from tests.api.conftest import KEY, serving
from tests.conftest import Storage
from tests.console.conftest import Console


def assert_secured(answer: httpx.Response, what: str) -> None:
    for name, value in SECURITY_HEADERS.items():
        assert answer.headers.get_list(name) == [value], (what, name, answer.headers)


async def test_every_answer_under_the_console_carries_the_security_headers(
    console: Console,
) -> None:
    twice = [("authorization", "Bearer a"), ("authorization", "Bearer b")]
    stranger = {
        "redirect to sign-in": (await console.get("/console"), 303),
        "sign-in page": (await console.get("/console/sign-in"), 200),
        "unknown path": (await console.get("/console/nope"), 404),
        "trailing slash": (await console.get("/console/"), 404),
        "wrong method": (await console.http.get("/console/sign-out"), 405),
        "wrong method on a page": (await console.http.put("/console/bots"), 405),
        "stylesheet": (await console.get("/console/static/console.css"), 200),
        "script": (await console.get("/console/static/console.js"), 200),
        "unknown static file": (await console.get("/console/static/nope.css"), 404),
        "the request guard's refusal": (
            await console.http.get("/console/bots", headers=twice),
            400,
        ),
    }
    await console.sign_in(KEY)
    signed_in = {
        "page": (await console.get("/console/bots"), 200),
        "error page": (await console.get("/console/updates/shop/404"), 404),
        "path parameter": (await console.get("/console/updates/shop/not-a-number"), 422),
        "action": (await console.act("/console/bots/shop/pause", reason="r"), 303),
    }
    for what, (answer, status) in {**stranger, **signed_in}.items():
        assert answer.status_code == status, (what, answer.text)
        assert_secured(answer, what)


async def test_the_stylesheet_and_script_still_load_under_the_policy(console: Console) -> None:
    page = await console.get("/console/sign-in")
    policy = page.headers["content-security-policy"]
    assert "style-src 'self'" in policy
    assert "script-src 'self'" in policy
    assert 'href="/console/static/console.css"' in page.text  # the page's own origin
    assert 'src="/console/static/console.js"' in page.text
    for name, kind in (("console.css", "text/css"), ("console.js", "text/javascript")):
        answer = await console.get(f"/console/static/{name}")
        assert answer.headers["content-type"].startswith(kind), name


async def test_answers_outside_the_console_carry_none_of_them(sqlite_storage: Storage) -> None:
    async with serving(sqlite_storage.url()) as api:
        for path in ("/healthz", "/consoles", "/v1/stats"):
            answer = await api.get(path)
            assert "content-security-policy" not in answer.headers, path
