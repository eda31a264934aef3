"""What every framework adapter does around the bot's own handlers (docs/kit.md).

A framework's webhook helper answers Telegram early (aiogram's in the background, python-
telegram-bot's once the update is queued), because to Telegram an answer is only a receipt.
Behind telegram-intake the answer is the verdict: 2xx completes the update, 5xx has it
retried, another 4xx keeps it as an exhaustion, 202 defers it to the callback API. So an
adapter answers only after the handlers have ended:

- the handlers returned: 200;
- they raised `Terminal`: 422, and the service keeps the update as an exhaustion;
- they raised anything else: 500, and the service retries;
- they still run after `defer_after` seconds: 202 at once (deferred); the adapter renews the
  lease while they run and settles the attempt through the callback API when they end.

The request is verified first (`read_forwarded`): a bad one gets 401 (or 400 for a body that
is no update) and runs nothing. Deferring needs the callback API (`intake_url`, `api_key`)
and an identity to settle with; without them the adapter waits for the handlers however long
they take, and the service's forward timeout decides.

The service's forward carries W3C `traceparent` when its tracing is on. Where the bot has
OpenTelemetry's API installed, the handlers run in the context it names (through the bot's
own propagators), so the spans they make are children of the forward's span, in the update's
trace; without the API, or without the header, nothing changes.

`Intake` is that logic without a framework: `telegram_intake_kit.aiogram` and
`telegram_intake_kit.ptb` give it their request and the call that runs the handlers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import ValidationError

from telegram_intake_kit.attempt import IntakeAttempt, Terminal, _current
from telegram_intake_kit.client import CallbackError, IntakeClient
from telegram_intake_kit.forwarded import Forwarded, Rejected, read_forwarded
from telegram_intake_kit.wire import MAX_ERROR_LENGTH, Identity, Outcome

log = logging.getLogger("telegram_intake_kit")

DEFAULT_DEFER_AFTER = 10.0
DEFAULT_DEFERRED_LEASE = 30.0
SETTLE_TRIES = 4

Handlers = Callable[[Forwarded, IntakeAttempt | None], Awaitable[None]]


@dataclass(frozen=True)
class Answer:
    """What the adapter answers the service."""

    status: int
    body: dict[str, Any] = field(default_factory=dict)


def verdict(error: BaseException | None) -> Answer:
    """The answer for handlers that ended with `error` (None: they returned)."""
    if error is None:
        return Answer(200)
    if isinstance(error, Terminal):
        return Answer(422, {"error": describe(error)})
    return Answer(500, {"error": describe(error)})


def describe(error: BaseException) -> str:
    """An error as the service stores it: its type and message, without NUL, within the
    callback API's length."""
    words = str(error)
    text = f"{type(error).__name__}: {words}" if words else type(error).__name__
    # A lone surrogate (a file name read with surrogateescape) is no text the API takes.
    text = text.encode("utf-8", "backslashreplace").decode()
    return text.replace("\x00", "")[:MAX_ERROR_LENGTH]


