"""The test bots, one per framework, each doing what behaviour.py says."""

from __future__ import annotations

import sys

from tests.kit.node import node_bot


def bot_program(name: str) -> list[str]:
    """The command that runs framework `name`'s bot (grammY and Telegraf: kit/typescript)."""
    if name in ("grammy", "telegraf"):
        return node_bot(name)
    return [sys.executable, "-m", f"tests.kit.bots.{name}_bot"]
