"""The TypeScript kit's own tests (`npm test` in kit/typescript: node:test, with the real
grammY and Telegraf from npm, and the shared signature vectors), run by the test command."""

from __future__ import annotations

import re

import pytest

from tests.kit.node import installed, npm, one_at_a_time

# Slow, but measuring nothing: a group of their own, beside the timed slow tests.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("kit-packages")]


def test_the_typescript_kits_own_tests_pass() -> None:
    with one_at_a_time():
        installed()
        done = npm("test", timeout=900)  # fails with npm's output when a test fails
    summary = dict(
        re.findall(r"^# (tests|pass|fail|skipped|todo|cancelled) (\d+)$", done.stdout, re.M)
    )
    assert summary.get("fail") == "0", done.stdout[-4000:]
    assert summary.get("cancelled") == "0", done.stdout[-4000:]
    assert summary.get("skipped") == "0", done.stdout[-4000:]  # none skips silently
    assert int(summary["pass"]) >= 40, done.stdout[-4000:]
