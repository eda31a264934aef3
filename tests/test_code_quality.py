"""ruff (lint and format) and mypy --strict stay clean: part of the test command, so CI holds it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYTHON = ["app", "kit/python", "kit/vectors", "tests", "alembic", "bench"]


@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "check", *PYTHON],
        ["ruff", "format", "--check", *PYTHON],
        ["mypy"],
    ],
    ids=["ruff-check", "ruff-format", "mypy-strict"],
)
def test_code_is_clean(command: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
