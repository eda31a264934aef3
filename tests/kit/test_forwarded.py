"""read_forwarded and sign: what the service sends is accepted, anything else is Rejected.

Requests are signed by the `standardwebhooks` package (what the service signs with), not by
the kit's own `sign`, so the two implementations are checked against each other.
"""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx
import pytest
from pydantic import SecretStr
from standardwebhooks import Webhook
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app.bot_settings import BotSettings
from app.dispatch.forward import Downstream, open_transport
from app.dispatch.maintenance import exhaustion_payload
from app.store import ClaimIdentity, Exhaustion
from telegram_intake_kit import FenceToken, Forwarded, Identity, Rejected, read_forwarded, sign
from telegram_intake_kit.forwarded import identity_message
from tests.conftest import serve_asgi

SIGNING = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
OTHER_SIGNING = "whsec_QWxsIHRoZSBvdGhlciBzZWNyZXQgYnl0ZXM="
TOKEN = "behind-the-intake"
SENT_AT = datetime(2026, 12, 1, 12, 0, 7, tzinfo=UTC)
NOW = SENT_AT.timestamp()
IDENTITY = Identity(bot="shop", update_id=12, attempt=3, claim_id="2b0f6f0e-claim")
LEASE = 1_796_126_467_000
RECEIVED_AT = 1_796_126_400_123
IDENTITY_SIGNATURE = "x-intake-identity-signature"
BODY = '{"update_id": 12, "message": {"text": "h\\u00e9llo"}}'


def signed(
    body: str = BODY,
    *,
    identity: Identity | None = IDENTITY,
    message_id: str | None = None,
    secret: str = SIGNING,
    at: datetime = SENT_AT,
) -> dict[str, str]:
    """The headers of one forwarded attempt, as app/dispatch/forward.py sends them, signed by
    the standardwebhooks package. `identity=None` is a plain bot (no X-Intake-* headers)."""
    headers = {"content-type": "application/json", "x-telegram-bot-api-secret-token": TOKEN}
    if identity is not None:
        if identity.destination != "default":  # a service before destinations sends none
            headers["x-intake-destination"] = identity.destination
        headers["x-intake-bot"] = identity.bot
        headers["x-intake-update-id"] = str(identity.update_id)
        headers["x-intake-attempt"] = str(identity.attempt)
        headers["x-intake-claim-id"] = identity.claim_id
        headers["x-intake-lease-expires-at"] = str(LEASE)
        headers["x-intake-received-at"] = str(RECEIVED_AT)
        signed_identity = identity_message(identity, RECEIVED_AT)
        headers["x-intake-identity-signature"] = Webhook(secret).sign(signed_identity, at, "")
    if message_id is None:
        message_id = f"shop:{json.loads(body)['update_id']}" if identity is None else identity.key()
    headers["webhook-id"] = message_id
    headers["webhook-timestamp"] = str(int(at.timestamp()))
    headers["webhook-signature"] = Webhook(secret).sign(message_id, at, body)
    return headers


def read(headers: dict[str, str], body: str = BODY, **options: object) -> Forwarded:
    arguments: dict[str, object] = {"signing_secret": SIGNING, "now": NOW, **options}
    return read_forwarded(headers, body.encode(), **arguments)  # type: ignore[arg-type]


def test_read_forwarded_accepts_what_the_service_signs() -> None:
    forwarded = read(signed(), secret_token=TOKEN)
    assert forwarded.identity == IDENTITY
    assert forwarded.lease_expires_at == LEASE
    assert forwarded.received_at == RECEIVED_AT
    assert forwarded.fence_token == FenceToken(IDENTITY, RECEIVED_AT)
    assert forwarded.update == {"update_id": 12, "message": {"text": "héllo"}}
    assert forwarded.update_id == 12
    assert forwarded.body == BODY.encode()


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("x_intake_received_at", str(RECEIVED_AT + 1)),
        ("x_intake_attempt", "4"),
        ("x_intake_claim_id", "2b0f6f0e-claim:4"),
        ("x_intake_identity_signature", signed(secret=OTHER_SIGNING)[IDENTITY_SIGNATURE]),
    ],
    ids=["a later received_at", "another attempt", "another claim_id", "another secret"],
)
def test_read_forwarded_rejects_a_fence_token_altered_in_flight(header: str, value: str) -> None:
    # The body and webhook-id are what webhook-signature covers; the identity and the
    # recording time, which order a stale attempt before a newer one at the fence, are
    # covered by X-Intake-Identity-Signature. A secret token alone covers nothing.
    headers = _with(**{header: value})
    with pytest.raises(Rejected, match="X-Intake-Identity-Signature does not match"):
        read(headers)
    assert read_forwarded(headers, BODY.encode(), secret_token=TOKEN).identity is not None


