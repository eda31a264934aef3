"""A failing update holds its own Telegram queue and nothing else: real `serve` and `worker`.

User 42 writes to the bot in their private chat (chat 42), and the downstream answers that
message 500 again and again. Everything else user 42 and chat 42 send belongs to other queues
in Telegram's Bot API server (another category, or another id), so each of them is delivered
while the message is retried; the chat's next message is in the same queue, and waits. The
expected queues are written out here from Telegram's table, not read from the code.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import Response

from tests.conftest import Storage
from tests.downstream import FakeDownstream, Received, eventually
from tests.processes import (
    STARTUP,
    environment,
    free_port,
    post_update,
    processes,
    until_serving,
)

pytestmark = pytest.mark.slow

USER = {"id": 42, "is_bot": False, "first_name": "Anna"}
PRIVATE = {"id": 42, "type": "private", "first_name": "Anna"}


def _message(update_id: int, kind: str = "message", chat: dict[str, object] = PRIVATE) -> str:
    payload = {"message_id": update_id, "from": USER, "chat": chat, "date": 1, "text": "hi"}
    if kind == "business_message":
        payload["business_connection_id"] = "bc1"
    return json.dumps({"update_id": update_id, kind: payload})


def _of(update_id: int, kind: str, payload: dict[str, object]) -> str:
    return json.dumps({"update_id": update_id, kind: payload})


FAILING = 1
SAME_QUEUE = 11  # the chat's next message: Telegram's queue of chat 42, behind the failing one
# Updates of user 42 and chat 42 that Telegram sends in parallel with the chat's messages.
OTHER_QUEUES = {
    2: _of(2, "inline_query", {"id": "iq", "from": USER, "query": "pizza", "offset": ""}),
    3: _of(3, "chosen_inline_result", {"result_id": "r1", "from": USER, "query": "pizza"}),
    4: _of(4, "callback_query", {"id": "cq", "from": USER, "chat_instance": "1", "data": "x"}),
    5: _of(5, "pre_checkout_query", {"id": "pc", "from": USER, "currency": "XTR",
                                     "total_amount": 1, "invoice_payload": "p"}),
    6: _of(6, "my_chat_member", {"chat": PRIVATE, "from": USER, "date": 1,
                                 "old_chat_member": {"user": USER, "status": "member"},
                                 "new_chat_member": {"user": USER, "status": "kicked"}}),
    7: _of(7, "message_reaction", {"chat": PRIVATE, "message_id": 1, "user": USER, "date": 1,
                                   "old_reaction": [], "new_reaction": []}),
    8: _message(8, "business_message"),
    9: _of(9, "purchased_paid_media", {"from": USER, "paid_media_payload": "p"}),
    10: _of(10, "business_connection", {"id": "bc1", "user": USER, "user_chat_id": 42,
                                        "date": 1, "is_enabled": True}),
}  # fmt: skip


async def test_a_failing_message_holds_its_chat_only(
    storage: Storage, downstream: FakeDownstream, tmp_path: Path
) -> None:
    url = storage.url()
    released = threading.Event()
    arrivals: list[int] = []

    async def answer(received: Received, _request: Request) -> Response:
        arrivals.append(received.update_id)
        if received.update_id == FAILING and not released.is_set():
            return Response('{"error": "down"}', 500, media_type="application/json")
        return Response("{}", media_type="application/json")

    downstream.answer = answer
    port = free_port()
    # Attempts are never spent and no breaker opens while the message fails.
    env = environment(url, f"{downstream.url}/hook", max_attempts=1000, breaker_failures=0)
    with processes(tmp_path) as start:
        serve = start("serve", env | {"INTAKE_PORT": str(port)}, "serve")
        worker = start("worker", env, "worker")
        async with httpx.AsyncClient(timeout=10) as client:
            await until_serving(client, port, serve)
            await eventually(worker.started, within=STARTUP)
            await post_update(client, port, _message(FAILING))
            await eventually(lambda: arrivals.count(FAILING) >= 2)  # failed, and retried
            for body in OTHER_QUEUES.values():
                await post_update(client, port, body)
            await post_update(client, port, _message(SAME_QUEUE))

            # Each one of the other queues through while the message keeps failing.
            await eventually(lambda: set(OTHER_QUEUES) <= set(arrivals), within=10)
            # Its chat's next message waits behind it for as long as it fails.
            retries = arrivals.count(FAILING)
            await eventually(lambda: arrivals.count(FAILING) >= retries + 3)
            assert SAME_QUEUE not in arrivals

            released.set()
            await eventually(lambda: SAME_QUEUE in arrivals, within=10)
            # Delivered once the failing message was: after its last attempt.
            last_attempt = max(i for i, update_id in enumerate(arrivals) if update_id == FAILING)
            assert arrivals.index(SAME_QUEUE) > last_attempt
