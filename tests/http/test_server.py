"""The server's connection limits (app.http.server) on a real uvicorn server with small limits:
each is exact at its edge, and none cuts a request that keeps within it (a large body sent at
once, pipelined requests, a slow answer, a busy connection when the limit is reached)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from app.http.connection_limits import ConnectionLimits
from app.http.one_write import HeadWithBody
from tests.conftest import serve_asgi
from tests.http.raw import Answer, closed, connect, head, is_open, read_answer, read_answers

MAX_HEADER_BYTES = 4096
LIMITS = dict(
    header_timeout_seconds=1.0,
    body_timeout_seconds=1.0,
    keep_alive_seconds=1,
    max_header_bytes=MAX_HEADER_BYTES,
    max_headers=20,
    connection_limit=40,
)


async def _fast(_request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


async def _slow(_request: Request) -> PlainTextResponse:
    await asyncio.sleep(2)  # longer than every deadline
    return PlainTextResponse("slow")


async def _length(request: Request) -> PlainTextResponse:
    return PlainTextResponse(str(len(await request.body())))


APP = Starlette(
    routes=[
        Route("/fast", _fast),
        Route("/slow", _slow),
        Route("/length", _length, methods=["POST"]),
    ]
)


class Served:
    def __init__(self, port: int, closes: Counter[str]) -> None:
        self.port = port
        self.closes = closes


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    closes: Counter[str] = Counter()
    limits = ConnectionLimits(**LIMITS, on_close=lambda reason: closes.update([reason]))
    async with serve_asgi(APP, limits=limits) as base:
        yield Served(int(base.rsplit(":", 1)[1]), closes)


async def _closes_within(sock: socket.socket, seconds: float) -> None:
    """The server closes `sock` within `seconds` from now."""
    started = time.monotonic()
    assert await asyncio.to_thread(closed, sock, seconds + 2)
    assert time.monotonic() - started < seconds


def _get(path: str, headers: list[tuple[str, str]] | None = None) -> bytes:
    return head("GET", path, headers or [])


def _head_of(size: int) -> bytes:
    """A GET whose head is exactly `size` bytes, line breaks included."""
    bare = len(_get("/fast", [("x-pad", "")]))
    return _get("/fast", [("x-pad", "p" * (size - bare))])


async def test_a_head_at_the_size_limit_is_served_and_one_byte_more_is_431(served: Served) -> None:
    # The limit counts the request line and the headers, each with its ": " and line break;
    # the host line and the blank line end it.
    for size, status in ((MAX_HEADER_BYTES - 8, 200), (MAX_HEADER_BYTES + 200, 431)):
        with connect(served.port) as sock:
            sock.sendall(_head_of(size))
            answer = await asyncio.to_thread(read_answer, sock)
        assert answer.status == status, size
    assert served.closes == {"header_too_large": 1}


async def test_a_head_sent_a_chunk_at_a_time_is_counted_as_it_grows(served: Served) -> None:
    with connect(served.port) as sock:
        sock.sendall(b"GET /fast HTTP/1.1\r\nhost: x\r\nx-long: ")
        for _ in range(10):
            try:
                sock.sendall(b"a" * 1000)
            except (BrokenPipeError, ConnectionResetError):
                break
            await asyncio.sleep(0.01)
        answer = await asyncio.to_thread(read_answer, sock)
    assert answer.status == 431
    assert answer.closed


async def test_twenty_headers_are_served_and_twenty_one_are_431(served: Served) -> None:
    # The host line is one of them.
    for count, status in ((19, 200), (20, 431)):
        with connect(served.port) as sock:
            sock.sendall(_get("/fast", [(f"x-{n}", "v") for n in range(count)]))
            answer = await asyncio.to_thread(read_answer, sock)
        assert answer.status == status, count


async def test_a_large_body_sent_with_its_head_is_no_part_of_the_head(served: Served) -> None:
    body = b"b" * 900_000
    request = head("POST", "/length", [("content-length", str(len(body)))]) + body
    with connect(served.port) as sock:
        sock.sendall(request)
        answer = await asyncio.to_thread(read_answer, sock)
    assert (answer.status, answer.body) == (200, b"900000")


async def test_pipelined_requests_after_a_large_body_are_all_served(served: Served) -> None:
    body = b"b" * 100_000
    first = head("POST", "/length", [("content-length", str(len(body)))]) + body
    with connect(served.port) as sock:
        sock.sendall(first + _get("/fast") + first)
        answers = await asyncio.to_thread(read_answers, sock, 3)
    assert [(a.status, a.body) for a in answers] == [
        (200, b"100000"), (200, b"ok"), (200, b"100000")
    ]  # fmt: skip


async def test_a_slow_answer_outlives_every_deadline(served: Served) -> None:
    with connect(served.port) as sock:
        sock.sendall(_get("/slow"))
        answer = await asyncio.to_thread(read_answer, sock, 10)
    assert (answer.status, answer.body) == (200, b"slow")
    assert served.closes == {}


async def test_keep_alive_serves_the_next_request_then_closes_when_silent(served: Served) -> None:
    with connect(served.port) as sock:
        sock.sendall(_get("/fast"))
        assert (await asyncio.to_thread(read_answer, sock)).status == 200
        await asyncio.sleep(0.5)
        sock.sendall(_get("/fast"))
        assert (await asyncio.to_thread(read_answer, sock)).status == 200
        started = time.monotonic()
        assert await asyncio.to_thread(closed, sock, 5)
        assert 0.5 < time.monotonic() - started < 3


async def test_a_silent_connection_is_closed_at_the_header_timeout_without_an_answer(
    served: Served,
) -> None:
    with connect(served.port) as sock:
        started = time.monotonic()
        await asyncio.sleep(0.5)
        assert is_open(sock)
        assert await asyncio.to_thread(closed, sock, 5)
        assert time.monotonic() - started < 3
        assert sock.recv(100) == b""  # closed, with no 408: no request had begun
    assert served.closes == {"header_timeout": 1}


async def test_half_a_body_is_closed_at_the_body_timeout(served: Served) -> None:
    with connect(served.port) as sock:
        sock.sendall(head("POST", "/length", [("content-length", "100")]) + b"half")
        await _closes_within(sock, 3)
    assert served.closes == {"body_timeout": 1}


async def test_past_the_connection_limit_the_longest_waiting_is_closed_never_a_busy_one(
    served: Served,
) -> None:
    busy = connect(served.port)
    busy.sendall(_get("/slow"))
    await asyncio.sleep(0.2)
    idle = []
    for _ in range(60):
        idle.append(connect(served.port))
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.2)
    try:
        open_now = [is_open(sock) for sock in idle]
        # The first ones were evicted to make room; the newest are still open.
        assert not any(open_now[:15]), open_now
        assert all(open_now[-30:]), open_now
        assert (await asyncio.to_thread(read_answer, busy, 10)).body == b"slow"
        with connect(served.port) as fresh:
            fresh.sendall(_get("/fast"))
            assert (await asyncio.to_thread(read_answer, fresh)).status == 200
    finally:
        busy.close()
        for sock in idle:
            sock.close()
    assert served.closes["evicted"] >= 20


def test_the_connection_limit_fits_the_files_the_process_may_open() -> None:
    # In a child: it lowers its own limits, which cannot be raised again.
    script = (
        "import dataclasses, resource\n"
        "from app.http.connection_limits import ConnectionLimits\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
        "limits = dataclasses.replace(ConnectionLimits.defaults(), connection_limit=1000)\n"
        "print(limits.usable_connection_limit(),"
        " resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (700, 700))\n"
        "print(limits.usable_connection_limit())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout.split()
    # The soft limit rises as far as needed (1,000 + 512 reserved) under the hard one...
    assert out[:2] == ["1000", "1512"]
    # ...and where the hard one is lower, the connection limit comes down under it.
    assert out[2] == str(700 - 512)


# -- found in review: answered early, pipelining, trailers ---------------------------------


async def test_a_connection_answered_before_its_body_came_closes_when_silent(
    served: Served,
) -> None:
    with connect(served.port) as sock:
        sock.sendall(head("POST", "/fast", [("content-length", "7")]))  # GET only: 405
        assert (await asyncio.to_thread(read_answer, sock)).status == 405
        sock.sendall(b"{}     ")  # the body comes after its answer, then nothing
        await _closes_within(sock, 3)
    assert served.closes == {"keep_alive": 1}


async def test_a_connection_answered_early_whose_body_never_ends_meets_the_body_timeout(
    served: Served,
) -> None:
    with connect(served.port) as sock:
        sock.sendall(head("POST", "/fast", [("content-length", "1000")]) + b"x")
        assert (await asyncio.to_thread(read_answer, sock)).status == 405
        assert await asyncio.to_thread(closed, sock, 5)
    assert served.closes == {"body_timeout": 1}


async def test_a_connection_busy_with_a_pipelined_request_is_never_evicted(
    served: Served,
) -> None:
    busy = connect(served.port)
    busy.sendall(_get("/fast") + _get("/slow"))
    idle = []
    try:
        first = await asyncio.to_thread(read_answers, busy, 1)
        assert first[0].body == b"ok"
        for _ in range(60):  # past connection_limit (40): the idle ones make room
            idle.append(connect(served.port))
            await asyncio.sleep(0.005)
        assert (await asyncio.to_thread(read_answer, busy, 10)).body == b"slow"
    finally:
        busy.close()
        for sock in idle:
            sock.close()
    assert served.closes["evicted"] >= 20


async def test_a_body_larger_than_the_head_limit_then_a_pipelined_head_is_no_431(
    served: Served,
) -> None:
    body = b"b" * 20_000  # five times max_header_bytes, in the same chunk as the next head
    request = head("POST", "/length", [("content-length", str(len(body)))]) + body
    second = _get("/fast")
    with connect(served.port) as sock:
        sock.sendall(request + second[:10])
        await asyncio.sleep(0.1)
        sock.sendall(second[10:])
        answers = await asyncio.to_thread(read_answers, sock, 2)
    assert [(a.status, a.body) for a in answers] == [(200, b"20000"), (200, b"ok")]


async def test_requests_pipelined_behind_a_slow_one_wait_without_a_deadline(
    served: Served,
) -> None:
    body = b"b" * 10
    pipelined = (
        _get("/slow")  # 2 s: twice every deadline
        + head("POST", "/length", [("content-length", str(len(body)))])
        + body
        + _get("/fast")
        + _get("/fast")
    )
    with connect(served.port) as sock:
        sock.sendall(pipelined)
        answers = await asyncio.to_thread(read_answers, sock, 4, 15)
    assert [a.body for a in answers] == [b"slow", b"10", b"ok", b"ok"]
    assert served.closes == {}


async def test_trailers_over_the_head_limit_close_the_connection_without_an_answer_of_ours(
    served: Served,
) -> None:
    def chunked(trailers: list[tuple[str, str]]) -> bytes:
        lines = "".join(f"{name}: {value}\r\n" for name, value in trailers)
        return (
            head("POST", "/length", [("transfer-encoding", "chunked")])
            + b"5\r\nhello\r\n0\r\n"
            + lines.encode()
            + b"\r\n"
        )

    with connect(served.port) as sock:
        sock.sendall(chunked([("x-trailer", "t")]))
        assert (await asyncio.to_thread(read_answer, sock)).body == b"5"
    with connect(served.port) as sock:
        sock.sendall(chunked([(f"x-t{n}", "t" * 500) for n in range(20)]))
        said = await asyncio.to_thread(_all_until_closed, sock)
    # The app had the request: a 431 of the server's would land in the middle of its answer.
    assert b"431" not in said
    assert served.closes == {"header_too_large": 1}


def _all_until_closed(sock: socket.socket, within: float = 5) -> bytes:
    sock.settimeout(within)
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


class _Writes:
    """A transport that records each write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def test_a_whole_answer_leaves_in_one_write_an_interim_100_at_once() -> None:
    transport = _Writes()
    held = HeadWithBody(transport)  # type: ignore[arg-type]
    held.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert transport.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    held.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    assert len(transport.writes) == 1  # the head waits for the body
    held.write(b"ok")
    held.write(b"HTTP/1.1 200 is a body too, once the head has gone")
    assert transport.writes[1:] == [
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
        b"HTTP/1.1 200 is a body too, once the head has gone",
    ]
    assert not held.is_closing()


