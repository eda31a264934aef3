"""Make signatures.json: shared vectors for the kit's `read_forwarded` in every language.

Each case is one forwarded request, signed with the Python kit's own `sign` (so the file is
reproducible) and the outcome `read_forwarded` gives for it. tests/kit/test_vectors.py runs
every case through the Python kit and checks that this script still writes the committed
file; kit/typescript/test/vectors.test.ts runs them through the TypeScript kit.

    .venv/bin/python kit/vectors/make.py          # write signatures.json
    .venv/bin/python kit/vectors/make.py --check  # exit 1 if the file is not what it writes

A case: `name`; `secret` (the signing secret, always given to read_forwarded); `secret_token`
(given too when present); `headers` (lower-case names); `body` (text, sent as UTF-8) or
`body_base64` (bytes that are not UTF-8); `now` (epoch seconds); `expect`, "ok" or "rejected".
"ok" comes with `identity` (`bot`, `update_id` as a decimal string since JSON numbers past
2**53 are not exact in every language, `attempt`, `claim_id`; null for a plain request),
`update_id` (the body's, decimal), `received_at` and `lease_expires_at` (or null). "rejected"
comes with `reason`, a part of the message both kits give. `sign` is what the kit's `sign`
makes of this `secret`, `webhook-id`, `webhook-timestamp` and body (where both are usable).
`standard` says whether the Standard Webhooks scheme alone accepts the request's
`webhook-signature` over its body at `now` (absent where the request carries none).
"""

from __future__ import annotations

import base64
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from telegram_intake_kit.forwarded import identity_message, sign

HERE = Path(__file__).resolve().parent
OUTPUT = HERE / "signatures.json"

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # noqa: S105 (a test secret)
OTHER = "whsec_QWxsIHRoZSBvdGhlciBzZWNyZXQgYnl0ZXM="
TOKEN = "behind-the-intake"  # noqa: S105
SENT = 1_796_126_407  # 2026-12-01T12:00:07Z
NOW = SENT + 2
LEASE = 1_796_126_467_000
RECEIVED_AT = 1_796_126_400_123
TOLERANCE = 300


@dataclass(frozen=True)
class Who:
    """An attempt's identity as headers carry it (no validation: some cases break the rules)."""

    bot: str = "shop"
    update_id: int | str = 12
    attempt: int | str = 3
    claim_id: str = "2b0f6f0e-claim"
    destination: str = "default"  # the service leaves the header out for default


SHOP = Who()
PAYMENTS = Who(destination="payments")


def update(update_id: int | str = 12, text: str = "h\u00e9llo") -> bytes:
    message = {"message_id": 7, "chat": {"id": 42, "type": "private"}, "date": 1796126400}
    return (
        json.dumps({"update_id": "@", "message": {**message, "text": text}}, ensure_ascii=False)
        .replace('"@"', str(update_id))
        .encode()
    )


BODY = update()


def forwarded(
    body: bytes = BODY,
    who: Who | None = SHOP,
    *,
    message_id: str | None = None,
    secret: str = SECRET,
    identity_secret: str | None = None,
    at: int = SENT,
    received_at: int | str | None = RECEIVED_AT,
    lease: int | str | None = LEASE,
    token: str | None = TOKEN,
) -> dict[str, str]:
    """The headers of one attempt as the service sends them; `who=None` is a plain bot."""
    headers = {"content-type": "application/json"}
    if token is not None:
        headers["x-telegram-bot-api-secret-token"] = token
    if who is not None:
        if who.destination != "default":
            headers["x-intake-destination"] = who.destination
        headers["x-intake-bot"] = who.bot
        headers["x-intake-update-id"] = str(who.update_id)
        headers["x-intake-attempt"] = str(who.attempt)
        headers["x-intake-claim-id"] = who.claim_id
        if lease is not None:
            headers["x-intake-lease-expires-at"] = str(lease)
        if received_at is not None:
            headers["x-intake-received-at"] = str(received_at)
            # The service signs the numbers as it writes them: no leading zeros.
            number = Who(
                who.bot, int(who.update_id), int(who.attempt), who.claim_id, who.destination
            )
            signed = identity_message(number, int(received_at))  # type: ignore[arg-type]
            headers["x-intake-identity-signature"] = sign(
                identity_secret or secret, signed, at, b""
            )
    if message_id is None and who is not None:
        named = "" if who.destination == "default" else f"{who.destination}:"
        message_id = f"{who.bot}:{named}{who.update_id}"
    elif message_id is None:
        message_id = f"shop:{json.loads(body)['update_id']}"
    headers["webhook-id"] = message_id
    headers["webhook-timestamp"] = str(at)
    headers["webhook-signature"] = sign(secret, message_id, at, body)
    return headers


