"""Log lines: JSON objects with an attempt's identity as fields, or text with it as a prefix."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from app import logs
from app.store import ClaimIdentity

IDENTITY = ClaimIdentity("shop", 42, 3, "0f9c3e9e-8a53-4c39-9d5e-2d6f3c1b7a10")


class Captured:
    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self._capsys = capsys

    def getvalue(self) -> str:
        return self._capsys.readouterr().err


@pytest.fixture
def stderr(capsys: pytest.CaptureFixture[str]) -> Iterator[Captured]:
    """What the configured handler writes (to the standard error of the moment: pytest's)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield Captured(capsys)
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_lines_carry_the_attempt_identity_as_fields(stderr: Captured) -> None:
    logs.configure("json")
    logs.AttemptLog.of(logging.getLogger("app.dispatch"), IDENTITY).warning("owner lost (%s)", "x")
    line = json.loads(stderr.getvalue())
    assert line["level"] == "WARNING"
    assert line["logger"] == "app.dispatch"
    assert (line["bot"], line["update_id"], line["attempt"]) == ("shop", 42, 3)
    assert line["claim_id"] == IDENTITY.claim_id
    assert line["message"] == f"shop:42 attempt 3 (claim {IDENTITY.claim_id}): owner lost (x)"
    assert line["timestamp"].endswith("+00:00")


def test_text_lines_carry_it_as_a_prefix(stderr: Captured) -> None:
    logs.configure("text")
    logs.AttemptLog.of(logging.getLogger("app.dispatch"), IDENTITY).info("exhausted (%s)", "400")
    text = stderr.getvalue()
    assert text.rstrip().endswith(
        f"INFO app.dispatch: shop:42 attempt 3 (claim {IDENTITY.claim_id}): exhausted (400)"
    )


def test_auto_writes_json_when_standard_error_is_not_a_terminal(stderr: Captured) -> None:
    logs.configure("auto")
    # warning: a uvicorn started by an earlier test may have set this logger to that level
    logging.getLogger("uvicorn.error").warning("Started", extra={"color_message": "\x1b[36mS"})
    line = json.loads(stderr.getvalue())
    assert line["message"] == "Started"
    assert "color_message" not in line  # uvicorn's terminal copy is dropped


def test_debug_lines_are_dropped_below_the_level(stderr: Captured) -> None:
    logs.configure("json", "WARNING")
    logging.getLogger("app").info("quiet")
    logging.getLogger("app").warning("loud")
    assert [json.loads(line)["message"] for line in stderr.getvalue().splitlines()] == ["loud"]
