"""Argument checks shared by every store method: bad input raises ValueError, writes nothing."""

from __future__ import annotations

import re
from typing import Any

BOT_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
# 40 characters leave room for the longest derived name, ix_<table>_unacknowledged, within
# PostgreSQL's 63.
TABLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,39}$")
MAX_BIGINT = 2**63 - 1
MAX_INTEGER = 2**31 - 1  # attempts is an INTEGER column


def _is_int(value: Any) -> bool:
    # bool is an int subclass; True is never a valid time or id.
    return isinstance(value, int) and not isinstance(value, bool)


def bot_name(value: Any) -> str:
    if not isinstance(value, str) or not BOT_NAME.fullmatch(value):
        raise ValueError(f"bot name {value!r} does not match {BOT_NAME.pattern}")
    return value


def destination_name(value: Any) -> str:
    """A destination's name: the same shape as a bot's (docs/contract.md section 18)."""
    if not isinstance(value, str) or not BOT_NAME.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a destination name: 1-32 of a-z, 0-9, _ and -, starting with a "
            "letter or digit"
        )
    return value


def routes(value: Any) -> tuple[Any, ...]:
    """An update's routes (`app.store.types.Route`): a tuple of (destination, ordered), each
    destination once."""
    if not isinstance(value, tuple):
        raise ValueError(f"routes {value!r:.80} is not a tuple")
    seen = set()
    for route in value:
        if not (isinstance(route, tuple) and len(route) == 2 and isinstance(route[1], bool)):
            raise ValueError(f"route {route!r:.80} is not a (destination, ordered) pair")
        name = destination_name(route[0])
        if name in seen:
            raise ValueError(f"destination {name!r} is routed twice")
        seen.add(name)
    return value


def table_name(value: Any) -> str:
    if not isinstance(value, str) or not TABLE_NAME.fullmatch(value):
        raise ValueError(f"table name {value!r} does not match {TABLE_NAME.pattern}")
    return value


def update_id(value: Any) -> int:
    if not _is_int(value) or not 0 <= value <= MAX_BIGINT:
        raise ValueError(f"update_id {value!r} is not an integer in [0, 2**63-1]")
    return int(value)


def millis(name: str, value: Any) -> int:
    """An epoch-millisecond time: a plain int, never a float or a bool."""
    if not _is_int(value) or not -MAX_BIGINT <= value <= MAX_BIGINT:
        raise ValueError(f"{name} {value!r} is not an integer of epoch milliseconds")
    return int(value)


def positive(name: str, value: Any) -> int:
    if not _is_int(value) or not 0 < value <= MAX_BIGINT:
        raise ValueError(f"{name} {value!r} is not a positive integer")
    return int(value)


def attempts(name: str, value: Any) -> int:
    """An attempt number or budget: positive and within the INTEGER column."""
    if not _is_int(value) or not 0 < value <= MAX_INTEGER:
        raise ValueError(f"{name} {value!r} is not an integer in [1, 2**31-1]")
    return int(value)


def count(name: str, value: Any) -> int:
    """A count kept in an INTEGER column: zero or more."""
    if not _is_int(value) or not 0 <= value <= MAX_INTEGER:
        raise ValueError(f"{name} {value!r} is not an integer in [0, 2**31-1]")
    return int(value)


def flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} {value!r} is not a bool")
    return value


def body(value: Any) -> str:
    """The raw update: text both backends store as it is (UTF-8, no NUL character)."""
    if not isinstance(value, str):
        raise ValueError(f"body {value!r:.80} is not a string")
    if "\x00" in value:
        raise ValueError("body contains a NUL character, which PostgreSQL text cannot hold")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"body is not valid UTF-8 text ({error.reason})") from None
    return value


def text(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} {value!r} is not a string")
    return value


# W3C Trace Context's traceparent, version 00: trace id and parent id, neither all zeros.
TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")


def trace_context(value: Any) -> str | None:
    """A W3C `traceparent` (version 00), or None."""
    if value is not None and (not isinstance(value, str) or not TRACEPARENT.fullmatch(value)):
        raise ValueError(f"trace_context {value!r:.80} is not a W3C traceparent (version 00)")
    return value


def optional_text(name: str, value: Any) -> str | None:
    return None if value is None else text(name, value)


def status(name: str, value: Any) -> int | None:
    """An HTTP status code, or None."""
    if value is not None and (not _is_int(value) or not 100 <= value <= 599):
        raise ValueError(f"{name} {value!r} is not an HTTP status code in [100, 599]")
    return None if value is None else int(value)


# Rates, per second: from one per 1,000 s (a redrive paced slower would push due times past
# BIGINT) to a million.
MIN_RATE = 0.001
MAX_RATE = 1_000_000


def rate(name: str, value: Any) -> float | None:
    """Attempts per second: a number in [MIN_RATE, MAX_RATE], or None for no limit."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} {value!r} is not a number")
    if not MIN_RATE <= value <= MAX_RATE:
        raise ValueError(f"{name} {value!r} is not in [{MIN_RATE}, {MAX_RATE}] per second")
    return float(value)
