"""Several destinations per bot, end to end in this process (docs/destinations.md): updates
routed as the intake routes them, a worker with a lane per destination, a real downstream
server, on each backend. Each destination's deliveries are fenced, ordered and retried on
their own: a failing destination holds none of the others."""

from __future__ import annotations

import json
from typing import Any

from standardwebhooks import Webhook
from starlette.requests import Request
from starlette.responses import Response

from app.bot_settings import BotSettings
from app.destinations.routing import Router
from app.destinations.settings import DestinationSettings
from app.intake.updates import classify
from app.store import NewUpdate
from telegram_intake_kit.forwarded import read_forwarded
from tests.conftest import Storage, table_rows
from tests.downstream import (
    SIGNING_SECRET,
    FakeDownstream,
    Received,
    bot,
    dispatching,
    eventually,
    message,
    now_ms,
    ok,
    settings_for,
    status,
)

DELIVERIES = "telegram_updates_deliveries"


def _shop(downstream: FakeDownstream, **payments: Any) -> BotSettings:
    """Default takes every update; payments its payment steps (two attempts, its exhaustions
    to the exhaustion URL); analytics every update, unordered."""
    tables = [
        {
            "name": "payments",
            "url": f"{downstream.url}/hook",
            "filter": ["pre_checkout_query", "message:successful_payment"],
            "max_attempts": 2,
            "exhaustion_url": f"{downstream.url}/exhausted",
            **payments,
        },
        {"name": "analytics", "url": f"{downstream.url}/hook", "ordered": False},
    ]
    destinations = tuple(DestinationSettings.model_validate(table) for table in tables)
    return bot(downstream, destinations=destinations)


def _recorded(shop: BotSettings, body: str, at: int) -> NewUpdate:
    """`body` as the intake records it for `shop`: classified, with its routes."""
    update = json.loads(body)
    update_type, queue_key = classify(update)
    routes = Router(shop.targets).routes(update_type, update)
    return NewUpdate("shop", update["update_id"], body, at, update_type, queue_key, routes=routes)


def _paid(update_id: int, chat: int = 42) -> str:
    payment = {"currency": "XTR", "total_amount": 5, "invoice_payload": "p",
               "telegram_payment_charge_id": "t", "provider_payment_charge_id": "v"}  # fmt: skip
    body = json.loads(message(update_id, chat))
    body["message"]["successful_payment"] = payment
    return json.dumps(body)


def _by_destination(received: list[Received]) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for seen in received:
        found.setdefault(seen.headers["x-intake-destination"], []).append(seen.update_id)
    return {name: sorted(ids) for name, ids in found.items()}


async def test_each_update_reaches_every_destination_it_matches_with_its_own_identity(
    storage: Storage, downstream: FakeDownstream
) -> None:
    url = storage.url()
    shop = _shop(downstream)
    async with dispatching(settings_for(url, shop)) as (_, store):
        at = now_ms()
        await store.add_many([_recorded(shop, message(1), at), _recorded(shop, _paid(2), at)])

        async def delivered() -> bool:
            return len(downstream.received) == 5

        await eventually(delivered)
    assert _by_destination(downstream.received) == {
        "default": [1, 2],
        "payments": [2],
        "analytics": [1, 2],
    }
    claims = {
        (row[0], row[1]): row[2]
        for row in table_rows(url, "destination", "update_id", "claim_id", table=DELIVERIES)
    }
    for seen in downstream.received:
        destination = seen.headers["x-intake-destination"]
        forwarded = read_forwarded(seen.headers, seen.body, signing_secret=SIGNING_SECRET)
        identity = forwarded.identity
        assert identity is not None
        assert (identity.destination, identity.update_id) == (destination, seen.update_id)
        if destination == "default":
            assert seen.headers["webhook-id"] == f"shop:{seen.update_id}"
        else:
            assert seen.headers["webhook-id"] == f"shop:{destination}:{seen.update_id}"
            assert identity.claim_id == claims[(destination, seen.update_id)]
        Webhook(SIGNING_SECRET).verify(seen.body, seen.headers)
    states = table_rows(
        url, "destination", "update_id", "state", table="telegram_updates_deliveries"
    )
    assert sorted(states) == [
        ("analytics", 1, "completed"),
        ("analytics", 2, "completed"),
        ("payments", 2, "completed"),
    ]


async def test_a_failing_destination_holds_none_of_the_others_and_exhausts_on_its_own(
    storage: Storage, downstream: FakeDownstream
) -> None:
    async def payments_fail(received: Received, request: Request) -> Response:
        if received.headers["x-intake-destination"] == "payments":
            return await status(500)(received, request)
        return await ok(received, request)

    downstream.answer = payments_fail
    url = storage.url()
    shop = _shop(downstream)
    async with dispatching(settings_for(url, shop)) as (_, store):
        at = now_ms()
        # Chat 42: a payment, then a message behind it. default and analytics deliver both
        # while payments retries its own; payments' queue holds nothing of theirs.
        await store.add_many([_recorded(shop, _paid(1), at), _recorded(shop, message(2), at)])

        async def exhausted() -> list[Received]:
            return downstream.exhaustions

        (record,) = await eventually(exhausted)

        def acknowledged() -> bool:
            found = table_rows(url, "destination", "acknowledged_at", table=DELIVERIES)
            return ("payments", None) not in found

        await eventually(acknowledged)  # once the receiver took it
    exhaustion = json.loads(record.body)
    assert (exhaustion["bot"], exhaustion["destination"], exhaustion["update_id"]) == (
        "shop", "payments", 1)  # fmt: skip
    assert exhaustion["attempt"] == 2
    assert exhaustion["update"] == json.loads(_paid(1))
    assert record.headers["idempotency-key"].startswith("shop:payments:1:2:")
    payments = [
        r.attempt for r in downstream.received if r.headers["x-intake-destination"] == "payments"
    ]
    assert payments == [1, 2]
    assert _by_destination(downstream.received)["default"] == [1, 2]
    rows = table_rows(
        url,
        "destination",
        "state",
        "exhausted_at",
        "acknowledged_at",
        table="telegram_updates_deliveries",
    )
    (paying,) = [row for row in rows if row[0] == "payments"]
    assert paying[1] == "abandoned"
    assert None not in paying[2:]  # exhausted, delivered, so acknowledged
    assert table_rows(url, "update_id", "state") == [(1, "completed"), (2, "completed")]
