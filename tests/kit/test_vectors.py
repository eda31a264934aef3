"""The shared signature vectors (kit/vectors/signatures.json): what the Python kit's
`read_forwarded` does with each case, what the `standardwebhooks` package alone says of the
flagged ones, and that kit/vectors/make.py still writes the committed file. The TypeScript kit
runs the same file (kit/typescript/test/vectors.test.ts)."""

from __future__ import annotations

import base64
import importlib.util
import json
import sys
from datetime import datetime, tzinfo
from pathlib import Path
from typing import Any

import pytest
from standardwebhooks import webhooks
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from telegram_intake_kit.forwarded import Rejected, read_forwarded

VECTORS = Path(__file__).resolve().parents[2] / "kit" / "vectors"
CASES: list[dict[str, Any]] = json.loads((VECTORS / "signatures.json").read_text("utf-8"))


def body_of(case: dict[str, Any]) -> bytes:
    if "body_base64" in case:
        return base64.b64decode(case["body_base64"])
    return str(case["body"]).encode()


def read(case: dict[str, Any]) -> Any:
    return read_forwarded(
        case["headers"],
        body_of(case),
        signing_secret=case["secret"],
        secret_token=case.get("secret_token"),
        now=case["now"],
    )


def test_the_vectors_cover_what_both_kits_must_agree_on() -> None:
    assert len(CASES) >= 25
    assert {case["expect"] for case in CASES} == {"ok", "rejected"}
    assert any("body_base64" in case for case in CASES)
    assert any(case.get("standard") is True for case in CASES)
    assert any(case.get("standard") is False for case in CASES)


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_read_forwarded_does_what_the_vector_says(case: dict[str, Any]) -> None:
    if case["expect"] == "rejected":
        with pytest.raises(Rejected) as raised:
            read(case)
        assert case["reason"] in str(raised.value)
        return
    forwarded = read(case)
    identity = forwarded.identity
    expected = case["identity"]
    if expected is None:
        assert identity is None
    else:
        assert identity is not None
        assert {
            "bot": identity.bot,
            "update_id": str(identity.update_id),
            "attempt": identity.attempt,
            "claim_id": identity.claim_id,
            "destination": identity.destination,
        } == expected
    assert str(forwarded.update_id) == case["update_id"]
    assert forwarded.received_at == case["received_at"]
    assert forwarded.lease_expires_at == case["lease_expires_at"]
    assert forwarded.body == body_of(case)


# The Python package verifies text only (it decodes the body as UTF-8 first): a case whose
# body is not UTF-8 (`body_base64`) is checked by the npm package alone, which takes bytes.
STANDARD = [case for case in CASES if "standard" in case and "body" in case]


class _Frozen(datetime):
    """`datetime` whose `now` is the case's: standardwebhooks reads the clock through
    `datetime.now(tz=timezone.utc)` of its module (and has no tolerance option)."""

    at: float = 0.0

    @classmethod
    def now(cls, tz: tzinfo | None = None) -> _Frozen:
        return cls.fromtimestamp(cls.at, tz)


@pytest.mark.parametrize("case", STANDARD, ids=[case["name"] for case in STANDARD])
def test_the_standardwebhooks_package_agrees_with_the_flag(
    case: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    body = body_of(case)
    monkeypatch.setattr(_Frozen, "at", float(case["now"]))
    monkeypatch.setattr(webhooks, "datetime", _Frozen)
    webhook = Webhook(case["secret"])
    if case["standard"]:
        webhook.verify(body, case["headers"], json_parse=False)
    else:
        with pytest.raises(WebhookVerificationError):
            webhook.verify(body, case["headers"], json_parse=False)


def test_make_py_writes_the_committed_file(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = importlib.util.spec_from_file_location("vectors_make", VECTORS / "make.py")
    assert spec is not None
    assert spec.loader is not None
    make = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, make)  # its dataclass looks itself up there
    spec.loader.exec_module(make)
    assert make.render() == (VECTORS / "signatures.json").read_text("utf-8")