def test_an_attempt_of_another_destination_is_read_keyed_and_signed_with_it() -> None:
    payments = IDENTITY.model_copy(update={"destination": "payments"})
    forwarded = read(signed(identity=payments))
    assert forwarded.identity == payments
    assert forwarded.identity is not None
    assert forwarded.identity.key() == "shop:payments:12"  # the signed webhook-id
    assert forwarded.fence_token == FenceToken(payments, RECEIVED_AT)
    # Its identity is signed under its own form: default's message is not it.
    assert identity_message(payments, RECEIVED_AT).startswith("delivery:shop:payments:12:")
    assert identity_message(IDENTITY, RECEIVED_AT) == (
        f"identity:shop:12:3:{RECEIVED_AT}:2b0f6f0e-claim"  # as before destinations
    )
    # Another destination's name in flight: neither webhook-id nor the identity signature
    # agree. Without the header (a service before destinations) it is default.
    with pytest.raises(Rejected, match="webhook-id does not match"):
        read(signed(identity=payments) | {"x-intake-destination": "analytics"})
    with pytest.raises(Rejected, match="identity headers invalid"):
        read(signed(identity=payments) | {"x-intake-destination": "Pay ments"})
    assert read(signed()).identity == IDENTITY
    assert IDENTITY.destination == "default"


def test_read_forwarded_refuses_a_received_at_that_is_not_signed() -> None:
    with pytest.raises(Rejected, match="X-Intake-Received-At came without"):
        read(_without("x-intake-identity-signature"))
    with pytest.raises(Rejected, match="came without X-Intake-Received-At"):
        read(_without("x-intake-received-at"))


def test_read_forwarded_reads_a_service_that_sends_no_fence_token() -> None:
    # A service from before the fencing token: its identity passes, unsigned, as before; its
    # request has no token, so it cannot pass a fence.
    forwarded = read(_without("x-intake-received-at", "x-intake-identity-signature"))
    assert forwarded.identity == IDENTITY
    assert forwarded.received_at is None
    assert forwarded.fence_token is None


def test_read_forwarded_gives_no_fence_token_for_a_plain_bot() -> None:
    assert read(signed(identity=None)).fence_token is None


def test_a_fence_token_needs_epoch_milliseconds() -> None:
    for received_at in (-1, 2**63, 1.5, True):
        with pytest.raises(ValueError, match="received_at"):
            FenceToken(IDENTITY, received_at)  # type: ignore[arg-type]


def test_read_forwarded_matches_header_names_whatever_their_case() -> None:
    headers = {name.title(): value for name, value in signed().items()}
    assert read(headers).identity == IDENTITY


@pytest.mark.parametrize(
    "body",
    [BODY, '{"update_id": 12, "message": {"text": "héllo ✓"}}', '{"update_id":0}'],
    ids=["ascii", "utf-8", "compact"],
)
def test_sign_agrees_with_the_standardwebhooks_package(body: str) -> None:
    ours = sign(SIGNING, "shop:12", int(SENT_AT.timestamp()), body.encode())
    assert ours == Webhook(SIGNING).sign("shop:12", SENT_AT, body)
    assert ours != sign(OTHER_SIGNING, "shop:12", int(SENT_AT.timestamp()), body.encode())


def test_read_forwarded_accepts_a_secret_token_alone() -> None:
    headers = {k: v for k, v in signed().items() if not k.startswith("webhook-")}
    forwarded = read_forwarded(headers, BODY.encode(), secret_token=TOKEN)
    assert forwarded.identity == IDENTITY


def test_read_forwarded_accepts_any_one_matching_signature_while_a_secret_rotates() -> None:
    headers = signed()
    stale = signed(secret=OTHER_SIGNING)["webhook-signature"]
    headers["webhook-signature"] = f"{stale} {headers['webhook-signature']}"
    assert read(headers).identity == IDENTITY
    assert read(signed(secret=OTHER_SIGNING), signing_secret=OTHER_SIGNING).identity == IDENTITY