def changed(headers: dict[str, str], **values: str | None) -> dict[str, str]:
    """`headers` with some replaced (`x_intake_attempt="4"`) or dropped (`=None`)."""
    result = dict(headers)
    for name, value in values.items():
        header = name.replace("_", "-")
        if value is None:
            result.pop(header, None)
        else:
            result[header] = value
    return result


def ok(
    who: Who | None = SHOP,
    update_id: int = 12,
    received_at: int | None = RECEIVED_AT,
    lease: int | None = LEASE,
) -> dict[str, Any]:
    identity = None
    if who is not None:
        identity = {
            "bot": who.bot,
            "update_id": str(int(who.update_id)),
            "attempt": int(who.attempt),
            "claim_id": who.claim_id,
            "destination": who.destination,
        }
    return {
        "expect": "ok",
        "identity": identity,
        "update_id": str(update_id),
        "received_at": received_at,
        "lease_expires_at": lease,
    }


def rejected(reason: str) -> dict[str, Any]:
    return {"expect": "rejected", "reason": reason}


NOT_SIGNED = "webhook-signature does not match"
IDENTITY_NOT_SIGNED = "X-Intake-Identity-Signature does not match"
NOT_THESE_HEADERS = "webhook-id does not match the identity headers"
MISSING = "missing webhook-id, webhook-timestamp or webhook-signature"
TOO_FAR = f"webhook-timestamp is more than {TOLERANCE} s away from now"
NOT_THIS_UPDATE = "webhook-id is not bot:update_id of this update"
NOT_JSON = "the body is not JSON"
NOT_UPDATE = "the body is not a Telegram update (no integer update_id)"
BIG = 2**53 + 1
BIGGEST = 2**63 - 1
COLON = Who(claim_id="2b0f6f0e:attempt:3")
NOT_UTF8 = BODY.replace("h\u00e9llo".encode(), b"h\xe9llo")  # Latin-1, not UTF-8


