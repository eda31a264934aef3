"""Operational events (docs/contract.md section 9) as an operator's alerting receives them: a real
`telegram-intake run` process on each backend, its `operations_url` a fake receiver that checks
every Standard Webhooks signature and refuses the first deliveries, and a fake Bot API whose
getWebhookInfo reports an error.

An incident's worth of events, each made by what makes it in production: a handler's 400
(exhaustion.created), a pause through the API (bot.paused), an update recorded while paused
that grows old (backlog.stale), resume (bot.resumed), a redrive (redrive.finished),
Telegram's last error (telegram.webhook_error, with pending_update_count as a metric), and a
downstream that goes down and comes back (breaker.opened, breaker.closed). Every
event arrives signed, a refused delivery comes again with the same id and body, and each event
is one id however often it was delivered (at least once); the bot token appears nowhere.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import httpx
import pytest
from standardwebhooks import Webhook
from starlette.requests import Request
from starlette.responses import Response

from app.fake_bot_api import TOKEN, FakeBotApi
from tests.conftest import Storage, serve_asgi
from tests.downstream import (
    SIGNING_SECRET,
    FakeDownstream,
    Received,
    eventually,
    message,
    ok,
    status,
)
from tests.processes import SECRET, environment, free_port, processes

pytestmark = pytest.mark.slow  # a real process, seconds of waiting for a stale backlog

KEY = "operations-events.key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
WEBHOOK = {"X-Telegram-Bot-Api-Secret-Token": SECRET, "Content-Type": "application/json"}
TELEGRAM_ERROR_DATE = 1_700_000_000
REFUSED = 2  # the receiver's first deliveries answered 500


def refusing_first(count: int) -> object:
    refused = 0

    async def answer(received: Received, request: Request) -> Response:
        nonlocal refused
        if refused < count:
            refused += 1
            return Response("down for a deploy", 500)
        return await ok(received, request)

    return answer


def events_by_id(received: list[Received]) -> dict[str, list[Received]]:
    """Every delivery, verified against the signing secret, grouped by webhook-id."""
    verifier = Webhook(SIGNING_SECRET)
    grouped: dict[str, list[Received]] = defaultdict(list)
    for delivery in received:
        verifier.verify(delivery.body, delivery.headers)  # raises when the signature is wrong
        grouped[delivery.headers["webhook-id"]].append(delivery)
    return grouped


def types_of(received: list[Received]) -> list[str]:
    return [
        json.loads(deliveries[-1].body)["type"] for deliveries in events_by_id(received).values()
    ]


async def test_an_incident_s_events_reach_operations_url_signed_at_least_once(
    storage: Storage, downstream: FakeDownstream, tmp_path: Path
) -> None:
    fake_api = FakeBotApi()
    fake_api.set_webhook_state(
        url="https://intake.example.com/telegram/default",
        pending_update_count=7,
        last_error_date=TELEGRAM_ERROR_DATE,
        last_error_message="Wrong response from the webhook: 502 Bad Gateway",
    )
    downstream.operations_answer = refusing_first(REFUSED)  # type: ignore[assignment]
    downstream.answer = status(400)  # a handler bug: every update is refused
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    async with serve_asgi(fake_api.app()) as bot_api:
        env = environment(
            storage.url(),
            f"{downstream.url}/hook",
            port=port,
            api_keys=KEY,
            log_format="json",
            operations_url=f"{downstream.url}/operations",
            operations_signing_secret=SIGNING_SECRET,
            operations_retry_seconds=0.2,
            stale_after_seconds=1,
            webhook_check_seconds=0.5,
            breaker_failures=2,
            breaker_cooldown_seconds=0.5,
            bot_token=TOKEN,
            bot_api_url=bot_api,
        )
        with processes(tmp_path) as start:
            run = start("run", env, "run")
            async with httpx.AsyncClient(timeout=10) as client:
                await eventually(lambda: run.answers(f"{base}/healthz"), within=30)
                answer = await client.post(
                    f"{base}/telegram/default", content=message(1), headers=WEBHOOK
                )
                assert answer.status_code == 200
                await eventually(lambda: "exhaustion.created" in types_of(downstream.operations))

                paused = await client.post(
                    f"{base}/v1/bots/default/pause", json={"reason": "deploy"}, headers=AUTH
                )
                assert paused.status_code == 200, paused.text
                answer = await client.post(
                    f"{base}/telegram/default", content=message(2, chat=7), headers=WEBHOOK
                )
                assert answer.status_code == 200
                await eventually(lambda: "backlog.stale" in types_of(downstream.operations))
                downstream.answer = ok  # the fix is deployed
                resumed = await client.post(f"{base}/v1/bots/default/resume", headers=AUTH)
                assert resumed.status_code == 200, resumed.text
                redriven = await client.post(
                    f"{base}/v1/exhaustions/redrive",
                    json={"filter": {"bot": "default"}},
                    headers=AUTH,
                )
                assert redriven.json()["redriven"] == 1, redriven.text
                await eventually(lambda: {1, 2} <= {r.update_id for r in downstream.received})
                await eventually(lambda: "redrive.finished" in types_of(downstream.operations))
                await eventually(
                    lambda: "telegram.webhook_error" in types_of(downstream.operations)
                )
                downstream.answer = status(503)  # the downstream goes down: the breaker opens
                answer = await client.post(
                    f"{base}/telegram/default", content=message(3, chat=8), headers=WEBHOOK
                )
                assert answer.status_code == 200
                await eventually(lambda: "breaker.opened" in types_of(downstream.operations))
                downstream.answer = ok  # and comes back: the half-open probe closes it
                await eventually(lambda: "breaker.closed" in types_of(downstream.operations))
                await eventually(lambda: 3 in {r.update_id for r in downstream.received})
                metrics = (await client.get(f"{base}/metrics", headers=AUTH)).text
            logs = run.stdout + run.stderr

    grouped = events_by_id(downstream.operations)
    bodies = {event_id: [d.body for d in deliveries] for event_id, deliveries in grouped.items()}
    events = {event_id: json.loads(found[0]) for event_id, found in bodies.items()}
    types = [event["type"] for event in events.values()]
    expected = [
        "exhaustion.created",
        "bot.paused",
        "backlog.stale",
        "bot.resumed",
        "redrive.finished",
        "telegram.webhook_error",
        "breaker.opened",
        "breaker.closed",
    ]
    assert sorted(set(types)) == sorted(expected)
    # Each once; backlog.stale may begin a second episode on a slow machine, while the open
    # breaker holds update 3 for longer than stale_after_seconds.
    assert [t for t in expected if types.count(t) != 1] in ([], ["backlog.stale"]), types
    # At least once: the refused deliveries came again, the same id and the same body.
    deliveries = sum(len(found) for found in bodies.values())
    assert deliveries == len(events) + REFUSED, bodies
    assert all(len(set(found)) == 1 for found in bodies.values()), "a retry changed the body"
    data = {event["type"]: event["data"] for event in events.values()}
    assert data["exhaustion.created"]["update_id"] == 1
    assert data["exhaustion.created"]["error"].startswith("HTTP 400")
    assert data["exhaustion.created"]["status_code"] == 400
    assert data["bot.paused"]["reason"] == "deploy"
    assert data["bot.paused"]["by"] == "key-" + data["bot.paused"]["by"][4:]  # a name, not a key
    assert KEY not in json.dumps(data)
    assert data["backlog.stale"]["age_ms"] > 1000
    assert data["redrive.finished"]["redriven"] == 1
    assert data["telegram.webhook_error"]["last_error_date"] == TELEGRAM_ERROR_DATE
    assert data["telegram.webhook_error"]["pending_update_count"] == 7
    assert 'telegram_intake_telegram_pending_updates{bot="default"} 7.0' in metrics
    assert (
        'telegram_intake_telegram_webhook_last_error_timestamp_seconds{bot="default"} 1.7e+09'
        in metrics
    )
    assert fake_api.called("getWebhookInfo") >= 1
    assert TOKEN not in logs
    assert TOKEN.split(":")[1] not in metrics
