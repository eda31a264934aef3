"""A key limited to destinations (docs/destinations.md, docs/security.md): a service's key reads
and settles its destinations' deliveries and nothing of another destination's, nor what belongs
to the bot as a whole. And the reads seen from a destination that every key may ask for.

Every API route is enumerated from the app itself, as the bot scoping test does: each is asked
with the payments key for every update and with every identity of analytics, and no answer may
carry analytics' claims or text, nor change anything of it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from pydantic import SecretStr, ValidationError

from app.api_keys import ApiKey
from app.bot_settings import BotSettings
from app.config import Settings
from app.destinations.settings import DestinationSettings
from app.store import ClaimIdentity, NewUpdate
from app.store.types import Route
from tests.api.conftest import KEY, Api, bearer, now_ms, serving, update_body
from tests.api.test_auth import _routes
from tests.conftest import Storage
from tests.console.conftest import Console

PAYMENTS_KEY = "payments-only.key-0123456789"
BOTH_KEY = "payments-and-analytics.key-0123456789"
# What only analytics' deliveries hold: its exhaustion's error.
SECRET = "analytics-private"


def _shop() -> BotSettings:
    tables = [
        {"name": "payments", "url": "http://127.0.0.1:9/payments"},
        {"name": "analytics", "url": "http://127.0.0.1:9/analytics", "ordered": False},
    ]
    return BotSettings(
        name="shop",
        secret_token=SecretStr("shop-secret"),
        downstream_url="http://127.0.0.1:9/bot",
        destinations=tuple(DestinationSettings.model_validate(t) for t in tables),
    )


KEYS = (
    ApiKey(key=SecretStr(KEY)),
    ApiKey(key=SecretStr(PAYMENTS_KEY), bots=("shop",), destinations=("payments",)),
    ApiKey(key=SecretStr(BOTH_KEY), destinations=("payments", "analytics")),
)


@dataclass
class Seeded:
    api: Api
    payments: ClaimIdentity  # update 5's delivery to payments, live
    analytics: ClaimIdentity  # update 5's delivery to analytics, exhausted
    default: ClaimIdentity  # update 5's own row, live
    lonely: ClaimIdentity  # update 6, analytics' alone, live


@pytest.fixture
async def seeded(storage: Storage) -> AsyncIterator[Seeded]:
    async with serving(storage.url(), bots=(_shop(),), api_keys=KEYS) as api:
        at = now_ms()
        every = (Route("default"), Route("payments"), Route("analytics", False))
        await api.store.add_many(
            [
                NewUpdate("shop", 5, update_body(5), at, "message", "42", routes=every),
                NewUpdate("shop", 6, update_body(6), at, "message", "42", routes=every[2:]),
            ]
        )
        claim = {"now": at, "lease_until": at + 600_000, "max_attempts": 3, "limit": 5}
        (paying,) = await api.store.claim_next_owned(**claim, destination="payments")
        counting = await api.store.claim_next_owned(**claim, destination="analytics")
        (own,) = await api.store.claim_next_owned(**claim)
        five, six = sorted(counting, key=lambda c: c.identity.update_id)
        assert await api.store.exhaust(five.identity, at + 1, f"HTTP 400: {SECRET}")
        yield Seeded(api, paying.identity, five.identity, own.identity, six.identity)


def _wire(identity: ClaimIdentity, **more: Any) -> dict[str, Any]:
    fields = ("bot", "update_id", "attempt", "claim_id", "destination")
    return {name: getattr(identity, name) for name in fields} | more


async def _state(api: Api) -> Any:
    """Everything of analytics and default an act could change."""
    rows = [await api.store.get_update("shop", n) for n in (5, 6)]
    controls = await api.store.bot_controls(["shop"], destinations=True)
    return rows, controls


async def test_a_payments_key_settles_and_reads_payments_alone(seeded: Seeded) -> None:
    api = seeded.api

    async def post(path: str, body: Any) -> httpx.Response:
        return await api.post(path, body, key=PAYMENTS_KEY)

    async def get(path: str, **params: str | int) -> httpx.Response:
        return await api.get(path, key=PAYMENTS_KEY, **params)

    before = await _state(api)
    # Callbacks: its own delivery's identity is answered; another destination's is 403.
    owned = await post("/v1/claims/owns", _wire(seeded.payments))
    assert owned.json()["owned"] is True
    for other in (seeded.analytics, seeded.default, seeded.lonely):
        for path, more in (
            ("/v1/claims/owns", {}),
            ("/v1/claims/renew", {}),
            ("/v1/claims/settle", {"outcome": "completed"}),
            ("/v1/exhaustions/acknowledge", {}),
        ):
            answer = await post(path, _wire(other, **more))
            assert answer.status_code == 403, (path, other, answer.text)
            assert answer.json()["error"] == (
                f"this API key is not allowed destination {other.destination!r}"
            )
    # The update as payments sees it: payments' delivery, no other listed.
    view = (await get("/v1/updates/shop/5")).json()
    assert (view["destination"], view["state"], view["claim_id"]) == (
        "payments", "processing", seeded.payments.claim_id)  # fmt: skip
    assert view["deliveries"] == []
    assert (await get("/v1/updates/shop/6")).status_code == 404  # analytics' alone
    assert (await get("/v1/updates/shop/5", destination="analytics")).status_code == 403
    found = (await get("/v1/updates")).json()["items"]
    assert [(i["update_id"], i["destination"], i["claim_id"]) for i in found] == [
        (5, "payments", seeded.payments.claim_id)
    ]
    (attempt,) = (await get("/v1/updates/shop/5/attempts")).json()["items"]
    assert attempt["claim_id"] == seeded.payments.claim_id
    assert (await get("/v1/updates/shop/5/attempts", destination="default")).status_code == 403
    assert (await get("/v1/exhaustions")).json()["items"] == []  # payments has none open
    assert (await get("/v1/exhaustions", destination="analytics")).status_code == 403
    stats = (await get("/v1/stats")).json()
    assert stats["bots"] == []  # default's counts are not payments'
    assert [d["destination"] for d in stats["destinations"]] == ["payments"]
    # Acts: on payments, or 403; what belongs to the bot as a whole is 403.
    dry = {"filter": {"bot": "shop"}, "dry_run": True}
    assert (await post("/v1/exhaustions/redrive", dry)).json()["matched"] == 0
    named = {"filter": {"bot": "shop", "destination": "analytics"}, "dry_run": True}
    assert (await post("/v1/exhaustions/redrive", named)).status_code == 403
    paused = await post("/v1/bots/shop/pause?destination=payments", {"reason": "payments' own"})
    assert paused.json() == {"bot": "shop", "changed": True}
    assert (await post("/v1/bots/shop/resume?destination=analytics", {})).status_code == 403
    limited = "this API key is limited to destinations payments"
    for path in ("/v1/bots/shop/pause", "/v1/bots/shop/resume"):
        answer = await post(path, {})
        assert (answer.status_code, answer.json()["error"][: len(limited)]) == (403, limited)
    erasure = {"bot": "shop", "user_id": 7, "dry_run": True}
    assert (await post("/v1/erasures", erasure)).status_code == 403
    for path in ("/v1/audit", "/v1/bots", "/metrics"):
        answer = await get(path)
        assert (answer.status_code, answer.json()["error"][: len(limited)]) == (403, limited)
    rows, controls = await _state(api)
    assert rows == before[0], "the payments key changed a row"
    assert [c.paused_at is not None for c in controls] == [
        c.destination == "payments" for c in controls
    ]


async def test_a_key_of_several_destinations_names_the_one_it_reads(seeded: Seeded) -> None:
    api = seeded.api
    answer = await api.get("/v1/updates/shop/5", key=BOTH_KEY)
    assert answer.status_code == 403
    assert "name one with destination=" in answer.json()["error"]
    view = (await api.get("/v1/updates/shop/6", key=BOTH_KEY, destination="analytics")).json()
    assert (view["destination"], view["claim_id"]) == ("analytics", seeded.lonely.claim_id)
    (item,) = (await api.get("/v1/exhaustions", key=BOTH_KEY, destination="analytics")).json()[
        "items"
    ]
    assert (item["update_id"], item["claim_id"]) == (5, seeded.analytics.claim_id)


async def test_every_key_may_read_from_one_destination(seeded: Seeded) -> None:
    """Search and the update's view seen from a destination, with a key of whole bots."""
    api = seeded.api

    async def found(**params: str | int) -> list[tuple[int, str, str]]:
        items = (await api.get("/v1/updates", **params)).json()["items"]
        return [(i["update_id"], i["destination"], i["state"]) for i in items]

    assert await found() == [(6, "default", "unrouted"), (5, "default", "processing")]
    assert await found(destination="default") == [(5, "default", "processing")]
    assert await found(destination="analytics") == [
        (6, "analytics", "processing"),
        (5, "analytics", "abandoned"),
    ]
    assert await found(destination="analytics", state="abandoned") == [
        (5, "analytics", "abandoned")
    ]
    assert await found(destination="payments", state="abandoned") == []
    assert await found(destination="nowhere") == []
    view = (await api.get("/v1/updates/shop/5", destination="analytics")).json()
    assert (view["state"], view["error"], view["deliveries"]) == (
        "abandoned", f"HTTP 400: {SECRET}", [])  # fmt: skip
    # Without one, the row as it stands, every delivery listed.
    whole = (await api.get("/v1/updates/shop/5")).json()
    assert whole["destination"] == "default"
    assert [d["destination"] for d in whole["deliveries"]] == ["analytics", "payments"]
    missing = await api.get("/v1/updates/shop/6", destination="default")
    assert missing.json() == {"error": "update 6 of bot 'shop' does not go to 'default'"}


