"""The operations routes on each backend: open exhaustions by cursor (and their exact
acknowledgement), one update's row, counts by bot and state; and the OpenAPI document. Checks
that end before the store is asked (a query's or a path's shape, the document) run on SQLite
alone.

Starting a server costs more than the checks it serves, so a test runs its cases in a loop
over one served app; each assertion names its case."""

from __future__ import annotations

import dataclasses
from typing import Any

from app.store import Completed, Failed, NewUpdate
from app.store.types import Route
from tests.api.conftest import (
    SHOP_KEY,
    Api,
    between,
    now_ms,
    update_body,
    wire,
)

# -- GET /v1/exhaustions -----------------------------------------------------------------------

# Numeric order within a bot: shop:9 before shop:12, news:5 before news:20.
EXHAUSTED = [("shop", 12), ("news", 20), ("shop", 3), ("news", 1), ("shop", 9), ("news", 5)]
IN_ORDER = sorted(EXHAUSTED)


async def exhaustions_among_other_rows(api: Api) -> None:
    """`EXHAUSTED`, recorded out of order, among rows that are no open exhaustion."""
    for bot, update_id in EXHAUSTED:
        await api.exhaustion(bot, update_id, error=f"HTTP 400 for {bot}:{update_id}")
    acknowledged = await api.exhaustion("shop", 4)
    assert await api.store.acknowledge_exhaustion(acknowledged, now_ms())
    await api.claim("shop", 6)  # a live claim
    await api.add("news", 7)  # pending
    done = await api.claim("ledger", 2)
    assert await api.store.settle_owned(done, Completed(now_ms()))


async def pages(api: Api, **params: str | int) -> list[dict[str, Any]]:
    """Every page of GET /v1/exhaustions, following `next` to its end."""
    found = []
    after: dict[str, str] = {}
    while True:
        response = await api.get("/v1/exhaustions", **params, **after)
        assert response.status_code == 200, response.text
        page = response.json()
        found.append(page)
        if page["next"] is None:
            return found
        assert len(found) <= 20, "paging does not end"
        after = {"after": page["next"]}


def keys(found: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(item["bot"], item["update_id"]) for page in found for item in page["items"]]


async def test_exhaustions_pages_visit_each_exhaustion_once_in_key_order(api: Api) -> None:
    await exhaustions_among_other_rows(api)
    for limit in (1, 2, 4, 6, 100):
        found = await pages(api, limit=limit)
        assert keys(found) == IN_ORDER, limit
        assert all(len(page["items"]) <= limit for page in found), limit
        # `next` is the last item's key, as long as a page is full.
        for page in found[:-1]:
            last = page["items"][-1]
            assert page["next"] == f"{last['bot']}:{last['update_id']}", limit


async def test_exhaustions_items_carry_identity_error_time_and_update(api: Api) -> None:
    before = now_ms()
    identity = await api.exhaustion("shop", 3, error="HTTP 400: chat not found")
    after = now_ms()
    (item,) = (await api.get("/v1/exhaustions")).json()["items"]
    assert item == {
        **wire(identity),
        "destination": "default",
        "error": "HTTP 400: chat not found",
        "exhausted_at": (await api.row("shop", 3)).exhausted_at,
        "update": update_body(3),
    }
    assert before <= item["exhausted_at"] <= after  # set by the test's store, at its now


async def test_exhaustions_filter_by_bot(api: Api) -> None:
    await exhaustions_among_other_rows(api)
    for bot in ("shop", "news"):
        expected = [key for key in IN_ORDER if key[0] == bot]
        assert keys(await pages(api, bot=bot)) == expected, bot
        assert keys(await pages(api, bot=bot, limit=2)) == expected, bot
    assert keys(await pages(api, bot="ledger")) == []


async def test_exhaustions_show_a_bots_limited_key_only_its_bots(api: Api) -> None:
    await exhaustions_among_other_rows(api)
    shop = [key for key in IN_ORDER if key[0] == "shop"]
    response = await api.get("/v1/exhaustions", key=SHOP_KEY)
    assert keys([response.json()]) == shop
    paged = await api.get("/v1/exhaustions", key=SHOP_KEY, limit=2, after="news:1")
    assert keys([paged.json()]) == shop[:2]


