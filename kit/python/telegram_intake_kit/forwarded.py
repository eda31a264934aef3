"""Reading a request the service forwarded downstream (docs/contract.md section 6): verify it, then
take the update and the attempt's identity from it.

Verification is the downstream secret (`X-Telegram-Bot-Api-Secret-Token`, what an unmodified
Telegram bot framework checks), or a Standard Webhooks signature over `webhook-id`,
`webhook-timestamp` and the body, within a timestamp tolerance, or both. The signature covers
the body and `webhook-id` = `bot:update_id`; the kit checks that both agree with the identity
headers (or, for a plain bot, that `webhook-id` names the body's update), so a signed request
cannot be replayed for another update, nor another signed message (an exhaustion record) pass
for an update. The signing is the Standard Webhooks scheme, written here on `hmac` so the
kit needs no more than pydantic; tests check it against the `standardwebhooks` package.

The identity headers and `X-Intake-Received-At` are signed too, by
`X-Intake-Identity-Signature` (the same scheme over `identity_message`, at the same
`webhook-timestamp`): together they are the attempt's fencing token (`FenceToken`), which
the kit's `fence` records in the downstream's own database, so nobody who can alter headers in
flight can advance a stale attempt's token.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import ValidationError

from telegram_intake_kit.wire import BOT_PATTERN, DEFAULT_DESTINATION, MAX_BIGINT, Identity

DEFAULT_TOLERANCE_SECONDS = 300.0
IDENTITY_SIGNATURE_HEADER = "x-intake-identity-signature"
RECEIVED_AT_HEADER = "x-intake-received-at"
DESTINATION_HEADER = "x-intake-destination"  # absent (a service before destinations): default
_IDENTITY_HEADERS = {
    "bot": "x-intake-bot",
    "update_id": "x-intake-update-id",
    "attempt": "x-intake-attempt",
    "claim_id": "x-intake-claim-id",
}


class Rejected(Exception):
    """The request did not come from the service, or is not one it would send."""


@dataclass(frozen=True)
class FenceToken:
    """What orders the attempts of one update for the kit's `fence`: `(received_at, attempt)`.

    The attempt number grows with every claim of a recording; `received_at` (when the
    service recorded the update, epoch ms) grows from one recording to the next, since a row
    is pruned only `retention_seconds` after it settled. So a pruned and re-recorded update,
    whose attempts restart at 1, still orders after every attempt of its earlier recording.
    Two tokens equal in both are the same attempt only with the same `claim_id`."""

    identity: Identity
    received_at: int

    def __post_init__(self) -> None:
        if type(self.received_at) is not int or not 0 <= self.received_at <= MAX_BIGINT:
            raise ValueError(f"received_at must be epoch milliseconds, not {self.received_at!r}")


@dataclass(frozen=True)
class Forwarded:
    """One verified attempt. `identity` is None for a `plain` bot, which forwards the bare
    update; `update` is the parsed body, `body` the bytes as received; `received_at` is when
    the service recorded the update (None from a service that does not send it)."""

    identity: Identity | None
    lease_expires_at: int | None
    update: dict[str, Any]
    body: bytes
    received_at: int | None = None

    @property
    def update_id(self) -> int:
        return int(self.update["update_id"])

    @property
    def fence_token(self) -> FenceToken | None:
        """The attempt's fencing token (the kit's `fence`); None for a plain bot, or without
        `X-Intake-Received-At`: such a request cannot pass a fence."""
        if self.identity is None or self.received_at is None:
            return None
        return FenceToken(self.identity, self.received_at)


def signing_key(secret: str) -> bytes:
    """The HMAC key of a `whsec_...` secret."""
    try:
        return base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except binascii.Error as error:
        raise ValueError("a signing secret is whsec_ and base64") from error


def sign(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` value for one message: `v1,<base64 HMAC-SHA256>`."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(signing_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


class AttemptFields(Protocol):
    """The four fields of an attempt's identity (the kit's `Identity`, the store's
    `ClaimIdentity`)."""

    @property
    def bot(self) -> str: ...
    @property
    def update_id(self) -> int: ...
    @property
    def attempt(self) -> int: ...
    @property
    def claim_id(self) -> str: ...


def identity_message(identity: AttemptFields, received_at: int) -> str:
    """What `X-Intake-Identity-Signature` signs, as a Standard Webhooks message id (with an
    empty payload). The claim_id, the one field that may hold a colon, comes last. A
    destination other than `default` is signed under its own prefix, so that no message of
    one form reads as the other; `default`'s is the message of the release before it."""
    destination = getattr(identity, "destination", DEFAULT_DESTINATION)
    tail = f"{identity.update_id}:{identity.attempt}:{received_at}:{identity.claim_id}"
    if destination == DEFAULT_DESTINATION:
        return f"identity:{identity.bot}:{tail}"
    return f"delivery:{identity.bot}:{destination}:{tail}"


