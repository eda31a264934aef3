"""HTTP/1.1 by hand over a plain socket, for requests no client library would send: a head
without its body, a body that stops half-way, doubled headers, a head that never ends. The
answer is parsed with h11 (httpx's own parser)."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field

import h11


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes = b""
    closed: bool = False  # the server closed the connection after it
    extra: list[tuple[str, str]] = field(default_factory=list)  # every header, in order


def connect(port: int, timeout: float = 10) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


def head(
    method: str,
    path: str,
    headers: list[tuple[str, str]],
    *,
    host: str = "127.0.0.1",
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"host: {host}"]
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def read_answer(sock: socket.socket, timeout: float = 10) -> Answer:
    """The next response on `sock`; AssertionError if none comes within `timeout`."""
    return read_answers(sock, 1, timeout)[0]


def read_answers(sock: socket.socket, count: int, timeout: float = 10) -> list[Answer]:
    """The next `count` responses on `sock` (pipelined requests' answers come in one read)."""
    parser = h11.Connection(h11.CLIENT)
    answers = []
    for _ in range(count):
        if answers:
            parser.start_next_cycle()
        answers.append(_next_answer(parser, sock, timeout))
    return answers


def _next_answer(parser: h11.Connection, sock: socket.socket, timeout: float) -> Answer:
    # h11 needs to have sent a request to read a response: pretend it did.
    parser.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
    parser.send(h11.EndOfMessage())
    sock.settimeout(timeout)
    answer: Answer | None = None
    deadline = time.monotonic() + timeout
    while True:
        event = parser.next_event()
        if event is h11.NEED_DATA:
            assert time.monotonic() < deadline, "no answer in time"
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                data = b""
            except TimeoutError:
                raise AssertionError("no answer in time") from None
            parser.receive_data(data)
            if not data and answer is not None:
                answer.closed = True
                return answer
            assert data or answer is not None, "closed without an answer"
            continue
        if isinstance(event, h11.Response):
            pairs = [(name.decode(), value.decode()) for name, value in event.headers]
            answer = Answer(event.status_code, dict(pairs), extra=pairs)
        elif isinstance(event, h11.Data):
            assert answer is not None
            answer.body += bytes(event.data)
        elif isinstance(event, h11.EndOfMessage):
            assert answer is not None
            answer.closed = answer.headers.get("connection") == "close" and closed(sock, 5)
            return answer
        elif isinstance(event, h11.ConnectionClosed):
            assert answer is not None
            answer.closed = True
            return answer


def closed(sock: socket.socket, within: float) -> bool:
    """Whether the server closes `sock` within `within` seconds (reading what else comes)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        sock.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            if not sock.recv(65536):
                return True
        except TimeoutError:
            return False
        except ConnectionResetError:
            return True
    return False


def is_open(sock: socket.socket) -> bool:
    """Whether `sock` is still open at the server's end, without waiting."""
    timeout = sock.gettimeout()
    sock.setblocking(False)  # with a timeout, recv would wait for data first
    try:
        return sock.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.settimeout(timeout)