def test_read_forwarded_gives_no_identity_for_a_plain_bot() -> None:
    forwarded = read(signed(identity=None), secret_token=TOKEN)
    assert forwarded.identity is None
    assert forwarded.lease_expires_at is None
    assert forwarded.update_id == 12


def test_read_forwarded_accepts_a_timestamp_just_within_the_tolerance() -> None:
    assert read(signed(), now=NOW + 299).identity == IDENTITY
    assert read(signed(), now=NOW - 299).identity == IDENTITY
    assert read(signed(), now=NOW + 20, tolerance_seconds=30).identity == IDENTITY


def test_read_forwarded_needs_a_secret_to_verify_with() -> None:
    with pytest.raises(ValueError, match="signing_secret or secret_token"):
        read_forwarded(signed(), BODY.encode())


def _without(*names: str) -> dict[str, str]:
    return {k: v for k, v in signed().items() if k not in names}


def _with(**changed: str) -> dict[str, str]:
    return {**signed(), **{name.replace("_", "-"): value for name, value in changed.items()}}


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        pytest.param(
            _without("webhook-id", "webhook-timestamp", "webhook-signature"),
            "missing webhook-id",
            id="no signature headers",
        ),
        pytest.param(_without("webhook-signature"), "missing", id="no webhook-signature"),
        pytest.param(_without("webhook-timestamp"), "missing", id="no webhook-timestamp"),
        pytest.param(_with(webhook_timestamp="soon"), "missing", id="timestamp not a number"),
        pytest.param(signed(secret=OTHER_SIGNING), "does not match", id="another secret"),
        pytest.param(
            _with(
                webhook_signature=" ".join([signed(secret=OTHER_SIGNING)["webhook-signature"]] * 2)
            ),
            "does not match",
            id="several signatures, none matching",
        ),
        pytest.param(
            _with(webhook_signature="v1," + signed()["webhook-signature"][3:].lower()),
            "does not match",
            id="signature altered",
        ),
    ],
)
def test_read_forwarded_rejects_a_missing_or_wrong_signature(
    headers: dict[str, str], reason: str
) -> None:
    with pytest.raises(Rejected, match=reason):
        read(headers)


def test_read_forwarded_rejects_a_body_changed_by_one_byte() -> None:
    headers = signed()
    assert read(headers).update_id == 12
    with pytest.raises(Rejected, match="signature does not match"):
        read(headers, BODY.replace("12", "13"))
    with pytest.raises(Rejected, match="signature does not match"):
        read(headers, BODY + " ")


@pytest.mark.parametrize("now", [NOW + 301, NOW - 301], ids=["older", "newer"])
def test_read_forwarded_rejects_a_timestamp_outside_the_tolerance(now: float) -> None:
    with pytest.raises(Rejected, match="300 s away"):
        read(signed(), now=now)


def test_read_forwarded_rejects_a_timestamp_outside_a_chosen_tolerance() -> None:
    with pytest.raises(Rejected, match="30 s away"):
        read(signed(), now=NOW + 31, tolerance_seconds=30)


def test_read_forwarded_rejects_a_signed_message_for_another_update() -> None:
    # A genuine signature, but webhook-id names update 13 while the headers say 12: a signed
    # request must not be replayable with other identity headers.
    headers = signed(message_id="shop:13")
    with pytest.raises(Rejected, match="webhook-id"):
        read(headers)
    with pytest.raises(Rejected, match="webhook-id"):
        read(signed(message_id="cafe:12"))


def test_read_forwarded_rejects_an_update_id_header_that_is_not_the_bodys() -> None:
    # Signed consistently for update 13 (webhook-id shop:13), but the body is update 12.
    other = IDENTITY.model_copy(update={"update_id": 13})
    with pytest.raises(Rejected, match="X-Intake-Update-Id does not match"):
        read(signed(identity=other))


