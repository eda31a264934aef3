"""Each framework's bot behind a real `telegram-intake run`, through the kit's adapter: the
service's guarantees hold to the end of the bot's own handlers.

aiogram and python-telegram-bot from PyPI (tests/kit/bots), grammY and Telegraf from npm
(kit/typescript/test/bots), all doing what tests/kit/bots/behaviour.py says, against the fake
Bot API, whose recorded sendMessage calls are the bots' effects. The service runs on
PostgreSQL with a one-second lease, a three-second forward timeout, and the bot deferring its
answer after two seconds. Five checks, for each framework:

- a handler that raised is retried, and its update handled once;
- `Terminal` becomes an exhaustion;
- chat order holds with handlers of random duration, several chats in parallel;
- a handler slower than the lease keeps its attempt (the worker renews while it waits), and
  one slower than the forward timeout too (the adapter defers, renews and settles), keeping
  its chat's place;
- the attempt a handler is given is the identity the service forwarded.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from app.fake_bot_api import FakeBotApi
from tests.conftest import Storage, serving_asgi
from tests.kit.bots import bot_program
from tests.kit.conftest import message_update
from tests.processes import (
    ROOT,
    SECRET,
    Process,
    environment,
    free_port,
    processes,
    until_listening,
)

pytestmark = pytest.mark.slow

API_KEY = "framework-callback-key"
DOWNSTREAM_SECRET = "framework-downstream-secret"
SIGNING_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
LEASE_SECONDS = 1
FORWARD_TIMEOUT_SECONDS = 3
DEFER_AFTER = 2
WAIT = 30.0


def framework(name: str) -> Any:
    # One worker builds a framework's stack once, for all its checks.
    return pytest.param(name, marks=pytest.mark.xdist_group(f"framework-{name}"))


FRAMEWORKS = [framework(name) for name in ("aiogram", "ptb", "grammy", "telegraf")]


@dataclass
class Stack:
    name: str
    service: str
    bot_api: FakeBotApi
    run: Process
    bot: Process

    def post(self, update_id: int, chat: int, text: str) -> None:
        update = message_update(update_id, text, chat)
        answer = httpx.post(
            f"{self.service}/telegram/default",
            json=update,
            headers={"X-Telegram-Bot-Api-Secret-Token": SECRET},
        )
        assert answer.status_code == 200, answer.text

    def sent(self) -> list[tuple[int, dict[str, Any]]]:
        """What the bot sent, in order: (chat, the message's JSON)."""
        return [(call["chat_id"], json.loads(call["text"])) for call in self.bot_api.sent()]

    def sent_for(self, update_id: int) -> list[dict[str, Any]]:
        return [message for _, message in self.sent() if message["update_id"] == update_id]

    def api(self, path: str) -> Any:
        answer = httpx.get(
            f"{self.service}/v1{path}", headers={"authorization": f"Bearer {API_KEY}"}
        )
        assert answer.status_code == 200, answer.text
        return answer.json()

    def view(self, update_id: int) -> dict[str, Any]:
        return dict(self.api(f"/updates/default/{update_id}"))

    def attempts(self, update_id: int) -> list[dict[str, Any]]:
        return list(self.api(f"/updates/default/{update_id}/attempts")["items"])

    def until(self, what: str, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + WAIT
        while not done():
            for process in (self.run, self.bot):
                assert process.poll() is None, process.report()
            assert time.monotonic() < deadline, f"{what}: not within {WAIT} s\n{self.report()}"
            time.sleep(0.05)

    def settled(self, update_id: int) -> bool:
        return self.view(update_id)["state"] in ("completed", "abandoned")

    def report(self) -> str:
        return self.run.report() + self.bot.report()


@contextmanager
def running(
    name: str, tmp: Path, admin: psycopg.Connection[tuple[object, ...]], **bot_env: str
) -> Iterator[Stack]:
    """The fake Bot API, the bot of framework `name` and `telegram-intake run` in front of it,
    on a PostgreSQL schema of its own."""
    storage = Storage("postgresql", tmp, admin)
    bot_api = FakeBotApi()
    try:
        with serving_asgi(bot_api.app()) as api_root, processes(tmp) as start:
            service_port, bot_port = free_port(), free_port()
            env = environment("unused", None) | {
                "PYTHONPATH": str(ROOT),
                "BOT_TOKEN": bot_api.token,
                "BOT_API_ROOT": api_root,
                "PORT": str(bot_port),
                "SECRET_TOKEN": DOWNSTREAM_SECRET,
                "SIGNING_SECRET": SIGNING_SECRET,
                "INTAKE_URL": f"http://127.0.0.1:{service_port}",
                "API_KEY": API_KEY,
                "DEFER_AFTER": str(DEFER_AFTER),
            }
            bot = start(name, env | bot_env, program=bot_program(name))
            until_listening(bot_port, bot)
            service_env = environment(
                storage.url(),
                f"http://127.0.0.1:{bot_port}/",
                port=service_port,
                downstream_secret_token=DOWNSTREAM_SECRET,
                signing_secret=SIGNING_SECRET,
                api_keys=API_KEY,
                lease_seconds=LEASE_SECONDS,
                forward_timeout_seconds=FORWARD_TIMEOUT_SECONDS,
            )
            run = start("run", service_env, "run")
            until_listening(service_port, run)
            yield Stack(name, f"http://127.0.0.1:{service_port}", bot_api, run, bot)
    finally:
        storage.drop()


@pytest.fixture(scope="session")
def stacks(
    tmp_path_factory: pytest.TempPathFactory,
    postgres_admin: psycopg.Connection[tuple[object, ...]],
) -> Iterator[Callable[[str], Stack]]:
    """Each framework's stack, built once in a worker (its tests share an xdist group, so
    one worker runs them all, in whatever order) and stopped at the end of the session."""
    built: dict[str, Stack] = {}
    with ExitStack() as stopping:

        def get(name: str) -> Stack:
            if name not in built:
                made = running(name, tmp_path_factory.mktemp(name), postgres_admin)
                built[name] = stopping.enter_context(made)
            return built[name]

        yield get


@pytest.fixture
def stack(framework: str, stacks: Callable[[str], Stack]) -> Stack:
    return stacks(framework)


# Parametrized on the tests, not the fixture: only a test's own marks reach xdist's groups.
@pytest.mark.parametrize("framework", FRAMEWORKS)
class TestBehindTheService:
    def test_a_handler_that_raised_is_handled_once_afterwards(self, stack: Stack) -> None:
        stack.post(101, 1001, "fail-once")
        stack.until("handled", lambda: stack.settled(101))
        (message,) = stack.sent_for(101)
        assert message["intake"]["attempt"] == 2
        outcomes = [(a["attempt"], a["outcome"], a["status_code"]) for a in stack.attempts(101)]
        assert outcomes == [(1, "failed", 500), (2, "completed", 200)], stack.report()

    def test_terminal_becomes_an_exhaustion(self, stack: Stack) -> None:
        stack.post(201, 2001, "terminal")
        stack.until("exhausted", lambda: stack.view(201)["exhausted_at"] is not None)
        view = stack.view(201)
        assert "terminal" in view["error"]
        assert [a["status_code"] for a in stack.attempts(201)] == [422]
        assert stack.sent_for(201) == []
        listed = stack.api("/exhaustions?bot=default")["items"]
        assert [(item["update_id"], item["attempt"]) for item in listed] == [(201, 1)]

    def test_chat_order_holds_with_handlers_of_random_duration(self, stack: Stack) -> None:
        chats, per_chat = range(3001, 3007), 8
        posted = {chat: [] for chat in chats}  # type: dict[int, list[int]]
        shuffle = random.Random(31)
        update_id = 300_000
        for _ in range(per_chat):
            for chat in chats:
                update_id += 1
                stack.post(update_id, chat, f"sleep:{shuffle.randint(0, 120)}")
                posted[chat].append(update_id)
        total = len(chats) * per_chat
        stack.until(
            "all delivered", lambda: sum(chat in posted for chat, _ in stack.sent()) >= total
        )
        delivered = {chat: [] for chat in chats}  # type: dict[int, list[int]]
        for chat, message in stack.sent():
            if chat in delivered:
                delivered[chat].append(message["update_id"])
        assert delivered == posted

    def test_a_handler_slower_than_the_lease_keeps_its_attempt(self, stack: Stack) -> None:
        # 1.6 s: past the 1 s lease, short of the 2 s deferral; the worker renews.
        stack.post(401, 4001, "sleep:1600")
        stack.until("handled", lambda: stack.settled(401))
        (message,) = stack.sent_for(401)
        assert message["intake"]["attempt"] == 1
        assert message["intake"]["owns"] is True
        assert [a["outcome"] for a in stack.attempts(401)] == ["completed"]

    def test_a_handler_slower_than_the_forward_timeout_is_deferred(self, stack: Stack) -> None:
        # 4.5 s: past the 3 s forward timeout. The adapter answers 202 at 2 s, renews, and
        # settles when the handler ends; the chat's next update waits its turn.
        stack.post(501, 5001, "sleep:4500")
        stack.post(502, 5001, "next")
        stack.until("both handled", lambda: stack.settled(501) and stack.settled(502))
        in_chat = [message["update_id"] for chat, message in stack.sent() if chat == 5001]
        assert in_chat == [501, 502]
        # One attempt, settled through the callback API (no HTTP status) after the handler's
        # 4.5 s: past the forward timeout, the lease and the deferral.
        (first,) = stack.attempts(501)
        assert (first["attempt"], first["outcome"], first["status_code"]) == (1, "completed", None)
        assert first["duration_ms"] >= 4_000

    def test_the_attempt_is_the_forwarded_identity(self, stack: Stack) -> None:
        stack.post(601, 6001, "hello")
        stack.until("handled", lambda: stack.settled(601))
        (message,) = stack.sent_for(601)
        (attempt,) = stack.attempts(601)
        assert message["intake"] == {
            "bot": "default",
            "update_id": 601,
            "attempt": 1,
            "claim_id": attempt["claim_id"],
            "owns": True,
        }


@pytest.mark.xdist_group("framework-aiogram")
def test_control_aiogram_own_handler_loses_the_failed_update(
    tmp_path: Path, postgres_admin: psycopg.Connection[tuple[object, ...]]
) -> None:
    """The same bot with aiogram's own SimpleRequestHandler: it answers 200 before the
    handler runs, so the update that raised is completed, and never handled."""
    with running("aiogram", tmp_path, postgres_admin, ADAPTER="aiogram") as stack:
        stack.post(101, 1001, "fail-once")
        stack.until("completed", lambda: stack.settled(101))
        time.sleep(1)  # a retry, were there one, would long have come
        assert [a["outcome"] for a in stack.attempts(101)] == ["completed"]
        assert stack.sent_for(101) == []
