"""How uvicorn serves the service's apps, with the connection limits of a server exposed to
anyone who can reach its port.

uvicorn by itself closes only keep-alive connections that stay silent: a connection that never
sends a byte, sends half a request head or half a body stays open for ever, and a request head
may grow without bound. `GuardedProtocol` (uvicorn's httptools protocol, with limits) adds:

- the request head in time, `header_timeout_seconds` (10): from the connection's start, or
  from the first byte of a request that follows another, to the end of its head; closed (with
  408 when a head had begun);
- the body in time, `body_timeout_seconds` (30): from the end of the head to the end of the
  body; closed;
- keep-alive, `keep_alive_seconds` (5): no byte after a response; closed;
- the head's size, `max_header_bytes` (16 KiB), request line and headers together, and its
  header count, `max_headers` (100): 431, closed;
- open connections, `connection_limit` (4,096): a new connection past it closes the one that
  has served no request longest (itself, when every other one has a request in the app).

So thousands of idle or trickling connections cost a bounded number of file descriptors and
bytes, and a real request (Telegram sends its head at once) is still answered. Every close is
counted in `telegram_intake_connections_closed_total{reason}` and, but for keep-alive (the
normal end of a connection), logged at most once a minute per reason, with the count. uvicorn's
own closes (a request it cannot parse: 400) are not counted here. The limits themselves, from
the settings, are `app.http.connection_limits`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, ClassVar, get_args

import httptools
import uvicorn
from starlette.types import ASGIApp
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from app.http.connection_limits import ConnectionLimits
from app.http.one_write import HeadWithBody
from app.metric_labels import CloseReason

__all__ = ["GuardedProtocol", "server_config"]

log = logging.getLogger(__name__)


class _HeadTooLarge(Exception):
    """Raised from a parser callback: the request head is over a limit."""


class _TrailersTooLarge(Exception):
    """Raised from a parser callback: a chunked body's trailers are over the head's limit."""


_WHY: dict[CloseReason, str] = {
    "header_timeout": "no whole request head within header_timeout_seconds",
    "body_timeout": "no whole body within body_timeout_seconds",
    "keep_alive": "",  # the normal end of a kept-alive connection: counted, never logged
    "header_too_large": "a request head (or trailers) over max_header_bytes or max_headers",
    "evicted": "connection_limit reached: the connection serving nothing longest made room",
}


class _Reporter:
    """Counts closes, and logs them at most once a minute per reason."""

    def __init__(self, on_close: Callable[[CloseReason], None] | None) -> None:
        self._on_close = on_close
        self._unlogged: dict[CloseReason, int] = dict.fromkeys(get_args(CloseReason), 0)
        self._logged_at: dict[CloseReason, float] = dict.fromkeys(get_args(CloseReason), -60.0)

    def closed(self, reason: CloseReason) -> None:
        if self._on_close is not None:
            self._on_close(reason)
        if reason == "keep_alive":
            return
        self._unlogged[reason] += 1
        now = time.monotonic()
        if now - self._logged_at[reason] >= 60:
            log.warning(
                "closed %d client connection(s) since the last such line: %s",
                self._unlogged[reason],
                _WHY[reason],
            )
            self._unlogged[reason] = 0
            self._logged_at[reason] = now


# Where the parser is: no byte of a request yet, in its head, in its body, or done with it.
_IDLE, _HEAD, _BODY, _DONE = range(4)


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the module's limits. One subclass per server
    (`guarded_protocol`) holds that server's limits and its connections that serve nothing.

    Two facts decide everything: where the parser is (`_stage`) and how many requests have a
    whole head but no finished answer (`_in_flight`; more than one when pipelined).
    `_reassess` derives from them, after every event, the one deadline that applies and
    whether the connection may be evicted."""

    limits: ClassVar[ConnectionLimits]
    max_head_bytes: ClassVar[int]
    max_header_count: ClassVar[int]
    usable_connections: ClassVar[int]
    reporter: ClassVar[_Reporter]
    # Connections serving no request, longest first: a dict as an ordered set, so that
    # eviction takes the one that has waited longest in O(1).
    waiting: ClassVar[dict[GuardedProtocol, None]]

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._stage = _IDLE
        self._in_flight = 0
        self._served = False  # a response has been sent: silence is keep-alive from then on
        self._fed = 0  # bytes fed to the parser while the current head was incomplete
        self._parsed = 0  # bytes of the head's complete parts (request line, headers)
        self._trailers = 0  # bytes of a chunked body's trailers
        self._boundary = False  # a head or a message ended in the chunk being fed
        # The deadline that applies (its reason and its loop time), and the one timer that
        # watches it. The timer is moved only when it would ring after the deadline: a
        # request that comes and goes within its limits changes the deadline three or four
        # times and the timer not at all (it rings now and then, finds the deadline ahead,
        # and sets itself for it). Setting and cancelling a timer per change was a tenth of
        # the intake's time at 64 connections.
        self._deadline_reason: CloseReason | None = None
        self._deadline_at = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0

    # -- the connection ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._reassess()
        if len(self.connections) > self.usable_connections:
            # The connection that has waited longest (at worst this one: every other is
            # busy with a request) makes room.
            oldest = next(iter(self.waiting))
            oldest._close("evicted")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.waiting.pop(self, None)
        super().connection_lost(exc)

    def handle_websocket_upgrade(self) -> None:
        # The connection passes to uvicorn's websocket protocol (no route of ours takes it).
        self._disarm()
        self.waiting.pop(self, None)
        super().handle_websocket_upgrade()

    def data_received(self, data: bytes) -> None:
        # uvicorn's own data_received, plus the head's size and the deadlines.
        self._unset_keepalive_if_required()
        # Only a chunk that starts before or inside a head, and in which no head or message
        # ends, counts toward the head: bytes of a body are no header's.
        counting = self._stage in (_IDLE, _HEAD)
        self._boundary = False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError as error:
            if isinstance(error.__context__, _HeadTooLarge):
                self._refuse(431, "Request Header Fields Too Large", "header_too_large")
                return
            if isinstance(error.__context__, _TrailersTooLarge):
                self._close("header_too_large")  # the app has the request: no answer of ours
                return
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)
            return
        if counting and not self._boundary and self._stage in (_IDLE, _HEAD):
            # The callbacks see only complete parts, and a header line can grow without end
            # inside the parser: what was fed of an incomplete head counts too.
            self._fed += len(data)
            if self._fed > self.max_head_bytes:
                self._refuse(431, "Request Header Fields Too Large", "header_too_large")
                return
        self._reassess()

    # -- parser callbacks --------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._stage = _HEAD
        self._fed = self._parsed = self._trailers = 0

    def on_url(self, url: bytes) -> None:
        self._parsed += len(url)
        if self._parsed > self.max_head_bytes:
            raise _HeadTooLarge
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        # Called for every header of every request: uvicorn's own on_header inlined, with the
        # limits read from plain class attributes.
        size = len(name) + len(value) + 4  # ": " and CRLF
        headers = self.headers
        if self._stage == _HEAD:
            self._parsed += size
            if self._parsed > self.max_head_bytes or len(headers) >= self.max_header_count:
                raise _HeadTooLarge
        else:  # a chunked body's trailers, once the app has the request
            self._trailers += size
            if self._trailers > self.max_head_bytes:
                raise _TrailersTooLarge
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._stage = _BODY
        self._fed = 0
        self._boundary = True
        self._in_flight += 1
        super().on_headers_complete()
        cycle = self.cycle
        # (Only the cycle made for this head: an upgrade returns before making one.)
        if cycle is not None and cycle.scope is self.scope and self.scope["method"] != "HEAD":
            cycle.transport = HeadWithBody(self.transport)  # type: ignore[assignment]
        self._reassess()

    def on_message_complete(self) -> None:
        self._stage = _DONE
        self._boundary = True
        super().on_message_complete()
        self._reassess()

    def on_response_complete(self) -> None:
        self._in_flight -= 1
        self._served = True
        if self._stage == _DONE:
            self._stage = _IDLE
        super().on_response_complete()
        self._reassess()

    # -- limits ------------------------------------------------------------------------

    def _reassess(self) -> None:
        """Arm the deadline the connection's state calls for (a running one keeps running),
        and keep its place among the connections that serve nothing."""
        if self.transport is None or self.transport.is_closing():
            return
        if self._in_flight == 0:
            self.waiting.setdefault(self, None)
        else:
            self.waiting.pop(self, None)
        reason: CloseReason | None
        if self._stage == _BODY and self._in_flight <= 1:
            # The body of the request in hand, or of one answered before it was read.
            reason, seconds = "body_timeout", self.limits.body_timeout_seconds
        elif self._in_flight:
            reason, seconds = None, 0.0  # the app's time; a pipelined request waits its turn
        elif self._stage == _HEAD or not self._served:
            reason, seconds = "header_timeout", self.limits.header_timeout_seconds
        else:
            reason, seconds = "keep_alive", float(self.limits.keep_alive_seconds)
        if reason != self._deadline_reason:
            self._deadline_reason = reason
            if reason is not None:
                self._deadline_at = at = self.loop.time() + seconds
                if self._timer is None or self._timer_at > at:
                    self._set_timer(at)

    def _set_timer(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_at(at, self._ring)
        self._timer_at = at

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self._deadline_reason = None

    def _ring(self) -> None:
        self._timer = None
        reason = self._deadline_reason
        if reason is None:
            return  # nothing is due: the next deadline sets a timer of its own
        if self.loop.time() < self._deadline_at:
            self._set_timer(self._deadline_at)
            return
        self._timed_out(reason)

    def _timed_out(self, reason: CloseReason) -> None:
        self._disarm()
        if reason == "header_timeout" and self._stage == _HEAD:
            self._refuse(408, "Request Timeout", reason)  # no request is in the app
        else:
            self._close(reason)

    def _refuse(self, status: int, message: str, reason: CloseReason) -> None:
        """Answer `status` and close: only ever before the request reached the app."""
        if not self.transport.is_closing():
            body = message.encode()
            self.transport.write(
                b"".join(
                    [
                        STATUS_LINE[status],
                        b"content-type: text/plain; charset=utf-8\r\n",
                        b"content-length: %d\r\n" % len(body),
                        b"connection: close\r\n\r\n",
                        body,
                    ]
                )
            )
        self._close(reason)

    def _close(self, reason: CloseReason) -> None:
        self._disarm()
        self.waiting.pop(self, None)
        if not self.transport.is_closing():
            self.reporter.closed(reason)
            self.transport.close()


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedProtocol]:
    """A protocol class for one server, with `limits`."""
    return type(
        "GuardedProtocol",
        (GuardedProtocol,),
        {
            "limits": limits,
            "max_head_bytes": limits.max_header_bytes,
            "max_header_count": limits.max_headers,
            "usable_connections": limits.usable_connection_limit(),
            "reporter": _Reporter(limits.on_close),
            "waiting": {},
        },
    )


def server_config(
    app: ASGIApp,
    *,
    host: str,
    port: int,
    limits: ConnectionLimits | None = None,
    log_level: str = "info",
) -> uvicorn.Config:
    """How uvicorn serves an app of ours, for the command line and the tests alike."""
    limits = limits or ConnectionLimits.defaults()
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=guarded_protocol(limits),
        # Ours closes (and counts) a silent kept-alive connection first; uvicorn's stays as
        # a backstop.
        timeout_keep_alive=limits.keep_alive_seconds + 1,
        log_level=log_level,
        log_config=None,  # our handler (app.logs) formats uvicorn's lines too
        access_log=False,
        lifespan="on",
        # The intake reads X-Forwarded-For itself, and only from INTAKE_TRUSTED_PROXIES.
        proxy_headers=False,
    )
