"""The one JSON reader of the service: the webhook's bodies and the `/v1` API's alike.

A body is read only if it keeps I-JSON's rules (RFC 7493, on top of RFC 8259), where the
parsers a downstream may use stop agreeing on what a text means:
- UTF-8, and nothing else: no byte-order mark, no UTF-16 or UTF-32;
- no duplicate member names (parsers disagree on which one wins);
- no lone UTF-16 surrogate escape (`"\\ud800"`): no UTF-8 text can carry it;
- no number beyond a double's range, written as a fraction (`1e999999999`) or as an integer
  of more than 309 digits; no NaN or Infinity. (A number too small for a double, `1e-400`,
  reads as 0.0, as every parser of doubles reads it.)
- nesting no deeper than MAX_DEPTH (512) arrays and objects: a fixed limit, well inside the
  parser's recursion limit from any caller, so every route answers the same body alike.

`\\u0000` is valid JSON and I-JSON allows it, so it is read and kept: the body is stored as
text, verbatim, where it stays the six characters of its escape. PostgreSQL's `jsonb` refuses
it; a downstream that casts bodies to `jsonb` must expect it (Telegram has not been seen to
send it). Noncharacters (U+FFFE, U+FFFF, ...) are valid UTF-8 and are kept too.
"""

from __future__ import annotations

import json
import math
import re
from itertools import accumulate
from typing import Any

__all__ = ["MAX_DEPTH", "NotJson", "read_json"]


class NotJson(ValueError):
    """The body is not strict JSON; `str(error)` says what is wrong, for a 400."""


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    built = dict(pairs)
    if len(built) != len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise NotJson(
                    f"body is not JSON: the name {name[:64]!r} appears twice in an object"
                )
            seen.add(name)
    return built


def _float(literal: str) -> float:
    value = float(literal)
    if math.isinf(value):
        raise NotJson("body is not JSON: a number is beyond the range of a double")
    return value


def _constant(name: str) -> Any:
    """NaN and Infinity: Python's json reads them; JSON (and Telegram) has no such thing."""
    raise NotJson(f"body is not JSON: {name} is not a JSON value")


# Built once: json.loads with any option builds a decoder on every call.
_DECODER = json.JSONDecoder(object_pairs_hook=_object, parse_float=_float, parse_constant=_constant)
# An integer literal of more than 309 digits is beyond a double (about 1.8e308): JavaScript
# reads it as Infinity. Only a text with such a run of digits (in a string, too) is checked.
_LONG_DIGITS = re.compile(r"[0-9]{310}")


def _integer(literal: str) -> int:
    if len(literal.lstrip("-")) > 309:
        raise NotJson("body is not JSON: a number is beyond the range of a double")
    return int(literal)


_STRICT_INTEGERS = json.JSONDecoder(
    object_pairs_hook=_object, parse_float=_float, parse_constant=_constant, parse_int=_integer
)
# A surrogate escape, paired or not (or text after an escaped backslash that looks like one):
# only a body with one pays for the exact check below.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
MAX_DEPTH = 512  # arrays and objects open at once; Telegram's updates nest a few levels
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def _too_deep(text: str) -> bool:
    """Whether more than MAX_DEPTH arrays and objects are open at once somewhere in `text`.
    Only a text with more brackets than that can be, so only such a text is scanned (outside
    strings, in C loops: a few ms for 64 KiB of brackets)."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return False
    brackets = _NOT_BRACKETS.sub("", _STRING.sub("", text))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0) > MAX_DEPTH


def read_json(body: bytes) -> tuple[str, Any]:
    """The body as text and its JSON value; NotJson if any strict parser could disagree."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise NotJson("body is not UTF-8") from None
    if _too_deep(text):
        raise NotJson("body is not JSON: nested too deep")
    try:
        value = _DECODER.decode(text)
    except NotJson:
        raise
    except RecursionError:
        raise NotJson("body is not JSON: nested too deep") from None
    except json.JSONDecodeError as error:
        # The position only, never the text: the message may be logged or shown.
        raise NotJson(f"body is not JSON: {error.msg} at character {error.pos}") from None
    except ValueError:
        # int() refuses more than sys.get_int_max_str_digits() digits.
        raise NotJson("body is not JSON: a number is beyond the range of a double") from None
    if _LONG_DIGITS.search(text) is not None:
        try:
            _STRICT_INTEGERS.decode(text)  # raises NotJson for an integer past a double
        except RecursionError:  # parse_int takes a frame more than decoding did
            raise NotJson("body is not JSON: nested too deep") from None
    if _SURROGATE_ESCAPE.search(text) is not None:
        # Only a well-formed pair decodes to a character UTF-8 can encode; escapes are the
        # only way a lone surrogate gets in, since the text itself is valid UTF-8.
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise NotJson("body is not JSON: a string holds a lone UTF-16 surrogate") from None
        except RecursionError:  # encoding takes a frame or two more than decoding did
            raise NotJson("body is not JSON: nested too deep") from None
    return text, value
