"""The strict JSON reader (app.http.strict_json): every rule refuses what it names and nothing
else. The generated cases hold it to Python's own json on every body Python writes, so a
rule can never refuse JSON that a strict parser reads alike."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.http.strict_json import MAX_DEPTH, NotJson, read_json

REFUSED = [
    (b'{"update_id": 1701, "update_id": 1702}', "the name 'update_id' appears twice"),
    (b'{"a": {"b": 1, "b": 1}}', "the name 'b' appears twice"),  # the same value twice too
    (b'[{"x": 1}, {"y": 1, "y": 2}]', "the name 'y' appears twice"),
    (b'{"x": "\\ud800"}', "lone UTF-16 surrogate"),
    (b'{"x": "\\udc00"}', "lone UTF-16 surrogate"),
    (b'{"x": "\\ud83d\\u0041"}', "lone UTF-16 surrogate"),  # a high one, then no low one
    (b'{"\\ud800": 1}', "lone UTF-16 surrogate"),  # in a name
    (b'["\\ude00\\ud83d"]', "lone UTF-16 surrogate"),  # a pair the wrong way round
    # Text that looks like a high escape (an escaped backslash, then "ud83d"), then a low one.
    (b'["\\\\ud83d\\ude00"]', "lone UTF-16 surrogate"),
    (b'["\\\\\\ud83d"]', "lone UTF-16 surrogate"),  # an escaped backslash, then a lone one
    (b'{"x": 1e999999999}', "beyond the range of a double"),
    (b'{"x": -1e400}', "beyond the range of a double"),
    (b'{"x": NaN}', "NaN is not a JSON value"),
    (b'{"x": ' + b"1" * 310 + b"}", "beyond the range of a double"),  # JavaScript: Infinity
    (b'{"x": -' + b"1" * 310 + b"}", "beyond the range of a double"),
    (b'{"x": -Infinity}', "-Infinity is not a JSON value"),
    (b'{"x": ' + b"9" * 5_000 + b"}", "beyond the range of a double"),
    (b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deep"),
    (b'\xef\xbb\xbf{"update_id": 1}', "Expecting value at character 0"),  # a BOM
    (b'{"update_id": 1}'.decode().encode("utf-16"), "body is not UTF-8"),
    (b'{"x": "\xff"}', "body is not UTF-8"),
    (b'{"x": "\xed\xa0\x80"}', "body is not UTF-8"),  # a surrogate in UTF-8 bytes
    (b'{"x": 1', "Expecting ',' delimiter at character 7"),
    (b"", "Expecting value at character 0"),
    (b'{"x": "a\x00"}', "Invalid control character"),  # a raw NUL, not its escape
    (b'{"x": 1} {"y": 2}', "Extra data"),
]


@pytest.mark.parametrize(("body", "problem"), REFUSED)
def test_read_json_refuses_what_a_strict_parser_could_read_otherwise(
    body: bytes, problem: str
) -> None:
    with pytest.raises(NotJson) as refused:
        read_json(body)
    assert problem in str(refused.value)
    assert str(refused.value).startswith("body is not ")


ACCEPTED: list[tuple[bytes, Any]] = [
    (b'{"x": "\\ud83d\\ude00"}', {"x": "\U0001f600"}),  # a pair is one character
    (b'{"x": "\\\\ud800"}', {"x": "\\ud800"}),  # an escaped backslash, then text
    (b'{"x": "\\\\\\ud83d\\ude00"}', {"x": "\\\U0001f600"}),
    (b'{"x": "\\\\ud800\\\\udc00"}', {"x": "\\ud800\\udc00"}),  # text, not escapes
    (b'{"x": "\\u0000"}', {"x": "\0"}),  # valid JSON and I-JSON: kept (the module says why)
    (b'{"x": "\xef\xbf\xbf"}', {"x": "\uffff"}),  # a noncharacter is valid UTF-8
    (b'{"x": 1e308, "y": -0.0, "z": 5e-324}', {"x": 1e308, "y": -0.0, "z": 5e-324}),
    (b'{"x": ' + b"9" * 309 + b"}", {"x": int("9" * 309)}),  # still under 1.8e308
    (b'{"x": "' + b"9" * 400 + b'", "y": 1}', {"x": "9" * 400, "y": 1}),  # digits in a string
    (b'{"x": 1e-400}', {"x": 0.0}),  # too small for a double: 0, as every parser reads it
    (b'{"x": 1.0}', {"x": 1.0}),  # read as written; the fields decide what they take
    (b' \r\n\t{"a": {}, "b": {}} \n', {"a": {}, "b": {}}),  # the same name in two objects
    (b'"text"', "text"),
]


@pytest.mark.parametrize(("body", "value"), ACCEPTED)
def test_read_json_reads_valid_json_as_written(body: bytes, value: Any) -> None:
    text, read = read_json(body)
    assert read == value
    assert text == body.decode("utf-8")


def test_a_read_float_keeps_its_type() -> None:
    assert type(read_json(b"[1.0]")[1][0]) is float
    assert type(read_json(b"[1]")[1][0]) is int


def _containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5)


values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    _containers,
    max_leaves=30,
)


@given(value=values, ascii_only=st.booleans())
@settings(max_examples=500, deadline=None)
def test_read_json_reads_whatever_json_dumps_writes_as_json_loads_does(
    value: Any, ascii_only: bool
) -> None:
    # What Python writes, with its \u escapes (ensure_ascii) or raw UTF-8: hypothesis's text
    # holds no lone surrogate unless asked, and dicts have no duplicate names.
    body = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8")
    assert read_json(body)[1] == json.loads(body)


# Text with lone surrogates and backslashes, written with \u escapes: the reader refuses it
# exactly when a string holds a lone surrogate.
risky_text = st.text(
    alphabet=st.sampled_from(
        ["a", "\\", "u", "d", "8", "\ud83d", "\ude00", "\U0001f600", "\ud800"]
    ),
    max_size=12,
)


@given(strings=st.lists(risky_text, min_size=1, max_size=4))
@settings(max_examples=1_000, deadline=None)
def test_read_json_refuses_exactly_the_bodies_with_a_lone_surrogate(strings: list[str]) -> None:
    body = json.dumps(strings).encode("utf-8")  # ensure_ascii: every surrogate as an escape

    def lone(text: str) -> bool:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False

    # json.loads pairs a high and a low escape into one character, as UTF-16 does.
    decoded = json.loads(body)
    if any(lone(text) for text in decoded):
        with pytest.raises(NotJson, match="lone UTF-16 surrogate"):
            read_json(body)
    else:
        assert read_json(body)[1] == decoded


def test_read_json_refuses_at_the_depth_limit_and_never_raises_past_it() -> None:
    # The limit is MAX_DEPTH, whatever the caller's stack: up to it a body is read, past it
    # refused, and never a crash near the parser's own recursion limit (the surrogate check
    # and the long-integer check each take a frame or two more than decoding did).
    for depth in range(400, 1_050):
        for inner in (b'"\\ud83d\\ude00"', b"1" * 309, b"1" * 310):
            body = b'{"x": ' + b"[" * depth + inner + b"]" * depth + b"}"
            if depth + 1 > MAX_DEPTH:  # the object and its arrays
                with pytest.raises(NotJson, match="nested too deep"):
                    read_json(body)
            elif len(inner) == 310:
                with pytest.raises(NotJson, match="beyond the range of a double"):
                    read_json(body)
            else:
                assert read_json(body)[1]["x"], depth
    # Brackets inside strings are text, not nesting.
    assert read_json(b'{"x": "' + b"[" * 5_000 + b'"}')[1] == {"x": "[" * 5_000}