def read_forwarded(
    headers: Mapping[str, str],
    body: bytes,
    *,
    signing_secret: str | None = None,
    secret_token: str | None = None,
    tolerance_seconds: float = DEFAULT_TOLERANCE_SECONDS,
    now: float | None = None,
) -> Forwarded:
    """Verify a forwarded request and read it; raises `Rejected` with the reason. Give the
    bot's `signing_secret`, its `downstream_secret_token`, or both: every one given must
    match."""
    if signing_secret is None and secret_token is None:
        raise ValueError(
            "give signing_secret or secret_token: an unverified request proves nothing"
        )
    lower = {name.lower(): value for name, value in headers.items()}
    if secret_token is not None:
        given = lower.get("x-telegram-bot-api-secret-token", "").encode()
        if not hmac.compare_digest(given, secret_token.encode()):
            raise Rejected("missing or wrong X-Telegram-Bot-Api-Secret-Token")
    if signing_secret is not None:
        _verify_signature(lower, body, signing_secret, tolerance_seconds, now)
    try:
        update = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise Rejected(f"the body is not JSON: {error}") from None
    if not isinstance(update, dict) or type(update.get("update_id")) is not int:
        raise Rejected("the body is not a Telegram update (no integer update_id)")
    identity = _identity(lower)
    if identity is not None and identity.update_id != update["update_id"]:
        raise Rejected("X-Intake-Update-Id does not match the body's update_id")
    received_at = _millis(lower, RECEIVED_AT_HEADER, "X-Intake-Received-At")
    if signing_secret is not None:
        _check_message_id(lower["webhook-id"], identity, update["update_id"])
        if identity is not None:
            _check_identity_signature(lower, identity, received_at, signing_secret)
    lease = _millis(lower, "x-intake-lease-expires-at", "X-Intake-Lease-Expires-At")
    return Forwarded(identity, lease, update, body, received_at)


def _verify_signature(
    headers: dict[str, str], body: bytes, secret: str, tolerance: float, now: float | None
) -> None:
    message_id = headers.get("webhook-id")
    stamp = headers.get("webhook-timestamp", "")
    signatures = headers.get("webhook-signature")
    if not message_id or not signatures or not _is_digits(stamp):
        raise Rejected("missing webhook-id, webhook-timestamp or webhook-signature")
    timestamp = int(stamp)
    if abs((time.time() if now is None else now) - timestamp) > tolerance:
        raise Rejected(f"webhook-timestamp is more than {tolerance:g} s away from now")
    expected = sign(secret, message_id, timestamp, body).encode()
    # Several space-separated signatures may be sent while a secret is rotated.
    matches = [hmac.compare_digest(expected, given.encode()) for given in signatures.split()]
    if not any(matches):
        raise Rejected("webhook-signature does not match")


def _identity(headers: dict[str, str]) -> Identity | None:
    present = {field: headers.get(name) for field, name in _IDENTITY_HEADERS.items()}
    if all(value is None for value in present.values()):
        return None  # a plain bot's request
    missing = [_IDENTITY_HEADERS[f] for f, value in present.items() if value is None]
    if missing:
        raise Rejected(f"identity headers missing: {', '.join(missing)}")
    try:
        return Identity.model_validate(
            {
                "bot": present["bot"],
                "update_id": _integer(present["update_id"]),
                "attempt": _integer(present["attempt"]),
                "claim_id": present["claim_id"],
                "destination": headers.get(DESTINATION_HEADER, DEFAULT_DESTINATION),
            }
        )
    except ValidationError as error:
        raise Rejected(f"identity headers invalid: {error.errors()[0]['msg']}") from None


def _check_message_id(message_id: str, identity: Identity | None, update_id: int) -> None:
    """The signed `webhook-id` is `bot:update_id` of this very update. Without identity
    headers (a plain bot) the bot is unknown, but the form still tells an update from the
    other messages signed with the same secret (`exhaustion:...` records)."""
    if identity is not None:
        if message_id != identity.key():
            raise Rejected("webhook-id does not match the identity headers")
        return
    bot, _, number = message_id.rpartition(":")
    if re.fullmatch(BOT_PATTERN, bot) is None or number != str(update_id):
        raise Rejected("webhook-id is not bot:update_id of this update")


def _check_identity_signature(
    headers: dict[str, str], identity: Identity, received_at: int | None, secret: str
) -> None:
    """The identity headers and `X-Intake-Received-At` as the service signed them. A service
    from before the fencing token sends neither the signature nor `X-Intake-Received-At`:
    its identity passes unsigned, as it always did, and its request has no fence token."""
    signatures = headers.get(IDENTITY_SIGNATURE_HEADER)
    if signatures is None:
        if received_at is not None:
            raise Rejected("X-Intake-Received-At came without X-Intake-Identity-Signature")
        return
    if received_at is None:
        raise Rejected("X-Intake-Identity-Signature came without X-Intake-Received-At")
    # webhook-timestamp was checked by _verify_signature: digits, within the tolerance.
    timestamp = int(headers["webhook-timestamp"])
    expected = sign(secret, identity_message(identity, received_at), timestamp, b"").encode()
    matches = [hmac.compare_digest(expected, given.encode()) for given in signatures.split()]
    if not any(matches):
        raise Rejected("X-Intake-Identity-Signature does not match")


def _millis(headers: dict[str, str], name: str, label: str) -> int | None:
    value = headers.get(name)
    if value is None:
        return None
    if not _is_digits(value) or int(value) > MAX_BIGINT:
        raise Rejected(f"{label} is not epoch milliseconds")
    return int(value)


def _is_digits(value: str) -> bool:
    # str.isdigit alone also admits characters int() refuses, such as the Latin-1 "¹²³"
    # that an HTTP server's header decoding can produce.
    return value.isascii() and value.isdigit()


def _integer(value: str | None) -> int | str | None:
    return int(value) if value is not None and _is_digits(value) else value
