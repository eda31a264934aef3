"""What one attempt sends, checked at the transport (httpx.MockTransport); how long one may
take, against real servers on 127.0.0.1 that answer a byte at a time."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Literal

import httpx
import pytest
from pydantic import SecretStr
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from app.bot_settings import BotSettings
from app.dispatch.forward import Downstream, open_transport
from app.dispatch.maintenance import exhaustion_payload
from app.store import ClaimIdentity, Exhaustion

SIGNING = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
IDENTITY = ClaimIdentity("shop", 12, 3, "2b0f6f0e-claim")
BODY = '{"update_id": 12, "message": {"text": "h\\u00e9llo"}}'


def downstream(**options: object) -> tuple[Downstream, list[httpx.Request]]:
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200)

    bot = BotSettings(
        name="shop",
        secret_token=SecretStr("s"),
        downstream_url="http://bot.internal/hook",  # type: ignore[arg-type]
        **options,  # type: ignore[arg-type]
    )
    return Downstream(bot, httpx.MockTransport(handler)), sent


async def test_forward_sends_the_identity_and_the_downstream_secret() -> None:
    target, sent = downstream(downstream_secret_token=SecretStr("behind-the-intake"))
    outcome = await target.forward(IDENTITY, BODY, lease_until=1_700_000_060_000)
    assert outcome.kind == "completed"
    (request,) = sent
    assert request.method == "POST"
    assert str(request.url) == "http://bot.internal/hook"
    assert request.content == BODY.encode()
    assert request.headers["content-type"] == "application/json"
    assert request.headers["x-telegram-bot-api-secret-token"] == "behind-the-intake"
    assert request.headers["x-intake-bot"] == "shop"
    assert request.headers["x-intake-update-id"] == "12"
    assert request.headers["x-intake-attempt"] == "3"
    assert request.headers["x-intake-claim-id"] == "2b0f6f0e-claim"
    assert request.headers["x-intake-lease-expires-at"] == "1700000060000"
    assert "webhook-signature" not in request.headers  # no signing secret, no signature


async def test_forward_signs_with_standard_webhooks() -> None:
    target, sent = downstream(signing_secret=SecretStr(SIGNING))
    await target.forward(IDENTITY, BODY, lease_until=0)
    (request,) = sent
    assert request.headers["webhook-id"] == "shop:12"  # the same on every attempt
    headers = dict(request.headers)
    Webhook(SIGNING).verify(request.content, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(SIGNING).verify(request.content.replace(b"12", b"13"), headers)


async def test_forward_sends_the_recording_time_signed_with_the_identity() -> None:
    # X-Intake-Received-At and the attempt are the fencing token of telegram_intake_kit.fence; the
    # identity signature covers both, at the same webhook-timestamp as the body's signature.
    target, sent = downstream(signing_secret=SecretStr(SIGNING))
    await target.forward(IDENTITY, BODY, lease_until=0, received_at=1_700_000_000_123)
    (request,) = sent
    assert request.headers["x-intake-received-at"] == "1700000000123"
    at = datetime.fromtimestamp(int(request.headers["webhook-timestamp"]), tz=UTC)
    signed = "identity:shop:12:3:1700000000123:2b0f6f0e-claim"
    assert request.headers["x-intake-identity-signature"] == Webhook(SIGNING).sign(signed, at, "")
    unsigned, sent = downstream()
    await unsigned.forward(IDENTITY, BODY, lease_until=0, received_at=1_700_000_000_123)
    (request,) = sent
    assert request.headers["x-intake-received-at"] == "1700000000123"
    assert "x-intake-identity-signature" not in request.headers  # no signing secret


async def test_a_plain_bot_forwards_the_bare_update() -> None:
    target, sent = downstream(mode="plain", signing_secret=SecretStr(SIGNING))
    await target.forward(IDENTITY, BODY, lease_until=0, received_at=1_700_000_000_123)
    (request,) = sent
    assert not [name for name in request.headers if name.startswith("x-intake-")]
    assert "x-telegram-bot-api-secret-token" not in request.headers


async def test_an_exhaustion_record_carries_the_identity_and_the_update_verbatim() -> None:
    target, sent = downstream(
        exhaustion_url="http://bot.internal/exhausted", signing_secret=SecretStr(SIGNING)
    )
    exhaustion = Exhaustion(IDENTITY, BODY, "HTTP 404: gone", exhausted_at=1_700_000_000_000)
    payload = exhaustion_payload(exhaustion)
    outcome = await target.deliver_exhaustion(IDENTITY, payload)
    assert outcome.kind == "completed"
    (request,) = sent
    assert str(request.url) == "http://bot.internal/exhausted"
    assert request.headers["idempotency-key"] == "shop:12:3:2b0f6f0e-claim"
    record = json.loads(request.content)
    assert record == {
        "bot": "shop",
        "update_id": 12,
        "attempt": 3,
        "claim_id": "2b0f6f0e-claim",
        "error": "HTTP 404: gone",
        "exhausted_at": 1_700_000_000_000,
        "update": json.loads(BODY),
    }
    assert BODY.encode() in request.content  # verbatim, not re-serialised
    Webhook(SIGNING).verify(request.content, dict(request.headers))


async def test_a_transport_error_is_an_outcome_not_an_exception() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    bot = BotSettings(
        name="shop",
        secret_token=SecretStr("s"),
        downstream_url="http://bot.internal/hook",  # type: ignore[arg-type]
    )
    target = Downstream(bot, httpx.MockTransport(refuse))
    outcome = await target.forward(IDENTITY, BODY, lease_until=0)
    assert outcome.kind == "retry"
    assert outcome.error is not None
    assert "connection refused" in outcome.error


def test_a_bot_without_a_downstream_cannot_be_forwarded_to() -> None:
    bot = BotSettings(name="shop", secret_token=SecretStr("s"))
    with pytest.raises(ValueError, match="no downstream_url"):
        Downstream(bot, httpx.MockTransport(lambda request: httpx.Response(200)))


TRICKLE_BYTES = 20
TRICKLE_SECONDS = 0.3  # a byte at a time: every read is quick, the answer takes 6 s


@asynccontextmanager
async def trickling(where: Literal["head", "body"]) -> AsyncIterator[str]:
    """A downstream on 127.0.0.1 that answers 200 one byte every TRICKLE_SECONDS, in a header
    or in the body; its base URL."""
    answering: set[asyncio.Task[object]] = set()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        answering.add(task)
        try:
            await reader.readuntil(b"\r\n\r\n")
            if where == "head":
                writer.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                tail = b"\r\nContent-Length: 0\r\n\r\n"
            else:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % TRICKLE_BYTES)
                tail = b""
            for _ in range(TRICKLE_BYTES):
                await writer.drain()
                await asyncio.sleep(TRICKLE_SECONDS)
                writer.write(b"x")
            writer.write(tail)
            await writer.drain()
        except ConnectionError:
            pass  # the client gave up: what the deadline is for
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        for task in answering:
            task.cancel()
        await asyncio.gather(*answering, return_exceptions=True)
        await server.wait_closed()


@pytest.mark.parametrize("where", ["head", "body"])
@pytest.mark.parametrize("delivery", ["forward", "exhaustion"])
async def test_a_trickling_answer_ends_the_attempt_at_its_deadline(
    where: Literal["head", "body"], delivery: str
) -> None:
    # forward_timeout_seconds bounds the whole attempt (docs/contract.md section 16), not each read.
    async with trickling(where) as url:
        bot = BotSettings(
            name="shop",
            secret_token=SecretStr("s"),
            downstream_url=f"{url}/hook",  # type: ignore[arg-type]
            exhaustion_url=f"{url}/exhausted",  # type: ignore[arg-type]
            forward_timeout_seconds=1,
        )
        transport = open_transport(max_connections=10)
        try:
            target = Downstream(bot, transport)
            started = time.monotonic()
            if delivery == "forward":
                outcome = await target.forward(IDENTITY, BODY, lease_until=0)
            else:
                outcome = await target.deliver_exhaustion(IDENTITY, "{}")
            took = time.monotonic() - started
        finally:
            await transport.aclose()
    assert outcome.kind == "retry"  # as any timeout: retried with backoff
    assert outcome.downstream_failed
    assert outcome.error is not None
    assert outcome.error.startswith("timeout: ")
    assert "the attempt's deadline passed" in outcome.error
    assert took < 2.5  # the 1 s deadline and a generous slack; the answer takes 6 s


# The database's clock ten minutes behind this host's (issue 49: hosts whose clocks disagree).
SKEWED_MS = time.time_ns() // 1_000_000 - 600_000


def _bot() -> BotSettings:
    return BotSettings(
        name="shop",
        secret_token=SecretStr("s"),
        downstream_url="http://bot.internal/hook",  # type: ignore[arg-type]
        signing_secret=SecretStr(SIGNING),
    )


async def test_signatures_are_timestamped_by_the_database_s_clock_not_the_host_s() -> None:
    # A receiver checks the timestamp against its own clock (Standard Webhooks: five minutes
    # either way); the host's clock ten minutes off made every signature fail that check.
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200)

    target = Downstream(_bot(), httpx.MockTransport(handler), now=lambda: SKEWED_MS)
    await target.forward(IDENTITY, BODY, lease_until=SKEWED_MS + 60_000)
    (request,) = sent
    assert request.headers["webhook-timestamp"] == str(SKEWED_MS // 1000)
    signed_at = datetime.fromtimestamp(SKEWED_MS // 1000, tz=UTC)
    expected = Webhook(SIGNING).sign(request.headers["webhook-id"], signed_at, BODY)
    assert request.headers["webhook-signature"] == expected


async def test_an_http_date_retry_after_counts_from_the_database_s_clock() -> None:
    # "Come back at T" with T twenty seconds after the database's now: by this host's clock,
    # ten minutes ahead, T had long passed (a wait of 0); by the database's it is 20 s away.
    at = datetime.fromtimestamp(SKEWED_MS / 1000 + 20, tz=UTC)
    header = at.strftime("%a, %d %b %Y %H:%M:%S GMT")

    def busy(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, headers={"retry-after": header})

    target = Downstream(_bot(), httpx.MockTransport(busy), now=lambda: SKEWED_MS)
    outcome = await target.forward(IDENTITY, BODY, lease_until=SKEWED_MS + 60_000)
    assert outcome.kind == "retry"
    assert outcome.retry_after is not None
    assert 19 <= outcome.retry_after <= 21, outcome.retry_after
    on_the_host = await Downstream(_bot(), httpx.MockTransport(busy)).forward(
        IDENTITY, BODY, lease_until=SKEWED_MS + 60_000
    )
    assert on_the_host.retry_after == 0.0  # the control: the host's clock reads it as passed