async def test_exhaustions_refuse_a_malformed_cursor_or_limit(sqlite_api: Api) -> None:
    await sqlite_api.exhaustion("shop", 1)
    malformed: list[dict[str, str | int]] = [
        {"after": "shop"},
        {"after": "shop:"},
        {"after": ":1"},
        {"after": "Shop:1"},
        {"after": "shop:-1"},
        {"after": "shop:1x"},
        {"after": "shop:1:2"},
        {"after": "shop:" + "9" * 20},
        {"after": f"shop:{2**63}"},  # 19 digits, over BIGINT
        {"bot": "Shop"},
        {"limit": 0},
        {"limit": 1_001},
        {"limit": "ten"},
    ]
    for params in malformed:
        response = await sqlite_api.get("/v1/exhaustions", **params)
        assert response.status_code == 422, params
        (field,) = params
        assert field in response.json()["error"], params
    # The largest cursor is well-formed, and past every row.
    last = await sqlite_api.get("/v1/exhaustions", after=f"zzz:{2**63 - 1}")
    assert last.json() == {"items": [], "next": None}


async def test_acknowledge_the_exact_identity_removes_it_from_the_listing(api: Api) -> None:
    identity = await api.exhaustion("shop", 1)
    await api.exhaustion("shop", 2)
    before = now_ms()
    response = await api.post("/v1/exhaustions/acknowledge", wire(identity))
    after = now_ms()
    assert response.json() == {"acknowledged": True}
    assert keys(await pages(api)) == [("shop", 2)]
    row = await api.row("shop", 1)
    assert row.acknowledged_at is not None
    assert between(row.acknowledged_at, before, after)
    assert row.settled_at == row.acknowledged_at  # prunable from now on
    again = await api.post("/v1/exhaustions/acknowledge", wire(identity))
    assert again.json() == {"acknowledged": False}


async def test_acknowledge_with_a_wrong_field_changes_nothing(api: Api) -> None:
    identity = await api.exhaustion("shop", 1)
    before = await api.row("shop", 1)
    wrong = [
        dataclasses.replace(identity, claim_id="00000000-0000-4000-8000-000000000000"),
        dataclasses.replace(identity, attempt=2),
        dataclasses.replace(identity, update_id=2),
        dataclasses.replace(identity, bot="news"),
    ]
    for other in wrong:
        response = await api.post("/v1/exhaustions/acknowledge", wire(other))
        assert response.json() == {"acknowledged": False}, other
    assert await api.row("shop", 1) == before
    assert keys(await pages(api)) == [("shop", 1)]


async def test_acknowledge_is_false_for_a_live_claim(api: Api) -> None:
    identity = await api.claim()
    before = await api.row()
    response = await api.post("/v1/exhaustions/acknowledge", wire(identity))
    assert response.json() == {"acknowledged": False}
    assert await api.row() == before


# -- GET /v1/updates/{bot}/{update_id} ---------------------------------------------------------


async def test_an_updates_fields_are_its_rows(api: Api) -> None:
    received = now_ms() - 5_000
    assert await api.store.add(
        "shop", 1, update_body(1), received, update_type="message", queue_key="42"
    )
    await api.claim("shop", 2, received_at=received)
    await api.exhaustion("shop", 3, error="HTTP 403: bot was blocked by the user")
    failed = await api.claim("news", 4)
    now = now_ms()
    assert await api.store.settle_owned(failed, Failed(now, now + 60_000, "HTTP 502"))
    for bot, update_id in [("shop", 1), ("shop", 2), ("shop", 3), ("news", 4)]:
        response = await api.get(f"/v1/updates/{bot}/{update_id}")
        assert response.status_code == 200, (bot, update_id)
        row = await api.row(bot, update_id)
        fields = dataclasses.asdict(row) | {"deliveries": []}  # read: none beside these
        fields.pop("body")  # the view of a row leaves the raw update out
        assert response.json() == fields, (bot, update_id)
    # What each state shows, beyond copying the row.
    view = (await api.get("/v1/updates/shop/1")).json()
    assert (view["state"], view["attempts"], view["claim_id"]) == ("pending", 0, None)
    assert (view["update_type"], view["queue_key"], view["received_at"]) == (
        "message",
        "42",
        received,
    )
    view = (await api.get("/v1/updates/shop/3")).json()
    assert (view["state"], view["error"]) == ("abandoned", "HTTP 403: bot was blocked by the user")
    assert view["exhausted_at"] is not None
    assert view["acknowledged_at"] is None
    view = (await api.get("/v1/updates/news/4")).json()
    assert (view["state"], view["due_at"], view["error"]) == ("failed", now + 60_000, "HTTP 502")
    assert view["claim_id"] == failed.claim_id


