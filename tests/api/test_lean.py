"""The lean callback routes (`owns`, `renew`: `app.api.lean`) answer every request exactly as
FastAPI's own machinery answers it for the same endpoint: the same status, body and headers,
for good and bad bodies, keys, bots and content types.

The reference is the same endpoint function on an ordinary route of the same app
(`/reference/v1/...`, read by the strict JSON reader as every other `/v1` route), so both run
behind the same request guard, over the same store and clock."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from fastapi import APIRouter, Response
from pydantic import SecretStr
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from app.api import claims, lean
from app.api.deps import Callback, StrictJsonRoute
from app.api.lean import LeanRoute
from app.api_keys import ApiKey
from app.http.guard import RequestGuard
from app.http.keys import Keys
from telegram_intake_kit.wire import Identity, Owned, Renewed
from tests.api.conftest import (
    CALLBACK_KEY,
    KEY,
    OPERATIONS_KEY,
    SHOP_KEY,
    Api,
    bearer,
    serving,
    wire,
)
from tests.api.test_claims import MALFORMED
from tests.conftest import Storage

LEAN = "/v1/claims"
REFERENCE = "/reference/v1/claims"


def reference_router() -> APIRouter:
    router = APIRouter(route_class=StrictJsonRoute, prefix="/reference/v1")
    router.add_api_route("/claims/owns", claims.owns, methods=["POST"], response_model=Owned)
    router.add_api_route("/claims/renew", claims.renew, methods=["POST"], response_model=Renewed)
    return router


@pytest.fixture
async def both(sqlite_storage: Storage) -> AsyncIterator[Api]:
    async with serving(sqlite_storage.url(), routers=[reference_router()]) as served:
        yield served


Request_ = tuple[str, dict[str, str], bytes | None]  # key, extra headers, body (None: none)


def requests(live: dict[str, Any]) -> dict[str, Request_]:
    """Named requests, each sent to both routes: `live` is a live identity's JSON."""
    json_headers = {"content-type": "application/json"}

    def body(value: Any) -> bytes:
        return json.dumps(value).encode()

    cases: dict[str, Request_] = {
        "live": (KEY, json_headers, body(live)),
        "stale claim_id": (KEY, json_headers, body({**live, "claim_id": "other"})),
        "callback key": (CALLBACK_KEY, json_headers, body(live)),
        "operations key": (OPERATIONS_KEY, json_headers, body(live)),
        "operations key, bad body": (OPERATIONS_KEY, json_headers, b"{"),
        "operations key, wrong shape": (OPERATIONS_KEY, json_headers, b"[]"),
        "shop key, news": (SHOP_KEY, json_headers, body({**live, "bot": "news"})),
        "unknown bot": (KEY, json_headers, body({**live, "bot": "nobody"})),
        "shop key, unknown bot": (SHOP_KEY, json_headers, body({**live, "bot": "nobody"})),
        "plain bot": (KEY, json_headers, body({**live, "bot": "legacy"})),
        "no body": (KEY, json_headers, None),
        "no body, no type": (KEY, {}, None),
        "null": (KEY, json_headers, b"null"),
        "list": (KEY, json_headers, b"[1]"),
        "string": (KEY, json_headers, b'"x"'),
        "number": (KEY, json_headers, b"7"),
        "empty object": (KEY, json_headers, b"{}"),
        "not JSON": (KEY, json_headers, b"{"),
        "duplicate name": (KEY, json_headers, b'{"bot": "shop", "bot": "shop"}'),
        "lone surrogate": (KEY, json_headers, b'{"bot": "\\ud800"}'),
        "beyond a double": (KEY, json_headers, b'{"update_id": 1e400}'),
        "not UTF-8": (KEY, json_headers, b'{"bot": "\xff"}'),
        "nested deep": (KEY, json_headers, b"[" * 600 + b"]" * 600),
        "nested deep, a long integer": (KEY, json_headers, b"[" * 978 + b"1" * 311 + b"]" * 978),
        "text/plain": (KEY, {"content-type": "text/plain"}, body(live)),
        "no content type": (KEY, {}, body(live)),
        "+json": (KEY, {"content-type": "application/vnd.intake+json"}, body(live)),
        "charset": (KEY, {"content-type": "application/json; charset=utf-8"}, body(live)),
        "over the limit": (KEY, json_headers, b" " * (65 << 10) + body(live)),
        "renew lease_ms 0": (KEY, json_headers, body({**live, "lease_ms": 0})),
        "renew lease_ms null": (KEY, json_headers, body({**live, "lease_ms": None})),
    }
    for field, value in MALFORMED:
        malformed = dict(live)
        if value is ...:
            del malformed[field]
        else:
            malformed[field] = value
        cases[f"{field}={value!r}"] = (KEY, json_headers, body(malformed))
    return cases


