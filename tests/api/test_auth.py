"""Bearer keys on every `/v1` route: 401 without a valid key (before the body is looked at),
403 for a valid key outside its bots or scope. Keys do not depend on the database: SQLite.

Starting a server costs more than the checks it serves, so a test runs its cases in a loop
over one served app; each assertion names its case."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

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
from tests.conftest import Storage

# Every /v1 route, with a request that a full key gets a 200 for (the identity is made up).
IDENTITY = {"bot": "shop", "update_id": 1, "attempt": 1, "claim_id": "c-1"}
ROUTES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("POST", "/v1/claims/owns", IDENTITY),
    ("POST", "/v1/claims/renew", IDENTITY),
    ("POST", "/v1/claims/settle", {**IDENTITY, "outcome": "completed"}),
    ("POST", "/v1/exhaustions/acknowledge", IDENTITY),
    ("GET", "/v1/exhaustions", None),
    ("GET", "/v1/updates/shop/1", None),
    ("GET", "/v1/stats", None),
]
NEEDS_A_KEY = {"error": "a valid API key is required: Authorization: Bearer <key>"}


async def test_every_route_answers_401_without_a_key(sqlite_api: Api) -> None:
    await sqlite_api.add("shop", 1)
    for method, path, body in ROUTES:
        response = await sqlite_api.http.request(method, path, json=body)
        assert response.status_code == 401, path
        assert response.headers["www-authenticate"] == "Bearer", path
        assert response.json() == NEEDS_A_KEY, path
        # The same request with the key goes through: the 401 was the key's doing.
        allowed = await sqlite_api.http.request(method, path, json=body, headers=bearer(KEY))
        assert allowed.status_code == 200, (path, allowed.text)


OPEN = {"/telegram/{bot}", "/healthz", "/readyz"}  # issue 7: the only routes without a key
# The console signs people in with a key in a form, then a session cookie (docs/console.md):
# without one, each of its routes sends to the sign-in page and does nothing.
CONSOLE = "/console"
CONSOLE_OPEN = {"/console/sign-in", "/console/static"}


async def test_every_route_of_the_service_but_three_refuses_without_a_key(
    sqlite_storage: Storage,
) -> None:
    # A wrong key on every route, more than the failures one address may make at once
    # (tests/http/test_throttle.py): here the throttle would answer 429 before the guard.
    async with serving(sqlite_storage.url(), auth_failures_burst=10_000) as api:
        await _every_route_refuses_without_a_key(api)


async def _every_route_refuses_without_a_key(sqlite_api: Api) -> None:
    # Enumerated from the app itself, so a route added later is checked without being listed.
    routes = dict(_routes(sqlite_api.app.routes))
    assert set(routes) >= set(sqlite_api.app.openapi()["paths"]) | {"/openapi.json"}
    assert {"/metrics", "/v1/claims/owns", "/v1/updates/{bot}/{update_id}"} <= set(routes)
    for path, methods in sorted(routes.items()):
        if path in OPEN or path in CONSOLE_OPEN:
            continue
        for method in sorted(methods):
            concrete = path.replace("{bot}", "shop").replace("{update_id}", "1")
            concrete = concrete.replace("{action}", "redrive").replace("{erasure_id}", "1")
            response = await sqlite_api.http.request(method, concrete)
            if path.startswith(CONSOLE):
                assert response.status_code == 303, (method, path, response.status_code)
                assert response.headers["location"] == "/console/sign-in"
                continue
            assert response.status_code == 401, (method, path, response.status_code)
            wrong = await sqlite_api.http.request(method, concrete, headers=bearer("wrong"))
            assert wrong.status_code == 401, (method, path, wrong.status_code)
    for path in ("/docs", "/redoc", "/nowhere"):  # no page answers, nor says it is missing
        assert (await sqlite_api.http.get(path)).status_code == 401, path
        assert (await sqlite_api.http.get(path, headers=bearer(KEY))).status_code == 404, path


def _routes(routes: Sequence[Any]) -> Iterator[tuple[str, set[str]]]:
    """(path, methods) of every route, through included routers."""
    for route in routes:
        if (router := getattr(route, "original_router", None)) is not None:
            yield from _routes(router.routes)
        elif (path := getattr(route, "path", None)) is not None:
            yield path, set(getattr(route, "methods", None) or {"GET"}) - {"HEAD"}


async def test_a_wrong_key_is_401(sqlite_api: Api) -> None:
    authorizations = [
        "Bearer wrong-key-0123456789abc",
        f"Bearer {KEY[:-1]}",  # a prefix of a valid key
        f"Bearer {KEY}x",  # a valid key with more after it
        f"Bearer {KEY.upper()}",  # keys are case-sensitive
        f"Basic {KEY}",  # the right secret, the wrong scheme
        "Bearer",  # no key at all
    ]
    for authorization in authorizations:
        headers = {"authorization": authorization}
        response = await sqlite_api.http.get("/v1/stats", headers=headers)
        assert response.status_code == 401, authorization
        assert response.headers["www-authenticate"] == "Bearer", authorization
        assert response.json() == NEEDS_A_KEY, authorization


async def test_every_configured_key_is_found_wherever_it_stands(sqlite_api: Api) -> None:
    identity = await sqlite_api.claim()
    for key in (KEY, CALLBACK_KEY, SHOP_KEY):
        response = await sqlite_api.post("/v1/claims/owns", wire(identity), key=key)
        assert response.json()["owned"] is True, key
    assert (await sqlite_api.get("/v1/stats", key=OPERATIONS_KEY)).status_code == 200


async def test_with_no_keys_configured_every_request_is_401_saying_so(
    sqlite_storage: Storage,
) -> None:
    async with serving(sqlite_storage.url(), api_keys=()) as api:
        for method, path, body in ROUTES:
            response = await api.http.request(method, path, json=body, headers=bearer(KEY))
            assert response.status_code == 401, path
            assert response.headers["www-authenticate"] == "Bearer", path
            assert response.json() == {"error": "no API keys are configured (INTAKE_API_KEYS)"}


async def test_a_key_limited_to_some_bots_is_403_for_another_bot(sqlite_api: Api) -> None:
    shop = await sqlite_api.claim("shop", 1)
    news = await sqlite_api.claim("news", 1)
    # Its own bot answers...
    own = await sqlite_api.post("/v1/claims/owns", wire(shop), key=SHOP_KEY)
    assert own.json()["owned"] is True
    # ...another bot does not, on any route, and its claim stays as it was.
    before = await sqlite_api.row("news", 1)
    refused = [
        await sqlite_api.post("/v1/claims/owns", wire(news), key=SHOP_KEY),
        await sqlite_api.post("/v1/claims/renew", wire(news), key=SHOP_KEY),
        await sqlite_api.post("/v1/claims/settle", wire(news, outcome="completed"), key=SHOP_KEY),
        await sqlite_api.post("/v1/exhaustions/acknowledge", wire(news), key=SHOP_KEY),
        await sqlite_api.get("/v1/exhaustions", bot="news", key=SHOP_KEY),
        await sqlite_api.get("/v1/updates/news/1", key=SHOP_KEY),
    ]
    for response in refused:
        assert response.status_code == 403, response.request.url
        assert response.json() == {"error": "this API key is not allowed bot 'news'"}
    assert await sqlite_api.row("news", 1) == before


async def test_an_operations_key_is_403_on_the_claim_routes(sqlite_api: Api) -> None:
    identity = await sqlite_api.claim()
    before = await sqlite_api.row()
    for path, body in [
        ("/v1/claims/owns", wire(identity)),
        ("/v1/claims/renew", wire(identity, lease_ms=600_000)),
        ("/v1/claims/settle", wire(identity, outcome="completed")),
    ]:
        response = await sqlite_api.post(path, body, key=OPERATIONS_KEY)
        assert response.status_code == 403, path
        assert response.json() == {"error": "this API key lacks the callback scope"}
    assert await sqlite_api.row() == before


async def test_a_callback_key_is_403_on_the_viewer_routes(sqlite_api: Api) -> None:
    await sqlite_api.add("shop", 1)
    for path in ("/v1/stats", "/v1/exhaustions", "/v1/updates/shop/1"):
        response = await sqlite_api.get(path, key=CALLBACK_KEY)
        assert response.status_code == 403, path
        assert response.json() == {"error": "this API key lacks the viewer scope"}


async def test_acknowledge_is_allowed_with_either_scope(sqlite_api: Api) -> None:
    first = await sqlite_api.exhaustion("shop", 1)
    second = await sqlite_api.exhaustion("shop", 2)
    by_callback = await sqlite_api.post(
        "/v1/exhaustions/acknowledge", wire(first), key=CALLBACK_KEY
    )
    by_operations = await sqlite_api.post(
        "/v1/exhaustions/acknowledge", wire(second), key=OPERATIONS_KEY
    )
    assert by_callback.json() == {"acknowledged": True}
    assert by_operations.json() == {"acknowledged": True}
    assert (await sqlite_api.row("shop", 1)).acknowledged_at is not None
    assert (await sqlite_api.row("shop", 2)).acknowledged_at is not None


async def test_401_comes_before_body_validation(sqlite_api: Api) -> None:
    bodies = [
        b'{"bot": "Not A Bot", "update_id": -1}',  # JSON, but no identity
        b'{"bot": "shop", "update_id": ',  # not JSON at all: FastAPI decodes it first
        b"[]",
    ]
    json = {"content-type": "application/json"}
    for path in ("/v1/claims/settle", "/v1/exhaustions/acknowledge"):
        for content in bodies:
            case = (path, content)
            for headers in (json, {**json, **bearer("wrong-key-0123456789abc")}):
                response = await sqlite_api.http.post(path, content=content, headers=headers)
                assert response.status_code == 401, case
                assert response.headers["www-authenticate"] == "Bearer", case
                assert response.json() == NEEDS_A_KEY, case
            # With a valid key the same body is refused for itself: the 401 was not about the
            # body (400: not JSON; 422: JSON that is no identity).
            with_key = await sqlite_api.http.post(
                path, content=content, headers={**json, **bearer(KEY)}
            )
            assert with_key.status_code == (400 if content.endswith(b" ") else 422), case
