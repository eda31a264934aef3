"""An httpx transport over one aiohttp session: httpx's API at close to aiohttp's speed.

httpx's own transport is slow under concurrency (encode/httpx#3215); httpx-aiohttp re-streams
aiohttp's response chunk by chunk. This one does the least per request: one aiohttp request,
the body read whole but bounded into an `httpx.ByteStream`. `bench/client.py` compares them.
"""

from __future__ import annotations

import asyncio
import functools
import ssl as ssl_
from collections.abc import Iterable, Mapping

import aiohttp
import httpx
from yarl import URL

TRUNCATED = "truncated"
"""The `httpx.Response.extensions` key: True when the body was cut at `max_response_bytes`."""

_DEFAULT_TIMEOUT = httpx.Timeout(5.0).as_dict()
_NO_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")
_Gates = tuple[asyncio.Semaphore, ...]
RawHeaders = tuple[tuple[bytes, bytes], ...]
_ERRORS = (  # aiohttp's (or the socket's) error -> httpx's: the first that matches
    (aiohttp.ConnectionTimeoutError, httpx.ConnectTimeout),  # resolving or connecting
    (TimeoutError, httpx.ReadTimeout),  # aiohttp.SocketTimeoutError: sock_read
    (aiohttp.ClientConnectorError, httpx.ConnectError),  # refused, DNS, TLS handshake
    (  # closed before a whole response; a malformed status line, header or body
        (aiohttp.ServerDisconnectedError, aiohttp.ClientResponseError, aiohttp.ClientPayloadError),
        httpx.RemoteProtocolError,
    ),
    ((aiohttp.NonHttpUrlClientError, aiohttp.InvalidURL), httpx.UnsupportedProtocol),
    (aiohttp.ClientConnectionResetError, httpx.WriteError),  # writing to a closed socket
    ((aiohttp.ClientConnectionError, OSError), httpx.ReadError),
)