async def test_read_forwarded_rejects_an_exhaustion_record_as_an_update() -> None:
    # The service signs exhaustion records with the same secret, and sends them without
    # X-Intake-* headers. One replayed to the update handler must not pass for an update.
    sent: list[httpx.Request] = []

    def capture(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200)

    bot = _bot("http://bot.internal/hook", exhaustion_url="http://bot.internal/exhausted")
    claim = ClaimIdentity("shop", 12, 3, "2b0f6f0e-claim")
    record = exhaustion_payload(Exhaustion(claim, BODY, "HTTP 404", exhausted_at=1))
    await Downstream(bot, httpx.MockTransport(capture)).deliver_exhaustion(claim, record)
    (request,) = sent
    assert json.loads(request.content)["update_id"] == 12  # it looks like an update
    with pytest.raises(Rejected, match="webhook-id"):
        read_forwarded(request.headers, request.content, signing_secret=SIGNING)


@pytest.mark.parametrize(
    "header", ["x-intake-bot", "x-intake-update-id", "x-intake-attempt", "x-intake-claim-id"]
)
def test_read_forwarded_rejects_a_missing_identity_header(header: str) -> None:
    with pytest.raises(Rejected, match=f"identity headers missing: {header}"):
        read(_without(header), secret_token=TOKEN)


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("x_intake_attempt", "three"),
        ("x_intake_attempt", "-1"),
        ("x_intake_attempt", "0"),
        ("x_intake_attempt", "1.0"),
        ("x_intake_attempt", " 3"),
        # Latin-1 header bytes (how HTTP servers decode them) that str.isdigit calls digits
        # and int() refuses.
        ("x_intake_attempt", "\u00b9"),
        ("x_intake_attempt", "3\u00b2"),
        ("x_intake_update_id", "1\u00b2"),
        ("x_intake_lease_expires_at", "\u00b3"),
        ("x_intake_lease_expires_at", "soon"),
        ("x_intake_received_at", "soon"),
        ("x_intake_received_at", "-1"),
        ("x_intake_received_at", str(2**63)),
        ("x_intake_received_at", "1\u00b2"),
        ("x_intake_bot", "Shop"),
        ("x_intake_claim_id", ""),
    ],
)
def test_read_forwarded_rejects_an_identity_header_out_of_shape(header: str, value: str) -> None:
    with pytest.raises(Rejected):
        read(_with(**{header: value}))


def test_read_forwarded_rejects_a_signed_webhook_timestamp_that_int_refuses() -> None:
    with pytest.raises(Rejected, match="missing"):
        read(_with(webhook_timestamp="1\u00b2"))


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("update_id=12", "not JSON"),
        ('{"update_id": 12', "not JSON"),
        ("", "not JSON"),
        ('{"message": {}}', "no integer update_id"),
        ('{"update_id": "12"}', "no integer update_id"),
        ('{"update_id": 12.0}', "no integer update_id"),
        ('{"update_id": true}', "no integer update_id"),
        ("[12]", "no integer update_id"),
        ("12", "no integer update_id"),
    ],
)
def test_read_forwarded_rejects_a_body_that_is_not_an_update(body: str, reason: str) -> None:
    headers = signed(body, identity=IDENTITY)  # the signature holds: only the body is wrong
    with pytest.raises(Rejected, match=reason):
        read(headers, body)


def test_read_forwarded_rejects_a_body_that_is_not_utf8() -> None:
    headers = {k: v for k, v in signed().items() if not k.startswith("webhook-")}
    with pytest.raises(Rejected, match="not JSON"):
        read_forwarded(headers, b'{"update_id": 12, "x": "\xff"}', secret_token=TOKEN)


@pytest.mark.parametrize(
    "headers",
    [_with(x_telegram_bot_api_secret_token="guess"), _without("x-telegram-bot-api-secret-token")],
    ids=["wrong", "missing"],
)
def test_read_forwarded_rejects_a_wrong_or_missing_secret_token(headers: dict[str, str]) -> None:
    with pytest.raises(Rejected, match="X-Telegram-Bot-Api-Secret-Token"):
        read(headers, secret_token=TOKEN)
    with pytest.raises(Rejected, match="X-Telegram-Bot-Api-Secret-Token"):
        read_forwarded(headers, BODY.encode(), secret_token=TOKEN)


def test_read_forwarded_needs_every_secret_given_to_match() -> None:
    with pytest.raises(Rejected, match="signature does not match"):
        read(signed(secret=OTHER_SIGNING), secret_token=TOKEN)


# End to end: the service's real forwarder against a real server that uses the kit.