def test_a_held_head_goes_out_before_the_connection_closes() -> None:
    transport = _Writes()
    held = HeadWithBody(transport)  # type: ignore[arg-type]
    held.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    held.close()
    assert transport.writes == [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"]
    assert transport.closed
    assert held.is_closing()


async def test_expect_100_continue_then_the_body_then_one_answer(served: Served) -> None:
    def exchange() -> tuple[bytes, Answer]:
        with connect(served.port) as sock:
            body = b"x" * 1000
            headers = [("content-length", str(len(body))), ("expect", "100-continue")]
            sock.sendall(head("POST", "/length", headers))
            interim = sock.recv(65536)  # the server asks for the body before the app reads it
            sock.sendall(body)
            return interim, read_answer(sock)

    interim, answer = await asyncio.to_thread(exchange)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert (answer.status, answer.body) == (200, b"1000")


async def test_a_head_request_is_answered_with_its_head_alone(served: Served) -> None:
    def exchange() -> bytes:
        with connect(served.port) as sock:
            sock.sendall(head("HEAD", "/fast", []))
            sock.settimeout(5)
            return sock.recv(65536)

    data = await asyncio.to_thread(exchange)
    assert data.startswith(b"HTTP/1.1 200 OK\r\n")
    assert data.endswith(b"\r\n\r\n")
