"""Hostile input against a running `telegram-intake serve` process on each backend (issues 7
and 20).

Generated bodies (anything at all, JSON of every shape, updates with a mangled `update_id`,
deep nesting, huge numbers, invalid UTF-8) under assorted content types; bodies that stop
half-way or trickle in; hundreds of idle connections. Throughout: nothing answers 500; a 200
comes exactly for a well-formed update, and the table then holds exactly the well-formed
updates posted (the first body of each update_id, verbatim), nothing else; the process stays
up and answers; its memory stays bounded.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import BACKENDS, module_storage, table_rows
from tests.hostile.campaign import Target, start_target
from tests.processes import SECRET

pytestmark = pytest.mark.slow

MAX_BIGINT = 2**63 - 1
BODY_LIMIT = 64 * 1024
HEADERS = {"x-telegram-bot-api-secret-token": SECRET}


class Intake(Target):
    def __init__(self, target: Target) -> None:
        super().__init__(target.process, target.port, target.url)
        self.http = httpx.Client(base_url=self.base, timeout=30)
        self.stored: dict[int, str] = {}  # update_id -> the first well-formed body posted

    def alive(self) -> bool:
        return self.process.poll() is None and self.http.get("/healthz").status_code == 200

    def post(self, body: bytes, content_type: str | None = "application/json") -> int:
        headers = dict(HEADERS)
        if content_type is not None:
            headers["content-type"] = content_type
        status = self.http.post("/telegram/default", content=body, headers=headers).status_code
        update = well_formed(body)
        assert status != 500, body[:200]
        if update is AMBIGUOUS:
            assert status in (200, 400), (status, body[:200])
            if status == 200:
                self.stored.setdefault(json.loads(body)["update_id"], body.decode())
        elif update is None:
            assert status in (400, 413), (status, body[:200])
        else:
            assert status == 200, (status, body[:200])
            self.stored.setdefault(update["update_id"], body.decode())
        return status


AMBIGUOUS: dict[str, Any] = {}


def well_formed(body: bytes) -> dict[str, Any] | None:
    """The oracle: what Telegram could send (UTF-8 JSON object, update_id 0..2**63-1), read
    strictly: no duplicate names, no lone surrogate, no number beyond a double (issue 20).
    JSON nested about a thousand levels deep meets the parser's recursion limit, which
    depends on the stack the server parses it on: from 500 levels to 2,000 either answer is
    right (`AMBIGUOUS`), deeper it is refused."""
    if len(body) > BODY_LIMIT:
        return None
    depth = _depth(body)
    if depth > 2_000:
        return None
    if depth > 500:
        return AMBIGUOUS if well_formed(_flattened(body)) is not None else None

    def no_constants(name: str) -> Any:
        raise ValueError(name)

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        if len({name for name, _ in pairs}) != len(pairs):
            raise ValueError("duplicate")
        return dict(pairs)

    try:
        update = json.loads(
            body.decode("utf-8"),
            parse_constant=no_constants,
            object_pairs_hook=no_duplicates,
        )
        _encodable(update)
    except (UnicodeError, ValueError, RecursionError, OverflowError):
        return None
    if not isinstance(update, dict):
        return None
    update_id = update.get("update_id")
    if type(update_id) is not int or not 0 <= update_id <= MAX_BIGINT:
        return None
    return update


def _encodable(value: Any) -> None:
    """UnicodeError for a lone surrogate anywhere, OverflowError for an infinite number."""
    if isinstance(value, dict):
        for name, item in value.items():
            name.encode("utf-8")
            _encodable(item)
    elif isinstance(value, list):
        for item in value:
            _encodable(item)
    elif isinstance(value, str):
        value.encode("utf-8")
    elif isinstance(value, float) and value in (float("inf"), float("-inf")):
        raise OverflowError(value)


def _depth(body: bytes) -> int:
    """The deepest nesting of brackets outside strings (a rough scan is enough here)."""
    deepest = depth = 0
    in_string = escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def _flattened(body: bytes) -> bytes:
    """The body with every bracketed run inside the top-level object collapsed (for the
    oracle's verdict on everything but the depth)."""
    return re.sub(rb"\[+\]+", b"[]", body)


@pytest.fixture(scope="module", params=BACKENDS)
def intake(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Intake]:
    with module_storage(request, tmp_path_factory, "hostile") as (directory, storage):
        served = Intake(start_target(directory, storage.url(), max_body_bytes=BODY_LIMIT))
        try:
            yield served
            assert served.alive(), served.process.report()
            rows = table_rows(served.url, "update_id", "body")
            assert dict(rows) == served.stored  # exactly the well-formed updates, verbatim
        finally:
            served.http.close()
            served.process.kill()


# -- generated bodies ----------------------------------------------------------------------

update_ids = st.one_of(
    st.integers(min_value=0, max_value=MAX_BIGINT),
    st.integers(min_value=MAX_BIGINT + 1, max_value=2**70),
    st.integers(max_value=-1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.none(),
    st.text(max_size=20),
    st.just("HUGE"),  # written as 5,000 digits: over Python's limit for int(), json refuses it
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["update", "json", "bytes", "nested", "mangled"]))
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    if kind == "json":
        value = draw(json_values)
        return json.dumps(value, allow_nan=True).encode()
    if kind == "nested":
        depth = draw(st.sampled_from([10, 400, 1_000, 100_000]))
        inner = "[" * depth + "]" * depth
        return f'{{"update_id": 1, "deep": {inner}}}'.encode()
    update: dict[str, Any] = {"update_id": draw(update_ids), "message": draw(json_values)}
    text = json.dumps(update, allow_nan=True).replace('"HUGE"', "9" * 5_000)
    if kind == "mangled":
        position = draw(st.integers(0, len(text)))
        junk = draw(st.binary(min_size=1, max_size=4))
        return text.encode()[:position] + junk + text.encode()[position:]
    return text.encode()


content_types = st.sampled_from(
    [None, "application/json", "text/plain", "application/x-www-form-urlencoded",
     "multipart/form-data; boundary=x", "application/json; charset=latin-1"]
)  # fmt: skip


@given(body=bodies(), content_type=content_types)
@settings(
    max_examples=400,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_generated_bodies_get_200_exactly_when_well_formed(
    intake: Intake, body: bytes, content_type: str | None
) -> None:
    intake.post(body, content_type)


def test_edge_bodies(intake: Intake) -> None:
    edges = [
        b"", b"{", b"null", b"[]", b'"update"', b"{}", b'{"update_id": NaN}',
        b'{"update_id": Infinity}', b'{"update_id": 1e3}', b'{"update_id": -0}',
        b'{"update_id": 9223372036854775808}', b'{"update_id": 9223372036854775807}',
        b'{"update_id": 42, "text": "\xff\xfe"}', b'\xef\xbb\xbf{"update_id": 43}',
        b'{"update_id": 44, "update_id": "dup"}', b'{"update_id": 45, "x": "\\ud800"}',
        b'{"update_id": 48, "x": 1e999999999}', b'{"update_id": 49, "x": "\\u0000"}',
        b'{"update_id": 50, "x": "\\ud83d\\ude00", "y": "\\\\ud800"}',
        b'{"update_id": 46}' + b" " * (BODY_LIMIT - 16), b'{"update_id": 47}' + b" " * BODY_LIMIT,
    ]  # fmt: skip
    for body in edges:
        intake.post(body)


# -- bodies that never arrive whole, and many connections ---------------------------------


def _connect(intake: Intake) -> socket.socket:
    return socket.create_connection(("127.0.0.1", intake.port), timeout=10)


def _request_head(length: int, chunked: bool = False) -> bytes:
    framing = "transfer-encoding: chunked" if chunked else f"content-length: {length}"
    return (
        f"POST /telegram/default HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"x-telegram-bot-api-secret-token: {SECRET}\r\n{framing}\r\n\r\n"
    ).encode()


def test_truncated_and_trickled_bodies_store_nothing_and_block_no_one(intake: Intake) -> None:
    body = json.dumps({"update_id": 777_001, "message": {"text": "never whole"}}).encode()
    truncated = _connect(intake)
    truncated.sendall(_request_head(len(body)) + body[: len(body) // 2])
    truncated.close()
    trickling = _connect(intake)
    trickling.sendall(_request_head(len(body) + 1000))
    for byte in body[:20]:
        trickling.sendall(bytes([byte]))
        # Others are served while this body trickles in.
        assert intake.post(json.dumps({"update_id": 700_000 + byte}).encode()) == 200
        time.sleep(0.05)
    trickling.close()
    chunked = _connect(intake)  # a chunked body that stops mid-chunk
    chunked.sendall(_request_head(0, chunked=True) + b"100\r\n" + body[:30])
    chunked.close()
    time.sleep(0.5)
    assert 777_001 not in {update_id for (update_id,) in table_rows(intake.url, "update_id")}
    assert intake.alive()


def test_hundreds_of_idle_connections_do_not_stop_the_intake(intake: Intake) -> None:
    idle = [_connect(intake) for _ in range(500)]
    try:
        assert intake.post(json.dumps({"update_id": 888_001}).encode()) == 200
    finally:
        for connection in idle:
            connection.close()
    assert intake.alive()


def test_memory_stays_bounded_under_large_and_deep_bodies(intake: Intake) -> None:
    for n in range(50):  # warm up: the allocator's pools, prepared statements
        intake.post(json.dumps({"update_id": 900_000 + n, "pad": "x" * 1000}).encode())
    before = intake.rss_kib()
    deep = b'{"update_id": 2, "deep": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"
    for n in range(300):
        intake.post(b'{"update_id": 3, "pad": "' + b"y" * (4 * BODY_LIMIT) + b'"}')  # 413
        intake.post(deep)  # 400: nested too deep for the parser
        intake.post(json.dumps({"update_id": 910_000 + n, "pad": "z" * 30_000}).encode())
    grown = intake.rss_kib() - before
    # 900 requests of 30 KiB to 256 KiB each: a leak of any of them would be tens of MiB.
    assert grown < 32 * 1024, f"RSS grew by {grown} KiB"