@dataclass
class Receiver:
    """A bot's handler that verifies with the kit; 403 for what it rejects."""

    signing_secret: str | None
    secret_token: str | None
    accepted: list[Forwarded] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def app(self) -> Starlette:
        async def hook(request: Request) -> Response:
            body = await request.body()
            try:
                forwarded = read_forwarded(
                    request.headers,
                    body,
                    signing_secret=self.signing_secret,
                    secret_token=self.secret_token,
                )
            except Rejected as error:
                with self.lock:
                    self.rejected.append(str(error))
                return Response(str(error), 403)
            with self.lock:
                self.accepted.append(forwarded)
            return Response("{}", media_type="application/json")

        return Starlette(routes=[Route("/hook", hook, methods=["POST"])])


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    made = Receiver(signing_secret=SIGNING, secret_token=TOKEN)
    async with serve_asgi(made.app()) as base:
        yield made, f"{base}/hook"


def _bot(url: str, **options: object) -> BotSettings:
    settings: dict[str, object] = {
        "name": "shop",
        "secret_token": SecretStr("from-telegram"),
        "downstream_url": url,
        "signing_secret": SecretStr(SIGNING),
        "downstream_secret_token": SecretStr(TOKEN),
        **options,
    }
    return BotSettings.model_validate(settings)


async def _forward(bot: BotSettings, identity: ClaimIdentity, body: str) -> str:
    transport = open_transport(max_connections=4)
    try:
        outcome = await Downstream(bot, transport).forward(
            identity, body, lease_until=LEASE, received_at=RECEIVED_AT
        )
    finally:
        await transport.aclose()
    return outcome.kind


async def test_the_kit_verifies_what_the_real_forwarder_sends(
    receiver: tuple[Receiver, str],
) -> None:
    made, url = receiver
    claim = ClaimIdentity("shop", 12, 3, "2b0f6f0e-claim")
    assert await _forward(_bot(url), claim, BODY) == "completed"
    assert made.rejected == []
    (forwarded,) = made.accepted
    assert forwarded.identity == IDENTITY
    assert forwarded.lease_expires_at == LEASE
    assert forwarded.fence_token == FenceToken(IDENTITY, RECEIVED_AT)
    assert forwarded.body == BODY.encode()
    assert forwarded.update["message"] == {"text": "héllo"}


async def test_the_kit_verifies_what_the_real_forwarder_sends_for_a_plain_bot(
    receiver: tuple[Receiver, str],
) -> None:
    made, url = receiver
    claim = ClaimIdentity("shop", 12, 1, "2b0f6f0e-claim")
    assert await _forward(_bot(url, mode="plain"), claim, BODY) == "completed"
    (forwarded,) = made.accepted
    assert forwarded.identity is None
    assert forwarded.fence_token is None
    assert forwarded.update_id == 12


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"signing_secret": SecretStr(OTHER_SIGNING)}, "signature does not match"),
        ({"downstream_secret_token": SecretStr("stale-token")}, "Secret-Token"),
    ],
    ids=["another signing secret", "another downstream secret"],
)
async def test_the_kit_rejects_the_real_forwarder_with_other_secrets(
    receiver: tuple[Receiver, str], options: dict[str, object], reason: str
) -> None:
    made, url = receiver
    claim = ClaimIdentity("shop", 12, 3, "2b0f6f0e-claim")
    assert await _forward(_bot(url, **options), claim, BODY) == "terminal"
    assert made.accepted == []
    (rejection,) = made.rejected
    assert reason in rejection


async def test_a_malformed_request_is_rejected_not_an_error_in_the_handler(
    receiver: tuple[Receiver, str],
) -> None:
    # Header bytes above 0x7f reach the handler as Latin-1 text: b"1\xb2" is "1²", which
    # str.isdigit accepts and int() refuses. No secret is needed to send it.
    made, url = receiver
    headers = {**signed(), "webhook-timestamp": "1"}
    raw = {name.encode(): value.encode() for name, value in headers.items()}
    raw[b"webhook-timestamp"] = b"1\xb2"
    async with httpx.AsyncClient() as client:
        response = await client.post(url, content=BODY.encode(), headers=raw)
    assert response.status_code == 403
    assert made.rejected == ["missing webhook-id, webhook-timestamp or webhook-signature"]