async def test_a_key_limited_to_destinations_signs_in_nowhere_in_the_console(
    seeded: Seeded,
) -> None:
    async with httpx.AsyncClient(base_url=seeded.api.base, timeout=30) as client:
        answer = await Console(seeded.api, client).sign_in(PAYMENTS_KEY)
    assert answer.status_code == 401
    assert "That key is limited to destinations: the console needs whole bots." in answer.text


def test_a_key_naming_a_destination_its_bots_lack_stops_the_settings() -> None:
    shop = _shop()
    with pytest.raises(ValidationError, match=r"api_keys.0.destinations: \['payment'\] are not"):
        Settings(bots=(shop,), api_keys=(ApiKey(key=SecretStr(KEY), destinations=("payment",)),))
    with pytest.raises(ValidationError, match="names no destination"):
        ApiKey(key=SecretStr(KEY), destinations=())
    with pytest.raises(ValidationError, match="'Payments' is not a destination name"):
        ApiKey(key=SecretStr(KEY), destinations=("Payments",))
    settings = Settings(bots=(shop,), api_keys=KEYS)
    assert [k.destinations for k in settings.api_keys] == [
        None, ("payments",), ("payments", "analytics")]  # fmt: skip


def _bodies(seeded: Seeded) -> list[Any]:
    """What a POST may carry about analytics or the bot as a whole."""
    bodies: list[Any] = [{}, {"filter": {}, "dry_run": True}, {"filter": {"bot": "shop"}}]
    bodies += [{"filter": {"bot": "shop", "destination": "analytics"}, "dry_run": False}]
    bodies += [{"bot": "shop", "user_id": 7}, {"per_second": 1.0}, {"reason": "by hand"}]
    for identity in (seeded.analytics, seeded.default, seeded.lonely):
        wire = _wire(identity)
        bodies += [
            wire,
            {**wire, "outcome": "completed"},
            {**wire, "reason": "by hand"},
            {"identities": [wire], "dry_run": False},
        ]
    return bodies