def cases() -> list[dict[str, Any]]:
    plain = forwarded(who=None)
    full = forwarded()
    other_signature = forwarded(secret=OTHER)
    rotated = changed(
        full,
        webhook_signature=f"{other_signature['webhook-signature']} {full['webhook-signature']}",
        x_intake_identity_signature=(
            f"{full['x-intake-identity-signature']}"
            f" {other_signature['x-intake-identity-signature']}"
        ),
    )
    superscript = str(SENT)[:-1] + "\u00b9"
    payments = forwarded(who=PAYMENTS)
    return [
        # Accepted
        {"name": "plain request", "headers": plain, **ok(None, received_at=None, lease=None)},
        {"name": "identity request", "headers": full, **ok()},
        {
            "name": "identity request with secret token",
            "headers": full,
            "secret_token": TOKEN,
            **ok(),
        },
        {
            "name": "identity without fence token (older service)",
            "headers": changed(full, x_intake_received_at=None, x_intake_identity_signature=None),
            **ok(received_at=None),
        },
        {"name": "rotated signatures, the second matching", "headers": rotated, **ok()},
        {"name": "identity request of another destination", "headers": payments, **ok(PAYMENTS)},
        {
            "name": "timestamp with a leading zero",
            "headers": changed(full, webhook_timestamp=f"0{SENT}"),
            **ok(),
        },
        {
            "name": "timestamp 300 s old, at the tolerance",
            "headers": forwarded(at=NOW - 300),
            **ok(),
        },
        {
            "name": "timestamp 300 s ahead, at the tolerance",
            "headers": forwarded(at=NOW + 300),
            **ok(),
        },
        {
            "name": "leading zeros in the numbers",
            "headers": forwarded(
                who=Who(update_id="012", attempt="03"),
                received_at="0" + str(RECEIVED_AT),
                message_id="shop:12",
            ),
            **ok(Who(update_id="012", attempt="03")),
        },
        {
            "name": "update_id over 2**53",
            "body": update(BIG),
            "headers": forwarded(update(BIG), Who(update_id=BIG)),
            **ok(Who(update_id=BIG), update_id=BIG),
        },
        {
            "name": "update_id 2**63-1",
            "body": update(BIGGEST),
            "headers": forwarded(update(BIGGEST), Who(update_id=BIGGEST)),
            **ok(Who(update_id=BIGGEST), update_id=BIGGEST),
        },
        {
            "name": "plain update_id past 2**63 (the body's is not bounded)",
            "body": update(2**64 + 5),
            "headers": forwarded(update(2**64 + 5), None),
            **ok(None, update_id=2**64 + 5, received_at=None, lease=None),
        },
        {"name": "claim_id with colons", "headers": forwarded(who=COLON), **ok(COLON)},
        {
            "name": "body with a UTF-8 byte-order mark",
            "body": b"\xef\xbb\xbf" + BODY,
            "headers": forwarded(b"\xef\xbb\xbf" + BODY),
            **ok(),
        },
        # Not the service's signature
        {"name": "wrong secret", "headers": other_signature, **rejected(NOT_SIGNED)},
        {
            "name": "tampered body",
            "body": update(text="hullo"),
            "headers": full,
            **rejected(NOT_SIGNED),
        },
        {
            "name": "signature of another version",
            "headers": changed(full, webhook_signature="v2," + full["webhook-signature"][3:]),
            **rejected(NOT_SIGNED),
        },
        {"name": "timestamp 301 s old", "headers": forwarded(at=NOW - 301), **rejected(TOO_FAR)},
        {"name": "timestamp 301 s ahead", "headers": forwarded(at=NOW + 301), **rejected(TOO_FAR)},
        {
            "name": "non-digit timestamp",
            "headers": changed(full, webhook_timestamp=f"{SENT}.0"),
            **rejected(MISSING),
        },
        {
            "name": "Latin-1 superscript digit in the timestamp",
            "headers": changed(full, webhook_timestamp=superscript),
            **rejected(MISSING),
        },
        {
            "name": "missing webhook-signature",
            "headers": changed(full, webhook_signature=None),
            **rejected(MISSING),
        },
        {"name": "empty webhook-id", "headers": changed(full, webhook_id=""), **rejected(MISSING)},
        # Signed, but not this attempt
        {
            "name": "tampered attempt",
            "headers": changed(full, x_intake_attempt="4"),
            **rejected(IDENTITY_NOT_SIGNED),
        },
        {
            "name": "tampered claim_id",
            "headers": changed(full, x_intake_claim_id="2b0f6f0e-claim:4"),
            **rejected(IDENTITY_NOT_SIGNED),
        },
        {
            "name": "tampered received_at",
            "headers": changed(full, x_intake_received_at=str(RECEIVED_AT + 1)),
            **rejected(IDENTITY_NOT_SIGNED),
        },
        {
            "name": "another destination named in flight",
            "headers": changed(payments, x_intake_destination="analytics"),
            **rejected(NOT_THESE_HEADERS),
        },
        {
            "name": "a destination added to default's request",
            "headers": changed(full, x_intake_destination="payments"),
            **rejected(NOT_THESE_HEADERS),
        },
        {
            "name": "another destination's attempt with default's identity signature",
            "headers": changed(
                payments, x_intake_identity_signature=full["x-intake-identity-signature"]
            ),
            **rejected(IDENTITY_NOT_SIGNED),
        },
        {
            "name": "identity signed with another secret",
            "headers": forwarded(identity_secret=OTHER),
            **rejected(IDENTITY_NOT_SIGNED),
        },
        {
            "name": "identity signature missing",
            "headers": changed(full, x_intake_identity_signature=None),
            **rejected("X-Intake-Received-At came without X-Intake-Identity-Signature"),
        },
        {
            "name": "received_at missing",
            "headers": changed(full, x_intake_received_at=None),
            **rejected("X-Intake-Identity-Signature came without X-Intake-Received-At"),
        },
        {
            "name": "webhook-id of another update",
            "headers": forwarded(message_id="shop:13"),
            **rejected("webhook-id does not match the identity headers"),
        },
        {
            "name": "plain webhook-id of another update",
            "headers": forwarded(who=None, message_id="shop:13"),
            **rejected(NOT_THIS_UPDATE),
        },
        {
            "name": "plain exhaustion message id",
            "headers": forwarded(who=None, message_id="exhaustion:shop:12"),
            **rejected(NOT_THIS_UPDATE),
        },
        {
            "name": "identity with exhaustion message id",
            "headers": forwarded(message_id="exhaustion:shop:12"),
            **rejected("webhook-id does not match the identity headers"),
        },
        {
            "name": "identity update_id not the body's",
            "headers": forwarded(who=Who(update_id=13)),
            **rejected("X-Intake-Update-Id does not match the body's update_id"),
        },
        # Secret token, identity headers
        {
            "name": "wrong secret token",
            "headers": {**full, "x-telegram-bot-api-secret-token": "in-front-of-the-intake"},
            "secret_token": TOKEN,
            **rejected("missing or wrong X-Telegram-Bot-Api-Secret-Token"),
        },
        {
            "name": "missing secret token",
            "headers": forwarded(token=None),
            "secret_token": TOKEN,
            **rejected("missing or wrong X-Telegram-Bot-Api-Secret-Token"),
        },
        {
            "name": "identity header missing",
            "headers": changed(full, x_intake_claim_id=None),
            **rejected("identity headers missing: x-intake-claim-id"),
        },
        {
            "name": "bot name not lower case",
            "headers": forwarded(who=Who(bot="Shop")),
            **rejected("identity headers invalid: String should match pattern"),
        },
        {
            "name": "update_id 2**63",
            "body": update(2**63),
            "headers": forwarded(update(2**63), Who(update_id=2**63)),
            **rejected(
                "identity headers invalid: Input should be less than or equal to "
                "9223372036854775807"
            ),
        },
        {
            "name": "attempt 0",
            "headers": forwarded(who=Who(attempt=0)),
            **rejected("identity headers invalid: Input should be greater than or equal to 1"),
        },
        {
            "name": "attempt with a superscript digit",
            "headers": changed(full, x_intake_attempt="3\u00b9"),
            **rejected("identity headers invalid: Input should be a valid integer"),
        },
        {
            "name": "claim_id of 65 characters",
            "headers": forwarded(who=Who(claim_id="c" * 65)),
            **rejected("identity headers invalid: String should have at most 64 characters"),
        },
        {
            "name": "received_at not digits",
            "headers": changed(full, x_intake_received_at="-1"),
            **rejected("X-Intake-Received-At is not epoch milliseconds"),
        },
        {
            "name": "lease past 2**63-1",
            "headers": changed(full, x_intake_lease_expires_at=str(2**63)),
            **rejected("X-Intake-Lease-Expires-At is not epoch milliseconds"),
        },
        # The body
        {
            "name": "body not JSON",
            "body": b"update_id=12",
            "headers": forwarded(b"update_id=12"),
            **rejected(NOT_JSON),
        },
        {
            "name": "body not UTF-8",
            "body": NOT_UTF8,
            "headers": forwarded(NOT_UTF8),
            **rejected(NOT_JSON),
        },
        {
            "name": "body a list",
            "body": b"[12]",
            "headers": forwarded(b"[12]", message_id="shop:12"),
            **rejected(NOT_UPDATE),
        },
        {
            "name": "update_id a string",
            "body": update('"12"'),
            "headers": forwarded(update('"12"'), message_id="shop:12"),
            **rejected(NOT_UPDATE),
        },
        {
            "name": "update_id 12.0",
            "body": update("12.0"),
            "headers": forwarded(update("12.0"), message_id="shop:12"),
            **rejected(NOT_UPDATE),
        },
        {
            "name": "update_id 1.2e1",
            "body": update("1.2e1"),
            "headers": forwarded(update("1.2e1"), message_id="shop:12"),
            **rejected(NOT_UPDATE),
        },
        {
            "name": "update_id true",
            "body": update("true"),
            "headers": forwarded(update("true"), message_id="shop:12"),
            **rejected(NOT_UPDATE),
        },
        {
            "name": "update_id only in a nested object",
            "body": b'{"message": {"update_id": 12}}',
            "headers": forwarded(b'{"message": {"update_id": 12}}', message_id="shop:12"),
            **rejected(NOT_UPDATE),
        },
    ]