async def test_an_update_shows_its_deliveries_and_a_destination_lists_its_exhaustions(
    api: Api,
) -> None:
    """Deliveries beside the row (revision 0010), as the intake records them for a bot with
    destinations: the view lists each; exhaustions and park take a destination."""
    at = now_ms()
    routes = (Route("payments"), Route("analytics", False))
    await api.store.add_many(
        [NewUpdate("shop", 5, update_body(5), at, "message", "42", routes=routes)]
    )
    claim = {"now": at, "lease_until": at + 60_000, "max_attempts": 3, "limit": 5}
    (paying,) = await api.store.claim_next_owned(**claim, destination="payments")
    (counting,) = await api.store.claim_next_owned(**claim, destination="analytics")
    assert await api.store.exhaust(paying.identity, at + 1, "HTTP 400: no such order")
    view = (await api.get("/v1/updates/shop/5")).json()
    assert (view["state"], view["attempts"]) == ("unrouted", 0)
    assert [(d["destination"], d["state"], d["claim_id"]) for d in view["deliveries"]] == [
        ("analytics", "processing", counting.identity.claim_id),
        ("payments", "abandoned", paying.identity.claim_id),
    ]
    assert view["deliveries"][1]["error"] == "HTTP 400: no such order"
    assert (await api.get("/v1/exhaustions")).json()["items"] == []  # default's: none
    (item,) = (await api.get("/v1/exhaustions", destination="payments")).json()["items"]
    assert (item["destination"], item["update_id"], item["claim_id"]) == (
        "payments", 5, paying.identity.claim_id)  # fmt: skip
    assert item["update"] == update_body(5)
    response = await api.get("/v1/exhaustions", destination="No Such")
    assert response.status_code == 422
    # Park takes the destination's delivery by its identity; default's row has none.
    park = {"attempt": 1, "claim_id": counting.identity.claim_id, "reason": "by hand"}
    response = await api.post("/v1/updates/shop/5/park", park)
    assert response.json() == {"parked": False}
    response = await api.post("/v1/updates/shop/5/park", {**park, "destination": "analytics"})
    assert response.json() == {"parked": True}
    # Acknowledging that exhaustion takes its destination too.
    acknowledge = {**wire(paying.identity), "destination": "payments"}
    response = await api.post(
        "/v1/exhaustions/acknowledge", {**acknowledge, "destination": "default"}
    )
    assert response.json() == {"acknowledged": False}
    response = await api.post("/v1/exhaustions/acknowledge", acknowledge)
    assert response.json() == {"acknowledged": True}
    # Its attempts, per delivery; the row's own has none (unrouted).
    tried = (await api.get("/v1/updates/shop/5/attempts", destination="payments")).json()
    assert [(a["attempt"], a["outcome"]) for a in tried["items"]] == [(1, "exhausted")]
    assert (await api.get("/v1/updates/shop/5/attempts")).json() == {"items": []}
    missing = await api.get("/v1/updates/shop/5/attempts", destination="moderation")
    assert missing.status_code == 404
    # A destination's controls need it configured (this bot has none beside default).
    refused = await api.post("/v1/bots/shop/pause?destination=payments", {})
    assert refused.status_code == 404
    assert "has no destination 'payments'" in refused.text
    # Counts: the row (default's, unrouted) among the bots, each delivery by destination.
    stats = (await api.get("/v1/stats")).json()
    assert [(b["bot"], b["states"]) for b in stats["bots"]] == [("shop", {"unrouted": 1})]
    assert [(d["bot"], d["destination"], d["states"]) for d in stats["destinations"]] == [
        ("shop", "analytics", {"abandoned": 1}),
        ("shop", "payments", {"abandoned": 1}),
    ]
    assert [d["unacknowledged_exhaustions"] for d in stats["destinations"]] == [1, 0]


