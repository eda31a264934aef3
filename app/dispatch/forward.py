"""Forwarding one attempt to the bot's own handler (docs/contract.md section 6).

The body is the stored raw update, byte for byte. Headers carry the attempt's full identity
(`X-Intake-*`) and when the update was recorded (`X-Intake-Received-At`: with the attempt,
the fencing token of `telegram_intake_kit.fence`), the downstream secret under Telegram's own header
name (so an unmodified aiogram, python-telegram-bot, grammY or Telegraf webhook handler
accepts the request), and a Standard Webhooks signature when the bot has a `signing_secret`:
`webhook-signature` over the body, `X-Intake-Identity-Signature` over the identity and the
recording time. A `plain` bot forwards the bare update: no identity, as a table at revision
0001 has none.

`forward_timeout_seconds` bounds a whole attempt (docs/contract.md section 16): waiting for a
connection, connecting, sending, waiting and reading the answer, however slowly the downstream
trickles it; the transport's own timeouts bound each step only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import httpx
from standardwebhooks import Webhook

from app import tracing
from app.bot_settings import BotSettings
from app.dispatch.transport import AiohttpTransport
from app.policy import Outcome, classify, classify_answer, classify_error, wall_clock_ms
from app.store import ClaimIdentity
from telegram_intake_kit.forwarded import (
    DESTINATION_HEADER,
    IDENTITY_SIGNATURE_HEADER,
    RECEIVED_AT_HEADER,
    identity_message,
)
from telegram_intake_kit.wire import DEFAULT_DESTINATION

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer


class Downstream:
    """Where one destination of a bot gets its attempts (`default`: the bot's downstream_url),
    and how they are addressed and signed."""

    def __init__(
        self,
        bot: BotSettings,
        transport: httpx.AsyncBaseTransport,
        destination: str = DEFAULT_DESTINATION,
        *,
        now: Callable[[], int] = wall_clock_ms,
    ) -> None:
        """`now` (epoch ms): the clock the signatures' timestamps and an HTTP-date
        `Retry-After` read, the database's in a worker (`DatabaseClock.now`)."""
        self._now = now
        target = bot.target(destination)
        if target is None:
            lacking = "downstream_url" if destination == DEFAULT_DESTINATION else destination
            raise ValueError(f"bot {bot.name!r} has no {lacking}")
        self.name = bot.name
        self.destination = destination
        self.target = target
        self.options = options = target.options
        self._transport = transport
        self._url = httpx.URL(str(target.url))
        self.traced_address = traced_address(self._url)
        exhaustion_url = options.exhaustion_url
        self._exhaustion_url = None if exhaustion_url is None else httpx.URL(str(exhaustion_url))
        self.exhaustion_address = (
            None if self._exhaustion_url is None else traced_address(self._exhaustion_url)
        )
        # identity: httpx would inflate a compressed answer past the transport's size bound.
        self._plain_headers = {"content-type": "application/json", "accept-encoding": "identity"}
        self._headers = dict(self._plain_headers)
        if options.downstream_secret_token is not None:
            secret = options.downstream_secret_token.get_secret_value()
            self._headers["x-telegram-bot-api-secret-token"] = secret
        signing = options.signing_secret
        self._signer = None if signing is None else Webhook(signing.get_secret_value())
        self._timeout = httpx.Timeout(options.forward_timeout_seconds).as_dict()
        self._deadline = options.forward_timeout_seconds
        # The Standard Webhooks message id: the delivery's key (`default`'s is the update's).
        self._scope = "" if destination == DEFAULT_DESTINATION else f"{destination}:"

    async def forward(
        self,
        identity: ClaimIdentity,
        body: str,
        lease_until: int,
        *,
        received_at: int | None = None,
        traceparent: str | None = None,
    ) -> Outcome:
        """POST one attempt; what its answer means. Never raises for the downstream's sake.
        `received_at` is the recording's (the claimed row's); without it the request carries
        no fencing token. `traceparent` (tracing on): the forward's span, W3C's header, so
        that the bot's own spans join the update's trace."""
        headers = dict(self._headers)
        if traceparent is not None:
            headers["traceparent"] = traceparent
        fenced = self.options.mode != "plain"
        if fenced:
            headers["x-intake-bot"] = identity.bot
            headers["x-intake-update-id"] = str(identity.update_id)
            headers["x-intake-attempt"] = str(identity.attempt)
            headers["x-intake-claim-id"] = identity.claim_id
            headers[DESTINATION_HEADER] = identity.destination
            headers["x-intake-lease-expires-at"] = str(lease_until)
            if received_at is not None:
                headers[RECEIVED_AT_HEADER] = str(received_at)
        message_id = f"{identity.bot}:{self._scope}{identity.update_id}"
        timestamp = self._sign(headers, message_id, body)
        if fenced and received_at is not None and self._signer is not None:
            signed = identity_message(identity, received_at)
            headers[IDENTITY_SIGNATURE_HEADER] = self._signer.sign(signed, timestamp, "")
        return await self._post(self._url, headers, body)

    async def deliver_exhaustion(
        self, identity: ClaimIdentity, payload: str, *, traceparent: str | None = None
    ) -> Outcome:
        """POST an exhaustion record to `exhaustion_url`, keyed for idempotency by the
        identity of the attempt that ended the update (`traceparent`: as `forward`'s)."""
        if self._exhaustion_url is None:
            raise ValueError(f"bot {self.name!r}, {self.destination!r}: no exhaustion_url")
        key = (
            f"{identity.bot}:{self._scope}{identity.update_id}:{identity.attempt}:"
            f"{identity.claim_id}"
        )
        headers = {**self._plain_headers, "idempotency-key": key}
        if traceparent is not None:
            headers["traceparent"] = traceparent
        self._sign(headers, f"exhaustion:{key}", payload)
        return await self._post(self._exhaustion_url, headers, payload)

    def _sign(self, headers: dict[str, str], message_id: str, body: str) -> datetime:
        """Sign the message when the bot has a signing secret; the timestamp either way."""
        return sign(self._signer, headers, message_id, body, self._now())

    async def _post(self, url: httpx.URL, headers: dict[str, str], body: str) -> Outcome:
        return await post(
            self._transport,
            url,
            headers,
            body,
            self._timeout,
            deadline=self._deadline,
            now=self._now,
        )


def traced_address(url: httpx.URL) -> dict[str, str | int]:
    """Where a span may say a request goes: scheme, host and port only. Bots often keep a
    token in the path (aiogram's examples do), or in the query or the user part."""
    return {
        "url.scheme": url.scheme,
        "server.address": url.host,
        "server.port": url.port or (443 if url.scheme == "https" else 80),
    }


def in_client_span(
    tracer: Tracer | None,
    address: Mapping[str, str | int],
    send: Callable[[str | None], Awaitable[Outcome]],
) -> Awaitable[Outcome]:
    """`send(traceparent)`, a POST to `address`: with tracing on, in a CLIENT span "POST"
    (the HTTP conventions' attributes) whose own `traceparent` it is given to send, so the
    receiver's spans are its children; off, `send(None)` itself."""
    if tracer is None:
        return send(None)
    return _in_client_span(tracer, address, send)


async def _in_client_span(
    tracer: Tracer,
    address: Mapping[str, str | int],
    send: Callable[[str | None], Awaitable[Outcome]],
) -> Outcome:
    from opentelemetry.trace import SpanKind, StatusCode

    attributes = {"http.request.method": "POST", **address}
    with tracer.start_as_current_span("POST", kind=SpanKind.CLIENT, attributes=attributes) as span:
        outcome = await send(tracing.traceparent(span))
        if outcome.status is not None:
            span.set_attribute("http.response.status_code", outcome.status)
        if outcome.downstream_failed:
            span.set_attribute("error.type", str(outcome.status or outcome.kind))
            span.set_status(StatusCode.ERROR)
        return outcome


def sign(
    signer: Webhook | None, headers: dict[str, str], message_id: str, body: str, now: int
) -> datetime:
    """Add the Standard Webhooks headers of `body` (as `message_id`) when there is a signer,
    timestamped `now` (epoch ms: the database's clock, which a receiver's tolerance of five
    minutes judges against its own); the timestamp either way."""
    timestamp = datetime.fromtimestamp(now / 1000, tz=UTC)
    if signer is not None:
        headers["webhook-id"] = message_id
        headers["webhook-timestamp"] = str(int(timestamp.timestamp()))
        headers["webhook-signature"] = signer.sign(message_id, timestamp, body)
    return timestamp


async def post(
    transport: httpx.AsyncBaseTransport,
    url: httpx.URL,
    headers: dict[str, str],
    body: str,
    limits: dict[str, float | None],
    *,
    deadline: float | None = None,
    now: Callable[[], int] = wall_clock_ms,
) -> Outcome:
    """POST `body` within `limits` (httpx's timeouts, as a dict: each step's) and within
    `deadline` seconds in all (None: the longest of `limits`); what the answer means
    (`app.policy`, an HTTP-date `Retry-After` read against `now`, epoch ms). Never raises
    for the receiver's sake: a failure is an Outcome too, and a passed deadline is a
    timeout."""
    if deadline is None:
        deadline = max((limit for limit in limits.values() if limit is not None), default=None)
    # The transport's timeouts bound each socket read: a downstream sending a byte a second
    # would hold an attempt for ever. One timer on the loop (no task) cancels the request,
    # body read included, when the whole attempt has had its time; the transport drops the
    # connection of a request cancelled midway.
    whole = asyncio.timeout(deadline)
    try:
        async with whole:
            if isinstance(transport, AiohttpTransport):
                # The service's own transport, asked directly: httpx's Request and Response
                # around it took as long as aiohttp's request itself (bench client).
                status, raw, content, _ = await transport.send(
                    "POST", url, headers.items(), body.encode(), limits
                )
                retry = next((v for n, v in raw if n.lower() == b"retry-after"), None)
                retry_after = None if retry is None else retry.decode()
                return classify_answer(status, retry_after, content, now)
            return await _post_through(transport, url, headers, body, limits, now)
    except httpx.HTTPError as error:
        return classify_error(error)
    except TimeoutError:
        if not whole.expired():
            raise
        passed = f"the attempt's deadline passed: no whole answer within {deadline:g} s"
        return classify_error(httpx.TimeoutException(passed))


async def _post_through(
    transport: httpx.AsyncBaseTransport,
    url: httpx.URL,
    headers: dict[str, str],
    body: str,
    limits: dict[str, float | None],
    now: Callable[[], int],
) -> Outcome:
    """Any other httpx transport (a test's `MockTransport`), through httpx's Request and
    Response: AsyncClient's machinery (auth, redirects, cookies, hooks) is all unused here."""
    request = httpx.Request(
        "POST", url, headers=headers, content=body.encode(), extensions={"timeout": limits}
    )
    response = await transport.handle_async_request(request)
    try:
        if not 200 <= response.status_code < 300:  # the body only explains a failure
            await response.aread()
    finally:
        await response.aclose()
    return classify(response, now)


def open_transport(max_connections: int) -> httpx.AsyncBaseTransport:
    """What forwards: httpx's transport interface over aiohttp (`AiohttpTransport`), since
    httpx's own transport caps a process at a few hundred requests/s under concurrency
    (encode/httpx#3215). It follows no redirects and keeps no cookies."""
    return AiohttpTransport(max_connections=max_connections)
