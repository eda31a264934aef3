"""A real `run` process with `[[bots.destinations]]` tables (docs/destinations.md): each update
posted to the webhook goes to every destination its filter matches, each with its own header,
webhook-id and identity, and the operators see each delivery."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from pathlib import Path

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import Response

from tests.conftest import Storage
from tests.downstream import FakeDownstream, Received, eventually, ok
from tests.processes import STARTUP, Process, environment, free_port

pytestmark = pytest.mark.slow  # a real process

KEY = "destinations-service-key-0123456789"


def _config(path: Path, downstream: str, port: int) -> None:
    path.write_text(
        f"""
api_keys = [{{ key = "{KEY}" }}]

[[bots]]
name = "shop"
secret_token = "shop-secret"
downstream_url = "{downstream}/hook?to=bot"

[[bots.destinations]]
name = "payments"
url = "{downstream}/hook?to=payments"
filter = ["pre_checkout_query", "message:successful_payment"]

[[bots.destinations]]
name = "analytics"
url = "{downstream}/hook?to=analytics"
ordered = false
except = ["pre_checkout_query"]
"""
    )


async def test_a_run_process_delivers_each_update_to_each_destination_it_matches(
    storage: Storage, downstream: FakeDownstream, tmp_path: Path
) -> None:
    port = free_port()
    config = tmp_path / "intake.toml"
    _config(config, downstream.url, port)
    env = environment(storage.url(), None, port=port, config=str(config))
    env.pop("INTAKE_SECRET_TOKEN")
    to: dict[tuple[str, int], str] = {}  # (destination header, update_id): the URL's `to`

    async def answer(received: Received, request: Request) -> Response:
        destination = received.headers.get("x-intake-destination", "default")
        to[(destination, received.update_id)] = request.query_params["to"]
        return await ok(received, request)

    downstream.answer = answer
    process = Process("run", tmp_path, env, "run")
    base = f"http://127.0.0.1:{port}"
    headers = {"x-telegram-bot-api-secret-token": "shop-secret"}
    updates = [
        {"update_id": 1, "message": {"message_id": 1, "date": 0, "chat": {"id": 7}, "text": "hi"}},
        {"update_id": 2, "pre_checkout_query": {"id": "q", "from": {"id": 7}, "currency": "EUR",
                                                 "total_amount": 100, "invoice_payload": "p"}},
        {"update_id": 3, "message": {"message_id": 2, "date": 0, "chat": {"id": 7},
                                     "successful_payment": {"currency": "EUR"}}},
    ]  # fmt: skip
    try:
        await eventually(lambda: process.answers(f"{base}/healthz"), within=STARTUP)
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            for update in updates:
                answer = await client.post("/telegram/shop", json=update, headers=headers)
                assert answer.status_code == 200, process.report()
            try:
                await eventually(lambda: len(downstream.received) >= 7, within=30)
            except AssertionError:
                seen = [(r.path, r.update_id) for r in downstream.received]
                raise AssertionError(f"arrived {seen}\n{process.report()}") from None
            await asyncio.sleep(0.5)  # nothing more arrives
            view = (
                await client.get("/v1/updates/shop/2", headers={"authorization": f"Bearer {KEY}"})
            ).json()
    finally:
        process.kill()
    arrived: dict[str, list[int]] = defaultdict(list)
    for (destination, update_id), where in to.items():
        assert where == {"default": "bot"}.get(destination, destination)
        arrived[destination].append(update_id)
    assert {d: sorted(ids) for d, ids in arrived.items()} == {
        "default": [1, 2, 3],
        "payments": [2, 3],
        "analytics": [1, 3],
    }, json.dumps(arrived)
    assert (view["state"], [d["destination"] for d in view["deliveries"]]) == (
        "completed", ["payments"])  # fmt: skip
    assert view["deliveries"][0]["state"] == "completed"
    assert "Traceback" not in process.stderr
