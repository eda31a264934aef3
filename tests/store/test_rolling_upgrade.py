"""A rolling upgrade to Telegram's queues (revision 0006) with old and new processes side by side.

The old processes are the release before 0006, run from its own tree (`git archive` of that
commit): a `serve` and a `worker` that key updates by chat or sender. They record the first
update of several Telegram queues, which the downstream then fails on purpose, so those rows
stay open under the old keys. Then, while they keep running, `telegram-intake migrate` brings
the database to head, and a new `serve` and `worker` start. The next updates of the same
Telegram queues are posted to the old and the new `serve` in turn, both workers claim, and
the downstream checks at every arrival that no older update of the arrival's Telegram queue
(by the test's own reading of Telegram's table) is still undelivered. At the end the held
heads are let through and everything is delivered.

A control runs the same fleet with the trigger of 0006 dropped (an upgrade that only
re-keyed the rows once): the old `serve` then records a callback query under its sender's id,
and a worker delivers it past the held one: the check sees it.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sqlalchemy import text
from starlette.requests import Request
from starlette.responses import Response

from app.store.engine import create_sync_engine
from app.store.rekey import drop_trigger_ddl
from app.store.schema import DEFAULT_TABLE
from tests.conftest import Storage, table_rows
from tests.downstream import FakeDownstream, Received, eventually
from tests.processes import (
    STARTUP,
    free_port,
    post_update,
    processes,
    until_serving,
)
from tests.store.releases import fleet_client, fleet_environment, release_tree

# Real processes that measure no time: beside the serial group (tests/conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("untimed")]

# The last commit before revision 0006: the release an operator upgrades from.
BEFORE_0006 = "455b5a14735bd07c5cc5f59beb63e3e15f4fc2dd"
USER, MEMBER, VOTER_A, VOTER_B, OWNER = 501, 502, 503, 504, 505
POLL = "5404452365627555840"


@dataclass
class Update:
    update_id: int
    queue: str  # the Telegram queue, named by the test (not computed by the code under test)
    body: str
    to: str  # "old" or "new": which serve it is posted to


def _update(update_id: int, queue: str, kind: str, payload: dict[str, object], to: str) -> Update:
    return Update(update_id, queue, json.dumps({"update_id": update_id, kind: payload}), to)


def _callback(update_id: int, to: str) -> Update:
    payload = {"id": f"cb{update_id}", "from": {"id": USER, "is_bot": False, "first_name": "A"}}
    payload |= {"chat_instance": "1", "data": "buy"}
    return _update(update_id, f"callbacks of {USER}", "callback_query", payload, to)


def _message(update_id: int, to: str) -> Update:
    chat = {"id": USER, "type": "private", "first_name": "A"}
    payload = {"message_id": update_id, "date": 1, "chat": chat, "text": "hi"}
    return _update(update_id, f"chat {USER}", "message", payload, to)


def _member(update_id: int, chat: int, to: str) -> Update:
    user = {"id": MEMBER, "is_bot": False, "first_name": "M"}
    payload = {
        "chat": {"id": chat, "type": "supergroup", "title": "g"},
        "from": {"id": 1, "is_bot": False, "first_name": "Admin"},
        "date": 1,
        "old_chat_member": {"user": user, "status": "left"},
        "new_chat_member": {"user": user, "status": "member"},
    }
    return _update(update_id, f"member {MEMBER}", "chat_member", payload, to)


def _join_request(update_id: int, chat: int, to: str) -> Update:
    user = {"id": MEMBER, "is_bot": False, "first_name": "M"}
    payload = {"chat": {"id": chat, "type": "supergroup", "title": "g"}, "from": user}
    payload |= {"user_chat_id": MEMBER, "date": 1}
    return _update(update_id, f"member {MEMBER}", "chat_join_request", payload, to)


def _poll(update_id: int, to: str) -> Update:
    options = [{"text": "yes", "voter_count": 0}, {"text": "no", "voter_count": 0}]
    payload = {"id": POLL, "question": "?", "options": options, "total_voter_count": 0}
    payload |= {"is_closed": False, "is_anonymous": False, "type": "regular"}
    return _update(update_id, f"poll {POLL}", "poll", payload, to)


def _answer(update_id: int, voter: int, to: str) -> Update:
    payload = {"poll_id": POLL, "user": {"id": voter, "is_bot": False, "first_name": "V"}}
    payload |= {"option_ids": [0]}
    return _update(update_id, f"poll {POLL}", "poll_answer", payload, to)


def _connection(update_id: int, to: str) -> Update:
    payload = {"id": f"bc{update_id}", "user": {"id": OWNER, "is_bot": False, "first_name": "O"}}
    payload |= {"user_chat_id": OWNER, "date": 1, "is_enabled": True}
    return _update(update_id, f"business {OWNER}", "business_connection", payload, to)


# Recorded by the old release before the upgrade; all but the message are held (500).
BEFORE = [
    _callback(1, "old"),
    _message(2, "old"),
    _member(3, -1001, "old"),
    _poll(4, "old"),
    _connection(5, "old"),
]
HELD = {1, 3, 4, 5}
# After the upgrade, with old and new processes running: each Telegram queue's next updates,
# to the old and the new serve in turn.
AFTER = [
    _callback(6, "old"),
    _callback(7, "new"),
    _member(8, -1002, "old"),
    _join_request(9, -1003, "new"),
    _answer(10, VOTER_A, "old"),
    _answer(11, VOTER_B, "new"),
    _connection(12, "new"),
    _message(13, "new"),
    _callback(14, "new"),
    _member(15, -1004, "new"),
]


@dataclass
class Checked:
    """What the downstream saw: every arrival, and each arrival of an update while an older
    update of its Telegram queue was still undelivered."""

    queue_of: dict[int, str]
    released: threading.Event = field(default_factory=threading.Event)
    delivered: set[int] = field(default_factory=set)
    arrivals: list[int] = field(default_factory=list)
    overtaken: list[tuple[int, int]] = field(default_factory=list)
    keys: dict[int, str | None] = field(default_factory=dict)  # as recorded, after the upgrade
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def answer(self, received: Received, _request: Request) -> Response:
        update_id = received.update_id
        with self.lock:
            self.arrivals.append(update_id)
            queue = self.queue_of[update_id]
            for older, its_queue in self.queue_of.items():
                if its_queue == queue and older < update_id and older not in self.delivered:
                    self.overtaken.append((update_id, older))
            if update_id in HELD and not self.released.is_set():
                return Response('{"held": true}', 500, media_type="application/json")
            self.delivered.add(update_id)
        return Response("{}", media_type="application/json")


async def _run_fleet(
    storage: Storage, downstream: FakeDownstream, tmp_path: Path, *, keep_trigger: bool
) -> Checked:
    url = storage.url("0005")
    old_tree = release_tree(tmp_path, BEFORE_0006, "release-before-0006")
    checked = Checked({u.update_id: u.queue for u in [*BEFORE, *AFTER]})
    downstream.answer = checked.answer
    env = fleet_environment(url, f"{downstream.url}/hook", old_tree)
    ports = {"old": free_port(), "new": free_port()}

    with processes(tmp_path) as start:
        old_serve = start("old-serve", env("old", port=ports["old"]), "serve")
        old_worker = start("old-worker", env("old"), "worker")
        async with fleet_client() as client:
            await until_serving(client, ports["old"], old_serve)
            await eventually(old_worker.started, within=STARTUP)
            for update in BEFORE:
                await post_update(client, ports[update.to], update.body)
            # The heads are being retried under the old keys. The old release keys the private
            # chat's message by the chat, its user's callback query by the sender: one key, so
            # the message waits behind the held callback query (the merge 0006 undoes).
            await eventually(lambda: set(checked.arrivals) >= HELD)
            old_keys = dict(table_rows(url, "update_id", "queue_key"))
            assert old_keys[1] == str(USER)  # the old release's key: the sender

            migrate = start("migrate", env("new"), "migrate")
            assert await asyncio.to_thread(migrate.popen.wait, STARTUP) == 0, migrate.report()
            if not keep_trigger:
                _drop_trigger(url, storage.backend)
            new_serve = start("new-serve", env("new", port=ports["new"]), "serve")
            new_worker = start("new-worker", env("new"), "worker")
            await until_serving(client, ports["new"], new_serve)
            await eventually(new_worker.started, within=STARTUP)

            for update in AFTER:
                await post_update(client, ports[update.to], update.body)
            checked.keys = dict(table_rows(url, "update_id", "queue_key"))
            # The private chat's messages are their own queue now: through while the
            # callback query of the same user is held.
            await eventually(lambda: {2, 13} <= checked.delivered, within=10)
            # Every worker has had many passes at whatever it could claim.
            await asyncio.sleep(3)
            checked.released.set()
            everything = {u.update_id for u in [*BEFORE, *AFTER]}
            await eventually(lambda: checked.delivered >= everything, within=30)
            for process in (old_serve, old_worker, new_serve, new_worker):
                assert process.poll() is None, process.report()
                assert "Traceback" not in process.stderr, process.report()
    return checked


def _drop_trigger(url: str, backend: str) -> None:
    engine = create_sync_engine(url)
    try:
        with engine.begin() as connection:
            for statement in drop_trigger_ddl(DEFAULT_TABLE, backend)[:1]:
                connection.execute(text(statement))
    finally:
        engine.dispose()


async def test_old_and_new_processes_side_by_side_keep_telegrams_order(
    storage: Storage, downstream: FakeDownstream, tmp_path: Path
) -> None:
    checked = await _run_fleet(storage, downstream, tmp_path, keep_trigger=True)
    assert checked.overtaken == []
    # Whichever serve recorded them, the updates of one Telegram queue share its key.
    keys = checked.keys
    assert keys[1] == keys[6] == keys[7] == keys[14] == str(USER + 3 * 2**33)
    assert keys[2] == keys[13] == str(USER)
    assert keys[3] == keys[8] == keys[9] == keys[15] == str(MEMBER + 6 * 2**33)
    assert keys[4] == keys[10] == keys[11] == POLL
    assert keys[5] == keys[12] == str(OWNER + 10 * 2**33)
    # Every queue's updates arrived in update_id order, each queue's first after its head.
    for queue in set(checked.queue_of.values()):
        firsts = [u for u in dict.fromkeys(checked.arrivals) if checked.queue_of[u] == queue]
        assert firsts == sorted(firsts), (queue, checked.arrivals)


async def test_the_check_sees_an_old_serve_overtake_without_the_trigger(
    postgres_storage: Storage, downstream: FakeDownstream, tmp_path: Path
) -> None:
    checked = await _run_fleet(postgres_storage, downstream, tmp_path, keep_trigger=False)
    # The old serve keyed callback query 6 by its sender: nothing held it behind 1.
    assert (6, 1) in checked.overtaken