def comparable(response: httpx.Response) -> tuple[Any, ...]:
    """What must agree: status, headers that carry meaning, and the body, with a lease's end
    reduced to whether there is one (a renew moves it)."""
    content = response.json() if response.content else None
    if isinstance(content, dict) and "lease_expires_at" in content:
        content["lease_expires_at"] = content["lease_expires_at"] is not None
    headers = {
        name: response.headers.get(name)
        for name in ("content-type", "retry-after", "www-authenticate", "allow")
    }
    return response.status_code, headers, content


async def send(api: Api, path: str, request: Request_, *, chunked: bool = False) -> httpx.Response:
    key, headers, body = request
    content: Any = body
    if chunked and body is not None:

        async def stream() -> AsyncIterator[bytes]:
            for start in range(0, len(body), 8192):
                yield body[start : start + 8192]

        content = stream()
    return await api.http.post(path, content=content, headers={**bearer(key), **headers})


@pytest.mark.parametrize("route", ["owns", "renew"])
async def test_a_lean_route_answers_as_fastapi_does(both: Api, route: str) -> None:
    identity = await both.claim()
    live = wire(identity)
    for name, request in requests(live).items():
        for chunked in (False, True):
            case = (route, name, chunked)
            lean_answer = await send(both, f"{LEAN}/{route}", request, chunked=chunked)
            reference = await send(both, f"{REFERENCE}/{route}", request, chunked=chunked)
            assert comparable(lean_answer) == comparable(reference), case
    # The cases did reach the routes: a live identity is owned, a stale one is not.
    owned = await both.post(f"{LEAN}/owns", live)
    assert owned.json()["owned"] is True
    stale = await both.post(f"{LEAN}/owns", {**live, "claim_id": "other"})
    assert stale.json() == {"owned": False, "lease_expires_at": None}


async def test_a_wrong_method_on_a_lean_path_is_the_routers_405(both: Api) -> None:
    answer = await both.http.get(f"{LEAN}/owns", headers=bearer(KEY))
    assert answer.status_code == 405
    assert answer.headers["allow"] == "POST"


async def test_the_guard_answers_a_lean_route_itself_and_passes_the_rest_on() -> None:
    """The guard calls a lean route's handler for its exact method and path, with the key it
    found in the scope; anything else goes on to the app behind it."""
    behind: list[str] = []

    async def app(scope: Scope, receive: Receive, send_: Send) -> None:
        behind.append(scope["path"])
        await Response(b"behind")(scope, receive, send_)

    async def handler(request: Request) -> Response:
        key = request.scope["telegram_intake.api_key"]
        return Response(f"lean {key.scopes[0]} {(await request.body()).decode()}".encode())

    key = ApiKey(key=SecretStr(KEY), scopes=("callback",))
    guard = RequestGuard(
        app, keys=Keys([key]), no_keys=False, max_body_bytes=1024, lean={("POST", "/x"): handler}
    )
    transport = httpx.ASGITransport(app=guard)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        answer = await client.post("/x", content=b"hi", headers=bearer(KEY))
        assert answer.text == "lean callback hi"
        assert behind == []
        assert (await client.get("/x", headers=bearer(KEY))).text == "behind"
        assert (await client.post("/y", headers=bearer(KEY))).text == "behind"
        assert (await client.post("/x", content=b"hi")).status_code == 401
    assert behind == ["/x", "/y"]


def test_the_callbacks_every_update_makes_are_the_lean_ones() -> None:
    assert set(lean()) == {("POST", "/v1/claims/owns"), ("POST", "/v1/claims/renew")}


def test_a_lean_route_must_take_one_body_model_and_one_grant() -> None:
    async def two_bodies(first: Identity, second: Identity, grant: Callback) -> Response:
        raise AssertionError

    async def no_grant(identity: Identity) -> Response:
        raise AssertionError

    endpoints: list[Callable[..., Any]] = [two_bodies, no_grant]
    for endpoint in endpoints:
        with pytest.raises(TypeError, match="one body model and one grant"):
            LeanRoute("/x", endpoint, methods=["POST"])