# Whether the Standard Webhooks scheme alone (the `standardwebhooks` packages) accepts a
# case's webhook-signature over its body at `now`: what it does not check is what the kit adds.
NOT_STANDARD = {
    "wrong secret",
    "tampered body",
    "signature of another version",
    "timestamp 301 s old",
    "timestamp 301 s ahead",
    "Latin-1 superscript digit in the timestamp",
    "empty webhook-id",
}
NO_SIGNATURE = {"missing webhook-signature"}


def finished(case: dict[str, Any]) -> dict[str, Any]:
    """A case as written to the file: defaults filled in, fields in a stable order."""
    body = case.pop("body", BODY)
    headers = case.pop("headers")
    name = case.pop("name")
    result: dict[str, Any] = {"name": name, "secret": SECRET}
    if "secret_token" in case:
        result["secret_token"] = case.pop("secret_token")
    result["headers"] = headers
    try:
        result["body"] = body.decode()
    except UnicodeDecodeError:
        result["body_base64"] = base64.b64encode(body).decode()
    result["now"] = NOW
    stamp = headers.get("webhook-timestamp", "")
    if headers.get("webhook-id") and stamp.isascii() and stamp.isdigit():
        result["sign"] = sign(SECRET, headers["webhook-id"], int(stamp), body)
    if name not in NO_SIGNATURE:
        result["standard"] = name not in NOT_STANDARD
    return {**result, **case}


def render() -> str:
    made = [finished(case) for case in cases()]
    names = [case["name"] for case in made]
    assert len(set(names)) == len(names), "case names are unique"
    return json.dumps(made, indent=2, ensure_ascii=False) + "\n"


def main() -> int:
    text = render()
    if sys.argv[1:] == ["--check"]:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT} is not what make.py writes: run it", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {len(json.loads(text))} cases to {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
