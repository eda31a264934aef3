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
for the commit (`app.metrics`).
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request, Response
from starlette.requests import ClientDisconnect

from app.config import Settings
from app.http.failures import Failure, logged
from app.http.guard import unsupported_encoding
from app.http.sources import client_address, source_allowed
from app.http.strict_json import NotJson, read_json
from app.intake.committer import CommitFailed, GroupCommitter
from app.intake.updates import classify
from app.metric_labels import UNKNOWN_BOT, IntakeResult
from app.metrics import IntakeMeters, Metrics
from app.store import NewUpdate
from app.store.validate import MAX_BIGINT

log = logging.getLogger(__name__)
SECRET_HEADER = "x-telegram-bot-api-secret-token"  # noqa: S105 - a header name
JSON = "application/json"
OK = Response(b'{"ok":true}', 200, media_type=JSON)
FORBIDDEN = Response(b'{"error":"forbidden"}', 403, media_type=JSON)
NOT_RECORDED = "the update could not be recorded; Telegram will deliver it again"


def _error(status: int, message: str) -> Response:
    body = json.dumps({"error": message}).encode()
    return Response(body, status, media_type=JSON)


class Intake:
    """The webhook intake for the configured bots."""

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
        # Compared against for unknown bots, so they take as long as wrong secrets.
        self._decoy = b"\0" * 32
        metrics = metrics or Metrics.of(settings)
        self._meters = {bot.name: metrics.intake(bot.name) for bot in settings.bots}
        self._unknown: IntakeMeters = metrics.intake(UNKNOWN_BOT)
        self._too_large = _error(413, f"body over {settings.max_body_bytes} bytes")
        self._encoded = _error(415, "no Content-Encoding is accepted: send the JSON as it is")

    async def receive(self, bot: str, request: Request) -> Response:
        started = time.perf_counter()
        meters = self._meters.get(bot, self._unknown)
        result, response = await self._receive(bot, request, meters)
        meters.answered(result, time.perf_counter() - started)
        return response

    async def _receive(
        self, bot: str, request: Request, meters: IntakeMeters
    ) -> tuple[IntakeResult, Response]:
        received_at = self._now()
        expected = self._secrets.get(bot)
        given = request.headers.get(SECRET_HEADER, "").encode()
        secret_ok = hmac.compare_digest(given, expected or self._decoy)
        if expected is None or not secret_ok:
            return "forbidden", FORBIDDEN
        settings = self._settings
        if settings.allowed_sources:
            peer = request.client.host if request.client else None
            # Every X-Forwarded-For line: some proxies add a line rather than append to one.
            forwarded = ",".join(request.headers.getlist("x-forwarded-for"))
            source = client_address(peer, forwarded, settings.trusted_proxies)
            if not source_allowed(source, settings.allowed_sources):
                return "source_refused", FORBIDDEN
        if unsupported_encoding(request.headers.get("content-encoding")):
            return "encoded", self._encoded
        try:
            body = await self._read_body(request)
        except ClientDisconnect:
            return "disconnected", _error(400, "the client went away before the body was read")
        if body is None:
            return "too_large", self._too_large
        text, update, problem = _parse(body)
        if update is None:
            return "invalid", _error(400, problem)
        update_type, queue_key = classify(update)
        row = NewUpdate(bot, update["update_id"], text, received_at, update_type, queue_key)
        # While it waits for the commit, a request holds its row's text and nothing more.
        del body, update
        arrived = time.perf_counter()
        try:
            new = await self._committer.submit(row)
        except CommitFailed as error:
            return "unavailable", self._not_recorded(row, error)
        finally:
            meters.commit_wait.observe(time.perf_counter() - arrived)
        if log.isEnabledFor(logging.DEBUG):
            state = "recorded" if new else "a duplicate, already recorded"
            log.debug("%s:%d: %s (%s, queue %s)", bot, row.update_id, state, update_type, queue_key)
        return ("accepted" if new else "duplicate"), OK

    def _not_recorded(self, row: NewUpdate, error: CommitFailed) -> Response:
        """503 + Retry-After: a request id for the client, the reason in the log under it (an
        id is drawn only here, never for an update recorded)."""
        request_id = logged(f"POST /telegram/{row.bot}, update {row.update_id}", error)
        failure = Failure(503, NOT_RECORDED, request_id, self._settings.retry_after_seconds)
        body = json.dumps(failure.body).encode()
        return Response(body, 503, headers=failure.headers, media_type=JSON)

    async def _read_body(self, request: Request) -> bytes | None:
        """The body, or None when it is over the limit (declared or as it streams in)."""
        limit = self._settings.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return None
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
        return b"".join(chunks)


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
    intake: Intake = request.app.state.intake
    return await intake.receive(bot, request)
