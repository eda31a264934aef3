"""What every operator command shares at the terminal (`app.cli.operations`,
`app.cli.control`, `app.cli.exhaustion_actions`): who the person is in the audit log (`actor`),
how bots, times and rates are read from their arguments, and how answers are printed: tables,
JSON, times in UTC and ages."""

from __future__ import annotations

import argparse
import getpass
import json
import socket
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from app.config import Settings
from app.store import validate


def actor() -> str:
    """Who a command's actions are recorded as in the audit log."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"cli:{user}@{socket.gethostname()}"[:200]


def when_argument(value: str) -> int:
    """An epoch-ms integer or an ISO 8601 time (UTC unless it says otherwise)."""
    if value.isdigit():
        return int(value)
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is neither epoch milliseconds nor an ISO 8601 time"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def bot_argument(value: str) -> str:
    """A bot's name, as the store takes one."""
    try:
        return validate.bot_name(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def destination_argument(value: str) -> str:
    """A destination's name (docs/destinations.md), as the store takes one."""
    try:
        return validate.destination_name(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def telegram_id_argument(value: str) -> int:
    """A user's or a chat's id, as Telegram numbers them (negative for groups and channels)."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a Telegram id (an integer)") from None
    if abs(number) >= 1 << 63:
        raise argparse.ArgumentTypeError(f"{value!r} is out of a Telegram id's range")
    return number


def rate_argument(value: str) -> float | None:
    """Attempts per second, or `off` (None: no limit)."""
    if value == "off":
        return None
    return pace_argument(value, "a number or 'off'")


def pace_argument(value: str, wanted: str = "a number") -> float:
    """Updates or attempts per second, within the store's bounds."""
    try:
        rate = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not {wanted}") from None
    if not validate.MIN_RATE <= rate <= validate.MAX_RATE:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not in [{validate.MIN_RATE}, {validate.MAX_RATE}] per second"
        )
    return rate


def known_bot(settings: Settings, bot: str) -> bool:
    """Whether `bot` is configured; if not, says so."""
    if settings.bot(bot) is None:
        print(f"no bot {bot!r} is configured", file=sys.stderr)
        return False
    return True


def print_json(value: Any) -> None:
    """`value` as JSON, for a script to read (`--json`)."""
    print(json.dumps(value, indent=2, sort_keys=True))


def vars_of(value: Any) -> dict[str, Any]:
    """A dataclass's fields by name (its own, not its properties), for JSON."""
    return {name: getattr(value, name) for name in value.__dataclass_fields__}


def table(head: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Rows under a header, columns padded to their widest cell."""
    cells = [[str(cell) for cell in row] for row in [head, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(head))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )


def time_text(epoch_ms: int | None) -> str:
    """Epoch ms as a UTC time to the second; `-` for none."""
    if epoch_ms is None:
        return "-"
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def age_text(ms: int | None) -> str:
    """A length of time in its largest unit (`4.2h`); `-` for none."""
    if ms is None:
        return "-"
    seconds = ms / 1000
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.1f}s"
