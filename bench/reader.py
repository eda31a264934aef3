"""The strict JSON reader (app.http.strict_json) beside the reader it replaced (issue 20).

The webhook used the standard library's decoder with NaN and Infinity refused; the strict
reader adds the duplicate-name hook on every object, the range check on every float, and a
full check for lone surrogates when the text holds a surrogate escape. Each is timed on the
same bodies, in one process, alternating, best of several rounds; "x" is the strict reader's
time over the baseline's. The bodies: the benchmark's ~250-byte message update (ASCII), the
same with Cyrillic and an emoji as Telegram escapes them, and a 4 KiB update with entities.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from app.http.strict_json import read_json
from bench.intake import TEMPLATE


def _not_json(constant: str) -> Any:
    raise ValueError(constant)


_BASELINE = json.JSONDecoder(parse_constant=_not_json)


def baseline(body: bytes) -> Any:
    """The webhook's reader before issue 20."""
    return _BASELINE.decode(body.decode("utf-8"))


def _bodies() -> dict[str, bytes]:
    ascii_update = (TEMPLATE % (1, 1, 42, 42, 1)).encode()
    escaped = json.dumps(
        {
            "update_id": 2,
            "message": {
                "message_id": 2,
                "from": {"id": 42, "is_bot": False, "first_name": "Ада"},
                "chat": {"id": 42, "type": "private"},
                "date": 1767225600,
                "text": "Привет! Два эспрессо, пожалуйста \U0001f600",
            },
        }
    ).encode()  # ensure_ascii, as Telegram writes it: \\u escapes and a surrogate pair
    entities = [{"type": "bold", "offset": n, "length": 3} for n in range(0, 120, 4)]
    large = json.dumps(
        {
            "update_id": 3,
            "message": {
                "message_id": 3,
                "chat": {"id": 42, "type": "private"},
                "date": 1767225600,
                "text": "order " * 300,
                "entities": entities,
            },
        }
    ).encode()
    return {
        f"message update, ASCII ({len(ascii_update)} B)": ascii_update,
        f"message update, Cyrillic and an emoji, escaped ({len(escaped)} B)": escaped,
        f"message with 30 entities ({len(large) // 1024} KiB)": large,
    }


def _best(read: Callable[[bytes], Any], body: bytes, count: int) -> float:
    started = time.perf_counter()
    for _ in range(count):
        read(body)
    return (time.perf_counter() - started) / count


async def main(*, quick: bool = False) -> str:
    count, rounds = (2_000, 3) if quick else (20_000, 7)
    lines = [
        "| body | stdlib decoder (before) µs | strict reader µs | x |",
        "| --- | --- | --- | --- |",
    ]
    for name, body in _bodies().items():
        before = min(_best(baseline, body, count) for _ in range(rounds))
        after = min(_best(read_json, body, count) for _ in range(rounds))
        lines.append(f"| {name} | {before * 1e6:.2f} | {after * 1e6:.2f} | {after / before:.2f} |")
    return "\n".join(lines)