class Intake:
    """Verify a forwarded request, run the handlers, and answer (or defer) as the table in the
    module's docstring says. One per bot application; `aclose()` at shutdown."""

    def __init__(
        self,
        *,
        secret_token: str | None = None,
        signing_secret: str | None = None,
        intake_url: str | None = None,
        api_key: str | None = None,
        defer_after: float = DEFAULT_DEFER_AFTER,
        deferred_lease: float = DEFAULT_DEFERRED_LEASE,
    ) -> None:
        if secret_token is None and signing_secret is None:
            raise ValueError(
                "give secret_token or signing_secret: an unverified request proves nothing"
            )
        if (intake_url is None) != (api_key is None):
            raise ValueError("intake_url and api_key go together")
        if not defer_after > 0 or not deferred_lease >= 1:
            raise ValueError("defer_after must be above 0 s, deferred_lease at least 1 s")
        self.secret_token = secret_token
        self.signing_secret = signing_secret
        self.defer_after = defer_after
        self.deferred_lease = deferred_lease
        self.client = IntakeClient(intake_url, api_key) if intake_url and api_key else None
        self._deferred: set[asyncio.Task[None]] = set()

    def read(self, headers: Mapping[str, str], body: bytes) -> Forwarded | Answer:
        """The verified request, or the answer that refuses it."""
        try:
            return read_forwarded(
                headers, body, signing_secret=self.signing_secret, secret_token=self.secret_token
            )
        except Rejected as rejected:
            reason = str(rejected)
            status = 400 if reason.startswith("the body is") else 401
            return Answer(status, {"error": reason})

    def attempt(self, forwarded: Forwarded) -> IntakeAttempt | None:
        if forwarded.identity is None:
            return None
        return IntakeAttempt(
            forwarded.identity, forwarded.fence_token, forwarded.lease_expires_at, self.client
        )

    async def handle(self, headers: Mapping[str, str], body: bytes, run: Handlers) -> Answer:
        """The whole request: verify, run the handlers under the attempt, answer."""
        forwarded = self.read(headers, body)
        if isinstance(forwarded, Answer):
            return forwarded
        attempt = self.attempt(forwarded)
        parent = _trace_context(headers)
        task = asyncio.create_task(self._run(run, forwarded, attempt, parent))
        if self.client is None or attempt is None:
            return verdict(await _ended(task))
        try:
            done, _ = await asyncio.wait({task}, timeout=self.defer_after)
        except asyncio.CancelledError:
            task.cancel()  # the request itself was cancelled: the handlers go with it
            raise
        if not done:
            deferred = asyncio.create_task(self._finish(task, attempt.identity))
            self._deferred.add(deferred)
            deferred.add_done_callback(self._deferred.discard)
            return Answer(202, {"deferred": True})
        return verdict(await _ended(task))

    @staticmethod
    async def _run(
        run: Handlers, forwarded: Forwarded, attempt: IntakeAttempt | None, parent: Any
    ) -> None:
        # This task's own context: current_attempt() in the handlers, and the update's trace.
        _current.set(attempt)
        if parent is not None:
            from opentelemetry import context

            context.attach(parent)
        await run(forwarded, attempt)

    async def _finish(self, task: asyncio.Task[None], identity: Identity) -> None:
        """A deferred attempt: keep its lease while the handlers run, then settle it."""
        assert self.client is not None
        renewing = asyncio.create_task(self._renew(task, identity, self.client))
        try:
            error = await _ended(task)
        finally:
            renewing.cancel()  # and when this is cancelled (aclose): settle nothing
        lost = False
        with contextlib.suppress(asyncio.CancelledError):
            lost = await renewing
        if not lost:
            await self._settle(identity, self.client, error)

    async def _renew(
        self, task: asyncio.Task[None], identity: Identity, client: IntakeClient
    ) -> bool:
        """Renew now and every third of the lease until cancelled; True when the attempt
        turned out lost (its handlers are cancelled then: the service has reclaimed it)."""
        lease_ms = round(self.deferred_lease * 1000)
        while True:
            try:
                if not (await client.renew(identity, lease_ms)).renewed:
                    log.warning("deferred attempt %s lost its claim; cancelled", identity)
                    task.cancel()
                    return True
            except (CallbackError, httpx.HTTPError, ValidationError) as error:
                log.warning("could not renew deferred attempt %s: %s", identity, error)
            await asyncio.sleep(self.deferred_lease / 3)

    @staticmethod
    async def _settle(
        identity: Identity, client: IntakeClient, error: BaseException | None
    ) -> None:
        outcome: Outcome = "completed"
        if isinstance(error, Terminal):
            outcome = "exhausted"
        elif error is not None:
            outcome = "failed"
        reason = None if error is None else describe(error)
        for attempt in range(SETTLE_TRIES):
            try:
                settled = await client.settle(identity, outcome, error=reason)
            except (CallbackError, httpx.HTTPError) as failure:
                refused = isinstance(failure, CallbackError) and failure.status < 500
                if refused or attempt == SETTLE_TRIES - 1:
                    log.error("could not settle %s as %s: %s", identity, outcome, failure)
                    return
                await asyncio.sleep(0.5 * 2**attempt)
                continue
            if not settled.settled:
                log.warning("%s was no longer %s's to settle", identity, outcome)
            return

    async def aclose(self) -> None:
        """Cancel deferred handlers still running (the service redelivers them once their
        lease lapses) and close the callback client."""
        for task in list(self._deferred):
            task.cancel()
        await asyncio.gather(*self._deferred, return_exceptions=True)
        if self.client is not None:
            await self.client.aclose()


_TRACE_HEADERS = ("traceparent", "tracestate", "baggage")


def _trace_context(headers: Mapping[str, str]) -> Any:
    """The OpenTelemetry context the request's W3C headers name, read by the bot's own
    propagators; None without a `traceparent` or without OpenTelemetry's API."""
    if headers.get("traceparent") is None:
        return None
    try:
        from opentelemetry.propagate import extract
    except ImportError:
        return None
    carrier = {name: value for name in _TRACE_HEADERS if (value := headers.get(name)) is not None}
    return extract(carrier)


async def _ended(task: asyncio.Task[None]) -> BaseException | None:
    """Wait for the handlers; what they raised, or None. Cancelled itself (the request, a
    shutdown), it stays cancelled, and the handlers with it."""
    try:
        await task
    except Exception as error:
        return error
    except asyncio.CancelledError as cancelled:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
        return cancelled  # only the handlers were cancelled: their claim was lost
    return None
