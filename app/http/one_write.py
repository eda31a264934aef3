"""A whole answer in one write: uvicorn writes a response's head and its body apart, two
send(2) calls and two TCP segments for every small answer (the webhook's, the callbacks').
`GuardedProtocol` (`app.http.server`) gives each response cycle this view of the transport."""

from __future__ import annotations

import asyncio

__all__ = ["HeadWithBody"]


class HeadWithBody:
    """The connection's transport as one response's cycle writes to it: the response head is
    held until the body's first write, so that a whole answer leaves in one write, one
    send(2) and one TCP segment, rather than two (uvicorn writes the head and the body apart).
    An interim `100 Continue` goes out at once; so does a held head when the cycle closes the
    connection without a body. Not used for HEAD, whose answer has no body to wait for."""

    __slots__ = ("_head", "_seen", "_transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._head: bytes | None = None
        self._seen = False  # the response head came

    def write(self, data: bytes) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self._transport.write(head + data)
        elif not self._seen and not data.startswith(b"HTTP/1.1 100 "):
            self._seen = True
            self._head = data
        else:
            self._transport.write(data)

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def close(self) -> None:
        if self._head is not None:
            self._transport.write(self._head)
            self._head = None
        self._transport.close()