class AiohttpTransport(httpx.AsyncBaseTransport):
    """Sends httpx requests through one aiohttp `ClientSession`, made on first use (in the
    running loop, as aiohttp requires) and closed by `aclose()`.

    No redirects (a 3xx is returned), no cookies, no decompression, and no header the httpx
    request lacks (aiohttp's Accept, Accept-Encoding, User-Agent, Content-Type). httpx decodes
    a Content-Encoding on read, as with its own transport: send `Accept-Encoding: identity`
    so that `max_response_bytes` bounds what is held. A streamed body is read, then sent.

    Limits are semaphores held per request (one request, one HTTP/1.1 connection), per host
    then in total; aiohttp's pool is unlimited, so `pool` bounds exactly the wait for them.
    Timeouts, from `extensions["timeout"]` (5 s when absent): `pool` -> PoolTimeout, `connect`
    (resolve and connect) -> ConnectTimeout, `read` (each socket read) -> ReadTimeout; no
    `write` (aiohttp has none; an update fits in the socket buffer). Errors: `_ERRORS`.
    None of them bounds the whole request (an answer trickled a byte at a time never trips
    `read`): a caller that needs that bound cancels the request at its deadline
    (`app.dispatch.forward.post`); a request cancelled midway has its connection closed, not
    reused half-read, and its semaphores released.

    A body over `max_response_bytes` is cut there: the read stops, the connection is closed
    (not drained), `extensions["truncated"]` is True. aiohttp retries on a dead kept-alive
    connection for idempotent methods only, never POST.
    """

    def __init__(
        self,
        *,
        max_connections: int | None = 100,
        max_connections_per_host: int | None = None,
        max_response_bytes: int = 64 * 1024,
        keepalive_expiry: float = 15.0,
        ssl: ssl_.SSLContext | bool = True,
    ) -> None:
        """`None` limits mean no limit; `ssl=False` skips certificate checks."""
        if max_response_bytes < 0:
            raise ValueError("max_response_bytes must be >= 0")
        self.max_response_bytes = max_response_bytes
        self._total = () if max_connections is None else (asyncio.Semaphore(max_connections),)
        self._per_host = max_connections_per_host
        self._hosts: dict[tuple[str, str, int | None], asyncio.Semaphore] = {}
        self._connector = functools.partial(
            aiohttp.TCPConnector, limit=0, keepalive_timeout=keepalive_expiry, ssl=ssl
        )
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        self._urls: dict[str, tuple[URL, _Gates]] = {}

    def _open(self) -> aiohttp.ClientSession:
        if self._closed:
            raise RuntimeError("the transport is closed")
        self._session = aiohttp.ClientSession(
            connector=self._connector(),
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=_NO_AUTO_HEADERS,
            auto_decompress=False,
            trust_env=False,
        )
        return self._session

    def _target(self, url: httpx.URL) -> tuple[URL, _Gates]:
        """aiohttp's URL (httpx's is percent-encoded: yarl must not encode it again) and the
        semaphores to hold, cached: a dispatcher posts to a handful of URLs."""
        text = str(url)
        found = self._urls.get(text)
        if found is None:
            gates = self._total
            if self._per_host is not None:
                key = (url.scheme, url.host, url.port)
                host = self._hosts.setdefault(key, asyncio.Semaphore(self._per_host))
                gates = (host, *gates)
            if len(self._urls) > 256:
                self._urls.clear()
            found = self._urls[text] = (URL(text, encoded=True), gates)
        return found

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeout: Mapping[str, float | None] = request.extensions.get("timeout", _DEFAULT_TIMEOUT)
        raw = request.headers.raw
        if not isinstance(request.stream, httpx.ByteStream):  # streamed: aiohttp sets a length
            await request.aread()
            raw = [(name, value) for name, value in raw if name.lower() != b"transfer-encoding"]
        headers = [(name.decode(), value.decode()) for name, value in raw]
        status, raw_headers, body, truncated = await self.send(
            request.method, request.url, headers, request.content or None, timeout, request
        )
        return httpx.Response(
            status,
            headers=raw_headers,
            stream=httpx.ByteStream(body),
            request=request,
            extensions={"http_version": b"HTTP/1.1", TRUNCATED: truncated},
        )

    async def send(
        self,
        method: str,
        url: httpx.URL,
        headers: Iterable[tuple[str, str]],
        body: bytes | None,
        limits: Mapping[str, float | None],
        request: httpx.Request | None = None,
    ) -> tuple[int, RawHeaders, bytes, bool]:
        """One request, without httpx's Request and Response around it (the forwarder's way:
        they cost more than aiohttp's own request), within `limits` (httpx's timeouts, as a
        dict): the status, the raw headers, the body (cut at `max_response_bytes`) and
        whether it was cut. Errors are httpx's, as from
        `handle_async_request`, whose `request` they carry when there is one."""
        session = self._session or self._open()
        target, gates = self._target(url)
        await _enter(gates, limits.get("pool"), request)
        try:
            async with session.request(
                method,
                target,
                headers=headers,
                data=body,
                timeout=_client_timeout(limits.get("connect"), limits.get("read")),
                allow_redirects=False,
            ) as response:
                content, truncated = await self._read(response)
        except (aiohttp.ClientError, OSError) as error:  # TimeoutError is an OSError
            kind = next((to for cause, to in _ERRORS if isinstance(error, cause)), None)
            message = str(error) or type(error).__name__
            raise (kind or httpx.TransportError)(message, request=request) from error
        finally:
            for gate in gates:
                gate.release()
        return response.status, response.raw_headers, content, truncated

    async def _read(self, response: aiohttp.ClientResponse) -> tuple[bytes, bool]:
        """The body, whole if it fits in `max_response_bytes`, else cut there (True)."""
        limit, length = self.max_response_bytes, response.content_length
        if length is not None and length <= limit:  # aiohttp reads no more than declared
            return await response.read(), False
        body = bytearray()
        while len(body) <= limit and (chunk := await response.content.read(limit + 1 - len(body))):
            body += chunk
        if len(body) > limit:
            response.close()  # the rest stays unread: drop the connection, never drain it
        return bytes(body[:limit]), len(body) > limit

    async def aclose(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None


@functools.lru_cache(maxsize=64)
def _client_timeout(connect: float | None, read: float | None) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(connect=connect, sock_connect=connect, sock_read=read)


async def _enter(gates: _Gates, pool: float | None, request: httpx.Request | None) -> None:
    """Take every semaphore, waiting `pool` seconds at most in all, or none of them."""
    if not any(gate.locked() for gate in gates):
        for gate in gates:
            await gate.acquire()  # free: returns at once, no timer armed
        return
    taken = 0
    try:
        async with asyncio.timeout(pool):
            for gate in gates:
                await gate.acquire()
                taken += 1
    except BaseException as error:
        for gate in gates[:taken]:
            gate.release()
        if isinstance(error, TimeoutError):
            raise httpx.PoolTimeout("no connection free in time", request=request) from None
        raise
