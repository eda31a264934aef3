"""A rolling upgrade to destinations (revision 0010), the release before running beside this one.

The release before is the last one at revision 0009 (its `serve` and `worker`, run from its own
tree). It records the first updates of three Telegram queues, and the downstream holds the head
of one (answers 500), so that it is retried under a lease through the upgrade. While both keep
running, `telegram-intake migrate` brings the database to 0010, and this release's `serve` and
`worker` start. The next updates go to the old and the new `serve` in turn and both workers
claim. The downstream checks, at every arrival, that no older update of the arrival's queue is
undelivered, and counts the deliveries it accepted per update: each exactly one. At the end the
held head is let through and everything is delivered once, in order, with the held row's
attempts counted on across the upgrade.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from starlette.requests import Request
from starlette.responses import Response

from app.store.migrate import current_revision
from app.store.schema import HEAD
from tests.conftest import Storage, table_rows
from tests.downstream import FakeDownstream, Received, eventually
from tests.processes import STARTUP, free_port, post_update, processes, until_serving
from tests.store.releases import fleet_client, fleet_environment, release_tree

# Real processes that measure no time: beside the serial group (tests/conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("untimed")]

# The last release at revision 0009: the one an operator upgrades from.
BEFORE_0010 = "df409d3580212f2d4ae45d967e28031f2f8c3e60"
CHATS = {"a": 601, "b": 602}
USER = 603
HEAD_ID = 1  # chat a's first message: held through the upgrade


def _message(update_id: int, chat: str) -> tuple[int, str, str]:
    body = {"message_id": update_id, "date": 1, "text": "hi"}
    body["chat"] = {"id": CHATS[chat], "type": "private", "first_name": chat}
    return update_id, f"chat {chat}", json.dumps({"update_id": update_id, "message": body})


def _callback(update_id: int) -> tuple[int, str, str]:
    body = {"id": f"cb{update_id}", "chat_instance": "1", "data": "buy"}
    body["from"] = {"id": USER, "is_bot": False, "first_name": "U"}
    return update_id, "callbacks", json.dumps({"update_id": update_id, "callback_query": body})


BEFORE = [_message(1, "a"), _message(2, "b"), _callback(3), _message(4, "a")]
AFTER = [_message(n, "ab"[n % 2]) for n in range(5, 13)] + [_callback(13), _callback(14)]


@dataclass
class Seen:
    """Every arrival; the updates accepted (answered 200) and how often; each arrival of an
    update while an older one of its queue was not yet accepted."""

    queue_of: dict[int, str]
    released: threading.Event = field(default_factory=threading.Event)
    arrivals: list[int] = field(default_factory=list)
    accepted: dict[int, int] = field(default_factory=dict)
    overtaken: list[tuple[int, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def answer(self, received: Received, _request: Request) -> Response:
        update_id = received.update_id
        with self.lock:
            self.arrivals.append(update_id)
            queue = self.queue_of[update_id]
            self.overtaken += [
                (update_id, older)
                for older, its_queue in self.queue_of.items()
                if its_queue == queue and older < update_id and older not in self.accepted
            ]
            if update_id == HEAD_ID and not self.released.is_set():
                return Response('{"held": true}', 500, media_type="application/json")
            self.accepted[update_id] = self.accepted.get(update_id, 0) + 1
        return Response("{}", media_type="application/json")


async def test_the_release_before_and_this_one_deliver_side_by_side_through_0010(
    storage: Storage, downstream: FakeDownstream, tmp_path: Path
) -> None:
    url = storage.url("0009")
    old_tree = release_tree(tmp_path, BEFORE_0010, "release-before-0010")
    seen = Seen({update_id: queue for update_id, queue, _ in [*BEFORE, *AFTER]})
    downstream.answer = seen.answer
    env = fleet_environment(url, f"{downstream.url}/hook", old_tree)
    ports = {"old": free_port(), "new": free_port()}

    with processes(tmp_path) as start:
        old_serve = start("old-serve", env("old", port=ports["old"]), "serve")
        old_worker = start("old-worker", env("old"), "worker")
        async with fleet_client() as client:
            await until_serving(client, ports["old"], old_serve)
            await eventually(old_worker.started, within=STARTUP)
            for _, _, body in BEFORE:
                await post_update(client, ports["old"], body)
            await eventually(lambda: {2, 3} <= set(seen.accepted) and HEAD_ID in seen.arrivals)

            migrate = start("migrate", env("new"), "migrate")
            assert await asyncio.to_thread(migrate.popen.wait, STARTUP) == 0, migrate.report()
            new_serve = start("new-serve", env("new", port=ports["new"]), "serve")
            new_worker = start("new-worker", env("new"), "worker")
            await until_serving(client, ports["new"], new_serve)
            await eventually(new_worker.started, within=STARTUP)

            for number, (_, _, body) in enumerate(AFTER):
                await post_update(client, ports["old" if number % 2 else "new"], body)
            everything = {update_id for update_id, _, _ in [*BEFORE, *AFTER]}
            # Chat a waits behind its held head; the others go through, on either worker.
            held_back = {u for u, queue, _ in [*BEFORE, *AFTER] if queue == "chat a"}
            await eventually(lambda: set(seen.accepted) == everything - held_back, within=15)
            tries = seen.arrivals.count(HEAD_ID)
            await asyncio.sleep(2)  # both workers have had many passes at the held chat
            seen.released.set()
            await eventually(lambda: set(seen.accepted) == everything, within=30)
            await asyncio.sleep(1)  # a second delivery of anything would arrive by now
            for process in (old_serve, old_worker, new_serve, new_worker):
                assert process.poll() is None, process.report()
                assert "Traceback" not in process.stderr, process.report()

    assert seen.overtaken == []
    assert seen.accepted == dict.fromkeys(everything, 1)  # nothing delivered twice
    states = dict(table_rows(url, "update_id", "state"))
    assert states == dict.fromkeys(everything, "completed")
    # The held head's attempts went on counting across the upgrade, one per arrival.
    attempts = dict(table_rows(url, "update_id", "attempts"))
    assert attempts[HEAD_ID] == seen.arrivals.count(HEAD_ID) > tries >= 1
    assert current_revision(url) == HEAD
