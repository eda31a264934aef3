"""The framework-neutral core of the kit's adapters (`telegram_intake_kit.adapter.Intake`), with
plain coroutines as the handlers: verify, run, answer 200 / 500 / 422 / 401 / 400, and defer
past `defer_after` with the lease renewed and the attempt settled through a fake callback API
(an aiohttp app on an ephemeral port, in the test's loop, recording every call).

The helpers here (signed requests, the fake callback API, `until`) serve test_aiogram.py and
test_ptb.py too.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from telegram_intake_kit import Forwarded, Identity, IntakeAttempt, Terminal, current_attempt
from telegram_intake_kit.adapter import Intake, describe
from telegram_intake_kit.forwarded import identity_message, sign
from telegram_intake_kit.wire import MAX_ERROR_LENGTH, SettleRequest
from tests.kit.conftest import message_update

SECRET_TOKEN = "adapter-downstream-secret"
SIGNING_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
API_KEY = "adapter-callback-key"
BOT = "shop"
RECEIVED_AT = 1_796_126_400_123
LEASE_EXPIRES_AT = 1_796_126_467_000
DEFER_AFTER = 0.1
DEFERRED_LEASE = 1.0  # renewed every third of it: 0.33 s


# ---- requests as the service forwards them ------------------------------------------------


def identity_of(update_id: int, attempt: int = 1) -> Identity:
    return Identity(bot=BOT, update_id=update_id, attempt=attempt, claim_id=f"claim-{update_id}")


def signed_headers(
    body: bytes,
    identity: Identity | None,
    *,
    message_id: str,
    secret_token: str = SECRET_TOKEN,
    signing_secret: str = SIGNING_SECRET,
) -> dict[str, str]:
    """The headers app/dispatch/forward.py sends, signed with the kit's own `sign`: the body
    and `webhook-id`, and the identity headers with `X-Intake-Received-At`."""
    now = int(time.time())
    headers = {
        "content-type": "application/json",
        "x-telegram-bot-api-secret-token": secret_token,
        "webhook-id": message_id,
        "webhook-timestamp": str(now),
        "webhook-signature": sign(signing_secret, message_id, now, body),
    }
    if identity is not None:
        headers |= {
            "x-intake-bot": identity.bot,
            "x-intake-update-id": str(identity.update_id),
            "x-intake-attempt": str(identity.attempt),
            "x-intake-claim-id": identity.claim_id,
            "x-intake-lease-expires-at": str(LEASE_EXPIRES_AT),
            "x-intake-received-at": str(RECEIVED_AT),
            "x-intake-identity-signature": sign(
                signing_secret, identity_message(identity, RECEIVED_AT), now, b""
            ),
        }
    return headers


def request_for(
    update: dict[str, Any], *, plain: bool = False, attempt: int = 1
) -> tuple[dict[str, str], bytes]:
    """One forwarded attempt at `update` (headers, body); `plain`: no identity headers."""
    body = json.dumps(update).encode()
    update_id = update["update_id"]
    identity = None if plain else identity_of(update_id, attempt)
    return signed_headers(body, identity, message_id=f"{BOT}:{update_id}"), body


async def until(done: Callable[[], bool], what: str) -> None:
    """Wait (up to 5 s) for `done()`."""
    deadline = time.monotonic() + 5.0
    while not done():
        assert time.monotonic() < deadline, f"{what}: not within 5 s"
        await asyncio.sleep(0.01)


# ---- a fake callback API ---------------------------------------------------------------------


@asynccontextmanager
async def serving_aiohttp(app: web.Application) -> AsyncIterator[str]:
    """Serve `app` on 127.0.0.1 at an ephemeral port, in this loop; yields its base URL.
    Its on_shutdown handlers run when the block ends."""
    runner = web.AppRunner(app, shutdown_timeout=5.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port = runner.addresses[0][1]
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@dataclass(frozen=True)
class Call:
    at: float  # time.monotonic() when it arrived
    body: dict[str, Any]
    authorization: str | None


class CallbackApi:
    """`/v1/claims/renew` and `/v1/claims/settle`, recorded. `renewed` is what renew answers;
    `settle_statuses` are the statuses the next settles answer (then 200)."""

    def __init__(self) -> None:
        self.url = ""
        self.renewed = True
        self.settle_statuses: list[int] = []
        self.renews: list[Call] = []
        self.settles: list[Call] = []

    def app(self) -> web.Application:
        async def renew(request: web.Request) -> web.Response:
            body = await request.json()
            self.renews.append(Call(time.monotonic(), body, request.headers.get("authorization")))
            expires = int(time.time() * 1000) + body["lease_ms"] if self.renewed else None
            return web.json_response({"renewed": self.renewed, "lease_expires_at": expires})

        async def settle(request: web.Request) -> web.Response:
            body = await request.json()
            self.settles.append(Call(time.monotonic(), body, request.headers.get("authorization")))
            status = self.settle_statuses.pop(0) if self.settle_statuses else 200
            if status != 200:
                return web.json_response({"error": f"answered {status}"}, status=status)
            return web.json_response({"settled": True})

        app = web.Application()
        app.router.add_post("/v1/claims/renew", renew)
        app.router.add_post("/v1/claims/settle", settle)
        return app


@pytest.fixture
async def callback_api() -> AsyncIterator[CallbackApi]:
    api = CallbackApi()
    async with serving_aiohttp(api.app()) as url:
        api.url = url
        yield api


@pytest.fixture
async def intakes(callback_api: CallbackApi) -> AsyncIterator[Callable[..., Intake]]:
    """Makes `Intake`s verifying both secrets; each is closed at the end (before the fake
    callback API stops)."""
    made: list[Intake] = []

    def make(**options: Any) -> Intake:
        intake = Intake(
            **{"secret_token": SECRET_TOKEN, "signing_secret": SIGNING_SECRET, **options}
        )
        made.append(intake)
        return intake

    yield make
    for intake in made:
        await intake.aclose()


@pytest.fixture
def deferring(callback_api: CallbackApi, intakes: Callable[..., Intake]) -> Callable[..., Intake]:
    """Makes `Intake`s that defer after 0.1 s, with a one-second deferred lease, against the
    fake callback API."""

    def make(**options: Any) -> Intake:
        arguments = {
            "intake_url": callback_api.url,
            "api_key": API_KEY,
            "defer_after": DEFER_AFTER,
            "deferred_lease": DEFERRED_LEASE,
            **options,
        }
        return intakes(**arguments)

    return make


async def returns(_forwarded: Forwarded, _attempt: IntakeAttempt | None) -> None:
    return None


def raising(error: BaseException) -> Callable[[Forwarded, IntakeAttempt | None], Any]:
    async def run(_forwarded: Forwarded, _attempt: IntakeAttempt | None) -> None:
        raise error

    return run


# ---- the verdict -------------------------------------------------------------------------------


async def test_handlers_that_return_are_answered_200(intakes: Callable[..., Intake]) -> None:
    seen: list[Forwarded] = []

    async def run(forwarded: Forwarded, _attempt: IntakeAttempt | None) -> None:
        seen.append(forwarded)

    answer = await intakes().handle(*request_for(message_update(1)), run)
    assert (answer.status, answer.body) == (200, {})
    assert [forwarded.update for forwarded in seen] == [message_update(1)]


async def test_the_handlers_continue_the_trace_the_forward_names(
    intakes: Callable[..., Intake],
) -> None:
    # The bot traces with its own provider; the service's forward names its span in W3C's
    # traceparent (docs/contract.md section 15): the handlers' spans are that span's children.
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("the bot")

    async def run(_forwarded: Forwarded, _attempt: IntakeAttempt | None) -> None:
        with tracer.start_as_current_span("the bot's handler"):
            pass

    headers, body = request_for(message_update(4))
    traceparent = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    answer = await intakes().handle({**headers, "traceparent": traceparent}, body, run)
    assert answer.status == 200
    answer = await intakes().handle(*request_for(message_update(5)), run)  # none named
    assert answer.status == 200
    continued, alone = exporter.get_finished_spans()
    assert continued.context is not None
    assert continued.context.trace_id == int("ab" * 16, 16)
    assert continued.parent is not None
    assert continued.parent.span_id == int("cd" * 8, 16)
    assert alone.parent is None
    assert alone.context is not None
    assert alone.context.trace_id != continued.context.trace_id


async def test_handlers_that_raise_are_answered_500_with_type_and_message(
    intakes: Callable[..., Intake],
) -> None:
    answer = await intakes().handle(*request_for(message_update(2)), raising(KeyError("chat")))
    assert (answer.status, answer.body) == (500, {"error": "KeyError: 'chat'"})


async def test_terminal_is_answered_422(intakes: Callable[..., Intake]) -> None:
    answer = await intakes().handle(*request_for(message_update(3)), raising(Terminal("never")))
    assert (answer.status, answer.body) == (422, {"error": "Terminal: never"})


async def test_a_subclass_of_terminal_is_answered_422(intakes: Callable[..., Intake]) -> None:
    class Unsupported(Terminal):
        pass

    answer = await intakes().handle(*request_for(message_update(4)), raising(Unsupported("x")))
    assert (answer.status, answer.body) == (422, {"error": "Unsupported: x"})


@pytest.mark.parametrize(
    ("error", "described"),
    [
        (RuntimeError("boom"), "RuntimeError: boom"),
        (RuntimeError(), "RuntimeError"),
        (ValueError("a\x00b\x00"), "ValueError: ab"),
        (ValueError("\x00" * 5_000 + "end"), "ValueError: end"),  # NUL gone before the cut
    ],
)
def test_describe_names_the_type_and_removes_nul(error: Exception, described: str) -> None:
    assert describe(error) == described


def test_describe_cuts_to_the_callback_apis_length() -> None:
    described = describe(RuntimeError("x" * 5_000))
    assert len(described) == MAX_ERROR_LENGTH
    assert described.startswith("RuntimeError: xxx")


def test_describe_gives_an_error_text_the_callback_api_takes() -> None:
    """An exception message may hold a lone surrogate (a file name decoded with
    surrogateescape, say). The 500 answer's JSON escapes it, but settle's request cannot
    carry it: describe() should give text that a SettleRequest accepts."""
    error = describe(FileNotFoundError("no such file: b\udcffd.txt"))
    SettleRequest(**identity_of(5).model_dump(), outcome="failed", error=error)


async def test_a_long_error_with_nul_is_answered_within_the_callback_apis_rules(
    intakes: Callable[..., Intake],
) -> None:
    run = raising(RuntimeError("\x00x" * 3_000))
    answer = await intakes().handle(*request_for(message_update(6)), run)
    assert answer.status == 500
    assert len(answer.body["error"]) == MAX_ERROR_LENGTH
    assert "\x00" not in answer.body["error"]
    assert answer.body["error"].startswith("RuntimeError: xxx")


# ---- refusals ----------------------------------------------------------------------------------


def _tampered(headers: dict[str, str], name: str, value: str | None) -> dict[str, str]:
    changed = dict(headers)
    if value is None:
        del changed[name]
    else:
        changed[name] = value
    return changed


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("x-telegram-bot-api-secret-token", "another-secret"),
        ("x-telegram-bot-api-secret-token", None),
        ("webhook-signature", "v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="),
        ("webhook-signature", None),
        ("x-intake-identity-signature", "v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="),
        ("x-intake-attempt", "9"),  # the identity altered in flight
        ("x-intake-received-at", "1796126400124"),
    ],
)
async def test_an_unverified_request_is_401_and_runs_nothing(
    intakes: Callable[..., Intake], name: str, value: str | None
) -> None:
    ran: list[Forwarded] = []

    async def run(forwarded: Forwarded, _attempt: IntakeAttempt | None) -> None:
        ran.append(forwarded)

    headers, body = request_for(message_update(7))
    answer = await intakes().handle(_tampered(headers, name, value), body, run)
    assert answer.status == 401, answer.body
    assert answer.body["error"]
    assert ran == []


async def test_a_changed_body_is_401_and_runs_nothing(intakes: Callable[..., Intake]) -> None:
    ran: list[Forwarded] = []

    async def run(forwarded: Forwarded, _attempt: IntakeAttempt | None) -> None:
        ran.append(forwarded)

    headers, _ = request_for(message_update(8))
    other = json.dumps(message_update(8, text="changed")).encode()
    answer = await intakes().handle(headers, other, run)
    assert (answer.status, ran) == (401, [])


@pytest.mark.parametrize(
    "body", [b"not json", b'{"hello": 1}', b'{"update_id": "9"}', b"[9]", b"\xff\xfe"]
)
async def test_a_body_that_is_not_an_update_is_400(
    intakes: Callable[..., Intake], body: bytes
) -> None:
    ran: list[Forwarded] = []

    async def run(forwarded: Forwarded, _attempt: IntakeAttempt | None) -> None:
        ran.append(forwarded)

    headers = signed_headers(body, None, message_id=f"{BOT}:9")
    answer = await intakes().handle(headers, body, run)
    assert answer.status == 400, answer.body
    assert answer.body["error"].startswith("the body is")
    assert ran == []


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({}, "secret_token or signing_secret"),
        ({"secret_token": "s", "intake_url": "http://127.0.0.1:9"}, "go together"),
        ({"secret_token": "s", "api_key": "k"}, "go together"),
        ({"secret_token": "s", "defer_after": 0}, "defer_after"),
        ({"secret_token": "s", "defer_after": -1.0}, "defer_after"),
        ({"secret_token": "s", "defer_after": math.nan}, "defer_after"),
        ({"secret_token": "s", "deferred_lease": 0.5}, "deferred_lease"),
    ],
)
def test_the_constructor_refuses(options: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        Intake(**options)


# ---- the attempt -------------------------------------------------------------------------------


async def test_a_plain_request_has_no_attempt_and_is_never_deferred(
    callback_api: CallbackApi, deferring: Callable[..., Intake]
) -> None:
    seen: list[object] = []

    async def run(_forwarded: Forwarded, attempt: IntakeAttempt | None) -> None:
        seen.append(attempt)
        await asyncio.sleep(DEFER_AFTER * 3)
        seen.append(current_attempt())

    started = time.monotonic()
    answer = await deferring().handle(*request_for(message_update(10), plain=True), run)
    assert answer.status == 200
    assert time.monotonic() - started >= DEFER_AFTER * 3
    assert seen == [None, None]
    assert (callback_api.renews, callback_api.settles) == ([], [])


async def test_without_a_callback_api_a_slow_handler_is_waited_for(
    intakes: Callable[..., Intake],
) -> None:
    intake = intakes(defer_after=DEFER_AFTER)
    assert intake.client is None
    started = time.monotonic()
    answer = await intake.handle(
        *request_for(message_update(11)), lambda *_: asyncio.sleep(DEFER_AFTER * 3)
    )
    assert answer.status == 200
    assert time.monotonic() - started >= DEFER_AFTER * 3


async def test_current_attempt_in_the_handler_and_in_a_task_it_starts(
    intakes: Callable[..., Intake],
) -> None:
    seen: dict[str, IntakeAttempt | None] = {}

    async def in_a_task() -> None:
        await asyncio.sleep(0)
        seen["task"] = current_attempt()

    async def run(_forwarded: Forwarded, attempt: IntakeAttempt | None) -> None:
        seen["given"] = attempt
        seen["handler"] = current_attempt()
        await asyncio.create_task(in_a_task())

    intake = intakes()
    answer = await intake.handle(*request_for(message_update(12, "x"), attempt=3), run)
    assert answer.status == 200
    given = seen["given"]
    assert given is not None
    assert given.identity == identity_of(12, attempt=3)
    assert given.lease_expires_at == LEASE_EXPIRES_AT
    assert given.fence_token is not None
    assert (given.fence_token.identity, given.fence_token.received_at) == (
        identity_of(12, attempt=3),
        RECEIVED_AT,
    )
    assert seen["handler"] is given
    assert seen["task"] is given
    assert current_attempt() is None  # the handlers' context, not the caller's


# ---- deferral ----------------------------------------------------------------------------------


async def test_a_slow_handler_is_deferred_and_its_lease_renewed_every_third(
    callback_api: CallbackApi, deferring: Callable[..., Intake]
) -> None:
    release = asyncio.Event()
    ended: list[float] = []

    async def run(_forwarded: Forwarded, _attempt: IntakeAttempt | None) -> None:
        await release.wait()
        ended.append(time.monotonic())

    started = time.monotonic()
    answer = await deferring().handle(*request_for(message_update(20)), run)
    answered = time.monotonic()
    assert (answer.status, answer.body) == (202, {"deferred": True})
    assert DEFER_AFTER <= answered - started < DEFER_AFTER + 0.5

    await until(lambda: len(callback_api.renews) >= 1, "the first renewal")
    first = callback_api.renews[0]
    assert first.at - answered < 0.25, "renewed at once"
    expected = {**identity_of(20).model_dump(exclude={"destination"}), "lease_ms": 1000}
    assert first.body == expected
    assert first.authorization == f"Bearer {API_KEY}"

    await until(lambda: len(callback_api.renews) >= 3, "two more renewals")
    times = [renew.at for renew in callback_api.renews[:3]]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert all(0.28 <= gap <= 0.8 for gap in gaps), gaps
    assert callback_api.settles == []

    release.set()
    await until(lambda: bool(callback_api.settles), "the settle")
    (settle,) = callback_api.settles
    assert settle.body == {
        **identity_of(20).model_dump(exclude={"destination"}),
        "outcome": "completed",
    }
    assert settle.at >= ended[0]
    renewed = len(callback_api.renews)
    await asyncio.sleep(DEFERRED_LEASE / 3 + 0.15)
    assert len(callback_api.renews) == renewed, "renewals stop once settled"


@pytest.mark.parametrize(
    ("error", "outcome", "text"),
    [
        (None, "completed", None),
        (RuntimeError("late"), "failed", "RuntimeError: late"),
        (RuntimeError("x\x00" * 3_000), "failed", "RuntimeError: " + "x" * 1_986),
        (Terminal("never"), "exhausted", "Terminal: never"),
    ],
)
async def test_a_deferred_attempt_is_settled_when_its_handler_ends(
    callback_api: CallbackApi,
    deferring: Callable[..., Intake],
    error: Exception | None,
    outcome: str,
    text: str | None,
) -> None:
    async def run(_forwarded: Forwarded, _attempt: IntakeAttempt | None) -> None:
        await asyncio.sleep(DEFER_AFTER * 3)
        if error is not None:
            raise error

    answer = await deferring().handle(*request_for(message_update(21)), run)
    assert answer.status == 202
    await until(lambda: bool(callback_api.settles), "the settle")
    (settle,) = callback_api.settles
    expected: dict[str, Any] = {
        **identity_of(21).model_dump(exclude={"destination"}),
        "outcome": outcome,
    }
    if text is not None:
        expected["error"] = text
    assert settle.body == expected
    assert settle.authorization == f"Bearer {API_KEY}"


async def test_a_deferred_failure_with_an_undecodable_message_is_still_settled(
    callback_api: CallbackApi, deferring: Callable[..., Intake]
) -> None:
    """The same lone surrogate as in test_describe_gives_an_error_text_the_callback_api_takes:
    the SettleRequest refuses it (a pydantic ValidationError, which _settle does not catch),
    so the deferred attempt is never settled and waits for its lease to lapse."""

    async def run(_forwarded: Forwarded, _attempt: IntakeAttempt | None) -> None:
        await asyncio.sleep(DEFER_AFTER * 2)
        raise FileNotFoundError("no such file: b\udcffd.txt")

    intake = deferring()
    answer = await intake.handle(*request_for(message_update(22)), run)
    assert answer.status == 202
    await until(lambda: not intake._deferred, "the deferred attempt's end")
    assert [settle.body["outcome"] for settle in callback_api.settles] == ["failed"]


async def test_a_lost_claim_cancels_the_handler_and_settles_nothing(
    callback_api: CallbackApi, deferring: Callable[..., Intake]
) -> None:
    callback_api.renewed = False
    cancelled = asyncio.Event()

    async def run(_forwarded: Forwarded, _attempt: IntakeAttempt | None) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    intake = deferring()
    answer = await intake.handle(*request_for(message_update(23)), run)
    assert answer.status == 202
    await asyncio.wait_for(cancelled.wait(), 5)
    await until(lambda: not intake._deferred, "the deferred attempt's end")
    assert len(callback_api.renews) == 1
    assert callback_api.settles == []


async def test_a_settle_answered_503_is_retried(
    callback_api: CallbackApi, deferring: Callable[..., Intake]
) -> None:
    callback_api.settle_statuses = [503]
    intake = deferring()
    answer = await intake.handle(
        *request_for(message_update(24)), lambda *_: asyncio.sleep(DEFER_AFTER * 2)
    )
    assert answer.status == 202
    await until(lambda: not intake._deferred, "the deferred attempt's end")
    first, second = callback_api.settles
    assert (
        first.body
        == second.body
        == {**identity_of(24).model_dump(exclude={"destination"}), "outcome": "completed"}
    )
    assert second.at - first.at >= 0.45  # after a backoff of 0.5 s


@pytest.mark.parametrize("status", [409, 404])
async def test_a_settle_the_service_refuses_is_not_retried(
    callback_api: CallbackApi, deferring: Callable[..., Intake], status: int
) -> None:
    callback_api.settle_statuses = [status]
    intake = deferring()
    answer = await intake.handle(
        *request_for(message_update(25)), lambda *_: asyncio.sleep(DEFER_AFTER * 2)
    )
    assert answer.status == 202
    await until(lambda: not intake._deferred, "the deferred attempt's end")
    assert len(callback_api.settles) == 1


async def _deferred_and_running(
    intake: Intake, callback_api: CallbackApi, update_id: int
) -> asyncio.Event:
    """Defer an attempt whose handler runs until cancelled; the event says it was."""
    cancelled = asyncio.Event()

    async def run(_forwarded: Forwarded, _attempt: IntakeAttempt | None) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    answer = await intake.handle(*request_for(message_update(update_id)), run)
    assert answer.status == 202
    await until(lambda: bool(callback_api.renews), "the first renewal")
    return cancelled


async def test_aclose_cancels_a_deferred_handler_still_running(
    callback_api: CallbackApi, deferring: Callable[..., Intake]
) -> None:
    intake = deferring()
    cancelled = await _deferred_and_running(intake, callback_api, 26)
    started = time.monotonic()
    await intake.aclose()
    assert cancelled.is_set()
    assert not intake._deferred
    assert time.monotonic() - started < 1.0
    renewed = len(callback_api.renews)
    await asyncio.sleep(DEFERRED_LEASE / 3 + 0.1)
    assert len(callback_api.renews) == renewed


async def test_aclose_settles_nothing_for_a_deferred_handler_it_cancels(
    callback_api: CallbackApi, deferring: Callable[..., Intake]
) -> None:
    """aclose's docstring: the service redelivers such attempts once their lease lapses. But
    `_ended` takes the cancellation of `_finish` itself for the handlers' own end, so the
    cancelled `_finish` goes on to settle the attempt as failed ("CancelledError")."""
    intake = deferring()
    await _deferred_and_running(intake, callback_api, 27)
    await intake.aclose()
    assert [settle.body for settle in callback_api.settles] == []


@pytest.mark.parametrize("with_callback_api", [True, False], ids=["deferrable", "waited-for"])
async def test_a_cancelled_request_cancels_its_handlers_and_stays_cancelled(
    intakes: Callable[..., Intake], callback_api: CallbackApi, with_callback_api: bool
) -> None:
    """The server cancels the request (a client gone, a shutdown): the handlers go with it,
    and the cancellation reaches the caller rather than an answer. When the adapter can
    defer, `handle` re-raises it; when it only waits (no callback API, or a plain request),
    `_ended` swallows it and `handle` returns a 500 for "CancelledError"."""
    options = {"intake_url": callback_api.url, "api_key": API_KEY} if with_callback_api else {}
    intake = intakes(defer_after=5.0, **options)
    running, cancelled = asyncio.Event(), asyncio.Event()

    async def run(_forwarded: Forwarded, _attempt: IntakeAttempt | None) -> None:
        running.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    request = asyncio.create_task(intake.handle(*request_for(message_update(28)), run))
    await asyncio.wait_for(running.wait(), 5)
    request.cancel()
    outcome = (await asyncio.gather(request, return_exceptions=True))[0]
    await asyncio.wait_for(cancelled.wait(), 5)
    assert isinstance(outcome, asyncio.CancelledError), outcome