async def test_an_update_not_recorded_is_404(api: Api) -> None:
    await api.add("shop", 1)
    for path in ("/v1/updates/shop/2", "/v1/updates/news/1", "/v1/updates/ghost/1"):
        response = await api.get(path)
        assert response.status_code == 404, path
    missing = await api.get("/v1/updates/shop/2")
    assert missing.json() == {"error": "no update 2 of bot 'shop' is recorded"}


async def test_an_update_path_out_of_shape_is_422(sqlite_api: Api) -> None:
    await sqlite_api.add("shop", 1)
    for path, field in [
        ("/v1/updates/Shop/1", "path.bot"),
        ("/v1/updates/-shop/1", "path.bot"),
        ("/v1/updates/" + "s" * 33 + "/1", "path.bot"),
        ("/v1/updates/shop/-1", "path.update_id"),
        ("/v1/updates/shop/one", "path.update_id"),
        (f"/v1/updates/shop/{2**63}", "path.update_id"),
    ]:
        response = await sqlite_api.get(path)
        assert response.status_code == 422, path
        assert field in response.json()["error"], path


# -- GET /v1/stats -----------------------------------------------------------------------------


async def test_stats_count_rows_by_bot_and_state(api: Api) -> None:
    now = now_ms()
    # shop: the oldest undelivered row is 50 s old; older rows are terminal.
    await api.add("shop", 1, received_at=now - 50_000)
    await api.add("shop", 2, received_at=now - 10_000)
    await api.claim("shop", 3, received_at=now - 30_000)
    done = await api.claim("shop", 4, received_at=now - 1_000_000)
    assert await api.store.settle_owned(done, Completed(now_ms()))
    failed = await api.claim("shop", 5, received_at=now - 40_000)
    assert await api.store.settle_owned(failed, Failed(now_ms(), now + 60_000, "HTTP 500"))
    await api.exhaustion("shop", 6)
    assert await api.store.acknowledge_exhaustion(await api.exhaustion("shop", 7), now_ms())
    await api.add("news", 1, received_at=now - 5_000)
    ledger = await api.claim("ledger", 1, received_at=now - 900_000)
    assert await api.store.settle_owned(ledger, Completed(now_ms()))

    before = now_ms()
    response = await api.get("/v1/stats")
    after = now_ms()
    assert response.status_code == 200
    stats = response.json()
    assert between(stats["at"], before, after)
    counts = {
        entry["bot"]: (entry["states"], entry["unacknowledged_exhaustions"])
        for entry in stats["bots"]
    }
    assert counts == {
        "ledger": ({"completed": 1}, 0),
        "news": ({"pending": 1}, 0),
        "shop": (
            {"pending": 2, "processing": 1, "completed": 1, "failed": 1, "abandoned": 2},
            1,
        ),
    }
    assert [entry["bot"] for entry in stats["bots"]] == ["ledger", "news", "shop"]
    ages = {entry["bot"]: entry["oldest_undelivered_age_ms"] for entry in stats["bots"]}
    # Ages by the answer's own `at`: the oldest pending, processing or failed receipt.
    assert ages == {
        "ledger": None,
        "news": stats["at"] - (now - 5_000),
        "shop": stats["at"] - (now - 50_000),
    }


async def test_stats_show_a_bots_limited_key_only_its_bots(api: Api) -> None:
    await api.add("shop", 1)
    await api.add("news", 1)
    await api.exhaustion("news", 2)
    full = await api.get("/v1/stats")
    limited = await api.get("/v1/stats", key=SHOP_KEY)
    assert [entry["bot"] for entry in full.json()["bots"]] == ["news", "shop"]
    (shop,) = limited.json()["bots"]
    assert (shop["bot"], shop["states"], shop["unacknowledged_exhaustions"]) == (
        "shop",
        {"pending": 1},
        0,
    )


async def test_stats_of_an_empty_table_list_no_bots(api: Api) -> None:
    stats = (await api.get("/v1/stats")).json()
    assert stats["bots"] == []
    assert isinstance(stats["at"], int)


