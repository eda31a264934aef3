"""What one attempt sends, checked at the transport (httpx.MockTransport)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import httpx
import pytest
from pydantic import SecretStr
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from app.config import BotSettings
from app.dispatch.forward import Downstream
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
    # X-Intake-Received-At and the attempt are the fencing token of app.kit.fence; the
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
