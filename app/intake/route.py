"""POST /telegram/{bot}: the one route Telegram calls.

Checks run in this order, and nothing invalid is ever stored:
1. unknown bot, or a missing or wrong `X-Telegram-Bot-Api-Secret-Token` -> 403, the same for
   both, decided before the body is read, the secret compared in constant time;
2. a source outside the allowlist -> 403;
3. a `Content-Encoding` (nothing here decodes one) -> 415;
4. a body over `max_body_bytes` (declared or streamed) -> 413;
5. not strict JSON (`app.http.strict_json`: UTF-8, no duplicate names, no lone surrogate, no
   number beyond a double), not an object, or no integer `update_id` in [0, 2**63-1] -> 400;
6. otherwise the row is recorded (group commit) and 200 is sent after the commit; a
   duplicate is 200 too and changes nothing; no commit confirmed in time -> 503 + Retry-After,
   in fixed words with a request id (`app.http.failures`), the reason in the log under it.

Each answer is counted by bot and result, with its latency and, for a valid update, its wait
for the commit (`app.metrics`). With tracing on (`app.tracing`), each request past the secret
is a server span, the update's trace begins there, and its `traceparent` is kept with the row
(revision 0007) for the attempts to join; a 403 and a duplicate (its update's trace began with
the first delivery) end no span, so none is exported.

The webhook takes one request per update Telegram sends, so it is answered on a lean path, as
the callbacks are (`app.api.lean`): `Intake` is an ASGI application of its own, reading the
scope and answering through `send`, and the service's app (`app.http.front.Service`) hands it
every `POST /telegram/{bot}` ahead of FastAPI's middleware and router, which cost three times
the intake's own work. A request the front does not take (another method, a path the route
does not match) goes through FastAPI as any other, whose route for the webhook answers by the
same `Intake`: one way to answer, whichever way in (tests/intake/test_lean.py holds the two
ways to the same answers). The refusal of a head with two secrets or two encodings is the
request guard's own (`app.http.guard.read_head`).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request, Response
from starlette.types import Message, Receive, Scope, Send

from app import tracing
from app.config import Settings
from app.destinations.routing import Router
from app.http.failures import Failure, failure_of, logged
from app.http.guard import WEBHOOK_PREFIX, read_head, refuse, unsupported_encoding
from app.http.sources import client_address, source_allowed
from app.http.strict_json import NotJson, read_json
from app.intake.committer import CommitFailed, GroupCommitter
from app.intake.updates import classify
from app.metric_labels import UNKNOWN_BOT, IntakeResult
from app.metrics import IntakeMeters, Metrics
from app.privacy.subjects import subjects_of
from app.store import NewUpdate
from app.store.storage import failure_level
from app.store.types import DEFAULT_DESTINATION
from app.store.validate import MAX_BIGINT

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger(__name__)
SECRET_HEADER = b"x-telegram-bot-api-secret-token"
NOT_RECORDED = "the update could not be recorded; Telegram will deliver it again"
Headers = list[tuple[bytes, bytes]]


class Answer:
    """A whole answer, sent as Starlette's `Response(body, status, media_type=JSON)` sends it:
    the given headers, then `content-length` and `content-type`."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, body: bytes, headers: Headers | None = None) -> None:
        self.status = status
        self.body = body
        self.headers = [
            *(headers or ()),
            (b"content-length", b"%d" % len(body)),
            (b"content-type", b"application/json"),
        ]

    @classmethod
    def error(cls, status: int, message: str) -> Answer:
        return cls(status, json.dumps({"error": message}).encode())

    async def send(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        await send({"type": "http.response.body", "body": self.body})


OK = Answer(200, b'{"ok":true}')
# Requests whose span is never ended: no trace is made for them (docs/contract.md section 15).
_UNTRACED: frozenset[IntakeResult] = frozenset({"forbidden", "source_refused", "duplicate"})
FORBIDDEN = Answer(403, b'{"error":"forbidden"}')
DISCONNECTED = Answer.error(400, "the client went away before the body was read")


class Intake:
    """The webhook intake for the configured bots: an ASGI application answering
    `POST /telegram/{bot}`, the bot read from the path."""

    def __init__(
        self,
        settings: Settings,
        committer: GroupCommitter,
        clock: Callable[[], int] | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self._settings = settings
        self._committer = committer
        # Epoch ms for received_at: the database's clock when the process has one, so that
        # rows from every intake host fall due by the same clock as the leases.
        self._now = clock or (lambda: time.time_ns() // 1_000_000)
        self._secrets = {
            bot.name: bot.secret_token.get_secret_value().encode() for bot in settings.bots
        }
        # Where each bot's updates go, decided before they are recorded (docs/destinations.md).
        self._routers = {bot.name: Router(bot.targets) for bot in settings.bots}
        # Compared against for unknown bots, so they take as long as wrong secrets.
        self._decoy = b"\0" * 32
        metrics = metrics or Metrics.of(settings)
        self._meters = {bot.name: metrics.intake(bot.name) for bot in settings.bots}
        self._tally = metrics.tally
        self._unknown: IntakeMeters = metrics.intake(UNKNOWN_BOT)
        self._refused = metrics.request_refused
        self._limit = settings.max_body_bytes
        self._too_large = Answer.error(413, f"body over {settings.max_body_bytes} bytes")
        self._encoded = Answer.error(415, "no Content-Encoding is accepted: send the JSON as it is")
        self._tracer = tracing.tracer()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.answer(scope["path"][len(WEBHOOK_PREFIX) :], scope, receive, send)

    async def answer(self, bot: str, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer one webhook request for `bot`."""
        started = time.perf_counter()
        # The commit budget runs from here, the head's arrival: a body that streams in slowly
        # spends it too (docs/contract.md: "within INTAKE_COMMIT_TIMEOUT_MS of the request's
        # arrival").
        arrival = asyncio.get_running_loop().time()
        head = read_head(scope["headers"])
        if isinstance(head, str):
            self._refused("duplicate_header")
            await refuse(send, 400, head)
            return
        meters = self._meters.get(bot, self._unknown)
        span = token = None
        if self._tracer is not None:
            span = self._request_span(self._tracer, bot, scope, arrival)
            token = tracing.make_current(span)  # while it is answered: its ids on log lines
        try:
            try:
                result, answer = await self._receive(
                    bot, scope, head, receive, meters, arrival, span
                )
            except Exception as error:  # nothing expected: a 500 in fixed words, as on /v1
                failure = failure_of(error, f"POST {scope['path']}")
                result, answer = "failed", _failed(failure)
            meters.answered(result, time.perf_counter() - started)
            await answer.send(send)
        finally:
            if token is not None:
                tracing.release(token)
        if span is not None and result not in _UNTRACED:  # never ended: never exported
            _end_request_span(span, result, answer)

    @staticmethod
    def _request_span(tracer: Tracer, bot: str, scope: Scope, arrival: float) -> Span:
        """The request's server span, from the head's arrival; ended (and so exported) by
        `_end_request_span` unless the request was refused for its secret or its source, or
        brought a duplicate."""
        from opentelemetry.trace import SpanKind

        return tracer.start_span(
            "POST /telegram/{bot}",
            kind=SpanKind.SERVER,
            # The head's arrival, on the wall clock (spans are timed in epoch nanoseconds).
            start_time=time.time_ns() - int((asyncio.get_running_loop().time() - arrival) * 1e9),
            attributes={
                "http.request.method": "POST",
                "http.route": "/telegram/{bot}",
                "url.path": scope["path"],
                "url.scheme": scope.get("scheme", "http"),
                tracing.BOT: bot,
            },
        )

    async def _receive(
        self,
        bot: str,
        scope: Scope,
        head: dict[bytes, bytes],
        receive: Receive,
        meters: IntakeMeters,
        arrival: float,
        span: Span | None = None,
    ) -> tuple[IntakeResult, Answer]:
        received_at = self._now()
        expected = self._secrets.get(bot)
        given = head.get(SECRET_HEADER, b"")
        secret_ok = hmac.compare_digest(given, expected or self._decoy)
        if expected is None or not secret_ok:
            return "forbidden", FORBIDDEN
        settings = self._settings
        if settings.allowed_sources:
            client = scope.get("client")
            # Every X-Forwarded-For line: some proxies add a line rather than append to one.
            forwarded = ",".join(
                value.decode("latin-1")
                for name, value in scope["headers"]
                if name == b"x-forwarded-for"
            )
            peer = client[0] if client else None
            source = client_address(peer, forwarded, settings.trusted_proxies)
            if not source_allowed(source, settings.allowed_sources):
                return "source_refused", FORBIDDEN
        if unsupported_encoding(head.get(b"content-encoding")):
            return "encoded", self._encoded
        declared = head.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._limit:
            return "too_large", self._too_large
        body = await self._read_body(receive)
        if body is None:
            return "too_large", self._too_large
        if isinstance(body, Answer):
            return "disconnected", body
        text, update, problem = _parse(body)
        if update is None:
            return "invalid", Answer.error(400, problem)
        update_type, queue_key = classify(update)
        subjects = subjects_of(update)
        trace_context = None
        if span is not None:
            span.set_attribute(tracing.UPDATE_ID, update["update_id"])
            trace_context = tracing.traceparent(span)
        row = NewUpdate(
            bot,
            update["update_id"],
            text,
            received_at,
            update_type,
            queue_key,
            trace_context,
            subjects,
            self._routers[bot].routes(update_type, update),
        )
        # While it waits for the commit, a request holds its row's text and nothing more.
        del body, update
        arrived = time.perf_counter()
        try:
            new = await self._committer.submit(row, arrival=arrival)
        except CommitFailed as error:
            return "unavailable", self._not_recorded(row, error)
        finally:
            meters.commit_wait.observe(time.perf_counter() - arrived)
        if new:
            self._tally.received(bot, _destinations(row), row.received_at)
        if log.isEnabledFor(logging.DEBUG):
            state = "recorded" if new else "a duplicate, already recorded"
            log.debug("%s:%d: %s (%s)", bot, row.update_id, state, update_type)
        return ("accepted" if new else "duplicate"), OK

    def _not_recorded(self, row: NewUpdate, error: CommitFailed) -> Answer:
        """503 + Retry-After: a request id for the client, the reason in the log under it (an
        id is drawn only here, never for an update recorded)."""
        where = f"POST /telegram/{row.bot}, update {row.update_id}"
        request_id = logged(where, error, level=failure_level(error.__cause__))
        return _failed(Failure(503, NOT_RECORDED, request_id, self._settings.retry_after_seconds))

    async def _read_body(self, receive: Receive) -> bytes | Answer | None:
        """The body; None when it is over the limit as it streams in; DISCONNECTED when the
        client went away first. Read as Starlette's `Request.stream` reads it."""
        limit = self._limit
        chunks: list[bytes] = []
        size = 0
        while True:
            message: Message = await receive()
            kind = message["type"]
            if kind == "http.disconnect":
                return DISCONNECTED
            if kind != "http.request":
                continue
            chunk: bytes = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return None
            if not message.get("more_body", False):
                if not chunks:
                    return chunk
                chunks.append(chunk)
                return b"".join(chunks)
            chunks.append(chunk)


def _end_request_span(span: Span, result: IntakeResult, answer: Answer) -> None:
    from opentelemetry.trace import StatusCode

    span.set_attribute("http.response.status_code", answer.status)
    span.set_attribute(tracing.OUTCOME, result)
    if answer.status >= 500:
        span.set_status(StatusCode.ERROR)
    span.end()


def _failed(failure: Failure) -> Answer:
    # As Starlette encodes a Response's headers.
    items = failure.headers.items()
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in items]
    return Answer(failure.status, json.dumps(failure.body).encode(), headers)


def _parse(body: bytes) -> tuple[str, dict[str, Any] | None, str]:
    """The body as text and the update object; or None and what is wrong with it."""
    try:
        text, update = read_json(body)
    except NotJson as error:
        return "", None, str(error)
    if not isinstance(update, dict):
        return "", None, "body is not a JSON object"
    update_id = update.get("update_id")
    if type(update_id) is not int or not 0 <= update_id <= MAX_BIGINT:
        return "", None, "update_id must be an integer from 0 to 2**63-1"
    return text, update, ""


class _ByIntake(Response):
    """What the FastAPI route answers: a Response that, when Starlette sends it, lets the
    intake answer the request itself, body and all."""

    def __init__(self, intake: Intake, bot: str) -> None:  # no body of its own to render
        self.background = None
        self._intake = intake
        self._bot = bot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._intake.answer(self._bot, scope, receive, send)


router = APIRouter()


@router.post(
    "/telegram/{bot}",
    tags=["intake"],
    summary="Receive one update from Telegram",
    responses={
        200: {"description": "Recorded (or already recorded): committed before this answer"},
        400: {"description": "Not a Telegram update"},
        403: {"description": "Unknown bot, wrong secret token, or source not allowed"},
        413: {"description": "Body over max_body_bytes"},
        415: {"description": "A Content-Encoding: the body must come as it is"},
        503: {"description": "Not recorded; Telegram retries after Retry-After"},
    },
)
async def receive_update(bot: str, request: Request) -> Response:
    return _ByIntake(request.app.state.intake, bot)


def _destinations(row: NewUpdate) -> list[str]:
    """Where a recorded update goes: `default` when its row holds a delivery, and the others."""
    elsewhere = [route.destination for route in row.elsewhere]
    return [DEFAULT_DESTINATION, *elsewhere] if row.to_default else elsewhere