# -- the OpenAPI document ----------------------------------------------------------------------

V1_ROUTES = {
    ("post", "/v1/claims/owns"): "Identity",
    ("post", "/v1/claims/renew"): "RenewRequest",
    ("post", "/v1/claims/settle"): "SettleRequest",
    ("post", "/v1/exhaustions/acknowledge"): "AcknowledgeRequest",
    ("get", "/v1/exhaustions"): None,
    ("get", "/v1/updates/{bot}/{update_id}"): None,
    ("get", "/v1/stats"): None,
    # operator control (docs/contract.md section 9)
    ("get", "/v1/bots"): None,
    ("post", "/v1/bots/{bot}/pause"): "PauseRequest",
    ("post", "/v1/bots/{bot}/resume"): None,
    ("post", "/v1/bots/{bot}/rate-limit"): "RateLimitRequest",
    ("post", "/v1/bots/{bot}/replay"): "ReplayRequest",
    ("get", "/v1/updates"): None,
    ("get", "/v1/updates/{bot}/{update_id}/attempts"): None,
    ("post", "/v1/updates/{bot}/{update_id}/park"): "ParkRequest",
    ("post", "/v1/exhaustions/redrive"): "RedriveRequest",
    ("get", "/v1/audit"): None,
    ("post", "/v1/erasures"): "ErasureRequest",
    ("get", "/v1/erasures/{erasure_id}"): None,
}


OPTIONAL_BODIES = {("post", "/v1/bots/{bot}/pause")}  # a reason is optional, so is the body


async def test_the_openapi_document_lists_every_v1_route_behind_the_bearer_scheme(
    sqlite_api: Api,
) -> None:
    response = await sqlite_api.get("/openapi.json", key=SHOP_KEY)
    assert response.status_code == 200
    document = response.json()
    listed = {
        (method, path)
        for path, operations in document["paths"].items()
        if path.startswith("/v1/")
        for method in operations
    }
    assert listed == set(V1_ROUTES)
    schemes = document["components"]["securitySchemes"]
    assert schemes["HTTPBearer"]["type"] == "http"
    assert schemes["HTTPBearer"]["scheme"] == "bearer"
    for (method, path), model in V1_ROUTES.items():
        operation = document["paths"][path][method]
        assert operation["security"] == [{"HTTPBearer": []}], path
        if model is None:
            assert "requestBody" not in operation, path
        else:
            body = operation["requestBody"]
            schema = body["content"]["application/json"]["schema"]
            reference = {"$ref": f"#/components/schemas/{model}"}
            if (method, path) in OPTIONAL_BODIES:
                assert "required" not in body, path
                assert schema["anyOf"][0] == reference, path
            else:
                assert body["required"] is True, path
                assert schema == reference, path


async def test_the_openapi_document_carries_the_request_models_rules(sqlite_api: Api) -> None:
    document = await sqlite_api.get("/openapi.json", key=SHOP_KEY)
    schemas = document.json()["components"]["schemas"]
    identity = schemas["Identity"]
    assert set(identity["required"]) == {"bot", "update_id", "attempt", "claim_id"}
    assert identity["additionalProperties"] is False
    fields = identity["properties"]
    assert fields["bot"]["pattern"] == "^[a-z0-9][a-z0-9_-]{0,31}$"
    # FastAPI's OpenAPI models hold bounds as floats: 2**63-1 is published as 2.0**63.
    assert (fields["update_id"]["minimum"], fields["update_id"]["maximum"]) == (0, float(2**63 - 1))
    assert fields["attempt"]["minimum"] == 1
    assert (fields["claim_id"]["minLength"], fields["claim_id"]["maxLength"]) == (1, 64)
    settle = schemas["SettleRequest"]
    assert set(settle["required"]) == {"bot", "update_id", "attempt", "claim_id", "outcome"}
    assert settle["properties"]["outcome"]["enum"] == ["completed", "failed", "exhausted"]
    assert "retry_after_ms" in settle["properties"]
    renew = schemas["RenewRequest"]
    assert "lease_ms" in renew["properties"]
    assert "lease_ms" not in renew["required"]
