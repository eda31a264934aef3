"""Reading a request the service forwarded downstream (SPEC section 6): verify it, then
take the update and the attempt's identity from it.

Verification is the downstream secret (`X-Telegram-Bot-Api-Secret-Token`, what an unmodified
Telegram bot framework checks), or a Standard Webhooks signature over `webhook-id`,
`webhook-timestamp` and the body, within a timestamp tolerance, or both. The signature covers
the body and `webhook-id` = `bot:update_id`; the kit checks that both agree with the identity
headers (or, for a plain bot, that `webhook-id` names the body's update), so a signed request
cannot be replayed for another update, nor another signed message (an exhaustion record) pass
for an update. The signing is the Standard Webhooks scheme, written here on `hmac` so the
kit needs no more than pydantic; tests check it against the `standardwebhooks` package.
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
from typing import Any

from pydantic import ValidationError

from app.kit.wire import BOT_PATTERN, Identity

DEFAULT_TOLERANCE_SECONDS = 300.0
_IDENTITY_HEADERS = {
    "bot": "x-intake-bot",
    "update_id": "x-intake-update-id",
    "attempt": "x-intake-attempt",
    "claim_id": "x-intake-claim-id",
}


class Rejected(Exception):
    """The request did not come from the service, or is not one it would send."""


@dataclass(frozen=True)
class Forwarded:
    """One verified attempt. `identity` is None for a `plain` bot, which forwards the bare
    update; `update` is the parsed body, `body` the bytes as received."""

    identity: Identity | None
    lease_expires_at: int | None
    update: dict[str, Any]
    body: bytes

    @property
    def update_id(self) -> int:
        return int(self.update["update_id"])


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
    if signing_secret is not None:
        _check_message_id(lower["webhook-id"], identity, update["update_id"])
    lease = lower.get("x-intake-lease-expires-at")
    if lease is not None and not _is_digits(lease):
        raise Rejected("X-Intake-Lease-Expires-At is not epoch milliseconds")
    return Forwarded(identity, None if lease is None else int(lease), update, body)


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


def _is_digits(value: str) -> bool:
    # str.isdigit alone also admits characters int() refuses, such as the Latin-1 "¹²³"
    # that an HTTP server's header decoding can produce.
    return value.isascii() and value.isdigit()


def _integer(value: str | None) -> int | str | None:
    return int(value) if value is not None and _is_digits(value) else value