async def test_a_payments_key_sees_nothing_of_analytics_through_any_api_route(
    seeded: Seeded,
) -> None:
    api = seeded.api
    before = await _state(api)
    markers = [SECRET, seeded.analytics.claim_id, seeded.default.claim_id, seeded.lonely.claim_id]
    asked = 0
    for template, methods in sorted(dict(_routes(api.app.routes)).items()):
        if not template.startswith(("/v1", "/metrics")):
            continue
        paths = {
            template.replace("{bot}", "shop")
            .replace("{update_id}", str(n))
            .replace("{erasure_id}", "1")
            for n in (5, 6)
        }
        for path in sorted(paths):
            for method in sorted(methods):
                if method == "GET":
                    requests: list[dict[str, Any]] = [
                        {"params": p}
                        for p in ({}, {"destination": "analytics"}, {"contains": "hello"})
                    ]
                else:
                    queries = ({}, {"destination": "analytics"})
                    requests = [
                        {"json": body, "params": q} for body in _bodies(seeded) for q in queries
                    ]
                for request in requests:
                    answer = await api.http.request(
                        method, path, headers=bearer(PAYMENTS_KEY), **request
                    )
                    asked += 1
                    shown = answer.text + str(answer.headers)
                    leaks = [m for m in markers if m in shown and m not in json.dumps(request)]
                    assert not leaks, (method, path, request, answer.status_code, leaks)
                    assert answer.status_code < 500, (method, path, answer.text)
    assert asked > 300
    rows, _ = await _state(api)
    assert rows == before[0], "an act of the payments key changed another destination's"


async def test_a_replay_by_api_is_the_destination_s_own_and_says_what_it_did(
    seeded: Seeded,
) -> None:
    """`POST /v1/bots/{bot}/replay`: update 6 never went to payments; a dry run counts it, the
    act delivers it; payments' key replays to payments alone; bad ranges and destinations
    the bot lacks are refused and change nothing."""
    api = seeded.api
    body = {"destination": "payments", "first_update_id": 1, "last_update_id": 10}
    dry = await api.post("/v1/bots/shop/replay", body | {"dry_run": True}, key=PAYMENTS_KEY)
    assert dry.json() == {"bot": "shop", "destination": "payments", "matched": 1, "replayed": 0}
    other = await api.post("/v1/bots/shop/replay", body | {"destination": "analytics"},
                           key=PAYMENTS_KEY)  # fmt: skip
    assert other.status_code == 403
    before = await api.store.get_update("shop", 6)
    for wrong, status in (
        ({"destination": "refunds"}, 404),
        ({"first_update_id": 11}, 422),
        ({"last_update_id": -1}, 422),
    ):
        answer = await api.post("/v1/bots/shop/replay", body | wrong)
        assert answer.status_code == status, (wrong, answer.text)
    assert await api.store.get_update("shop", 6) == before
    done = await api.post("/v1/bots/shop/replay", body, key=PAYMENTS_KEY)
    assert done.json() == {"bot": "shop", "destination": "payments", "matched": 1, "replayed": 1}
    view = (await api.get("/v1/updates/shop/6", key=PAYMENTS_KEY)).json()
    assert (view["destination"], view["state"], view["attempts"]) == ("payments", "pending", 0)
    (entry, *_) = (await api.get("/v1/audit")).json()["items"]
    assert (entry["action"], entry["target"], entry["changed"]) == ("replay", "shop/payments", 1)
