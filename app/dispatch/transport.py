"""An httpx transport over one aiohttp session: httpx's API at close to aiohttp's speed.

httpx's own transport (httpcore) is slow under concurrency (encode/httpx#3215), and the
httpx-aiohttp package still pays for a response stream wrapper and per-request setup. This
transport does the least per request: one `ClientSession.request`, the body read whole (but
bounded) and handed back as the `httpx.Response`'s content. `bench/client.py` measures it.

What it does not do, on purpose (a forwarding dispatcher wants none of it):
- redirects: a 3xx is returned as it is;
- cookies: none are kept (`DummyCookieJar`);
- decompression: the body is returned as received, and aiohttp adds no header of its own
  (no Accept, Accept-Encoding, User-Agent or Content-Type) that the httpx request lacks. As
  with httpx's own transport, httpx decodes a Content-Encoding when the body is read: send
  `Accept-Encoding: identity` to keep `max_response_bytes` a bound on what is held;
- streaming: a streamed request body is read into memory first.

aiohttp retries a request once on a reused keep-alive connection that turns out dead, but
only for idempotent methods (never for POST).
"""

from __future__ import annotations

import ssl as ssl_
import time
from collections.abc import Mapping

import aiohttp
import httpx
from yarl import URL

TRUNCATED = "truncated"
"""The `httpx.Response.extensions` key: True when the body was cut at `max_response_bytes`."""

_DEFAULT_TIMEOUT = httpx.Timeout(5.0).as_dict()
_NO_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")
_HTTP_11 = {"http_version": b"HTTP/1.1"}
_TimeoutKey = tuple[float | None, float | None, float | None]


class AiohttpTransport(httpx.AsyncBaseTransport):
    """Sends httpx requests with one aiohttp `ClientSession`, made on first use (inside the
    running loop, as aiohttp requires) and closed by `aclose()`.

    Timeouts come from the request's `extensions["timeout"]` (httpx.AsyncClient sets them;
    5 s each when absent): `read` is aiohttp's `sock_read` (each socket read), `connect` its
    `sock_connect`, and waiting for a pooled connection plus connecting share aiohttp's
    `connect` budget of `pool + connect`; a timeout there is `httpx.PoolTimeout` once that
    budget is spent and `httpx.ConnectTimeout` before. aiohttp has no write timeout, so
    `write` is not applied (a forwarded update fits in the socket's send buffer).

    Errors: callers only see httpx exceptions (see `_translate`).

    A response body over `max_response_bytes` is truncated to that size: the read stops
    there, the connection is closed rather than drained, and `extensions["truncated"]` is
    True (False otherwise). Headers are kept as received (Content-Length included).
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
        """`None` connection limits mean no limit; `ssl=False` skips certificate checks."""
        if max_response_bytes < 0:
            raise ValueError("max_response_bytes must be >= 0")
        self.max_response_bytes = max_response_bytes
        self._limit = max_connections or 0  # aiohttp's 0 is "no limit"
        self._limit_per_host = max_connections_per_host or 0
        self._keepalive_expiry = keepalive_expiry
        self._ssl = ssl
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        self._timeouts: dict[_TimeoutKey, aiohttp.ClientTimeout] = {}
        self._urls: dict[str, URL] = {}

    def _open(self) -> aiohttp.ClientSession:
        if self._closed:
            raise RuntimeError("the transport is closed")
        connector = aiohttp.TCPConnector(
            limit=self._limit,
            limit_per_host=self._limit_per_host,
            keepalive_timeout=self._keepalive_expiry,
            ssl=self._ssl,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=_NO_AUTO_HEADERS,
            auto_decompress=False,
            trust_env=False,
        )
        return self._session

    def _client_timeout(self, timeout: Mapping[str, float | None]) -> aiohttp.ClientTimeout:
        key = (timeout.get("connect"), timeout.get("read"), timeout.get("pool"))
        found = self._timeouts.get(key)
        if found is None:
            connect, read, pool = key
            budget = None if pool is None else pool + (connect or 0.0)
            found = aiohttp.ClientTimeout(connect=budget, sock_connect=connect, sock_read=read)
            if len(self._timeouts) > 64:  # bounded: callers rarely vary their timeouts
                self._timeouts.clear()
            self._timeouts[key] = found
        return found

    def _url(self, url: httpx.URL) -> URL:
        """httpx's URL is already percent-encoded: yarl must not encode it again. Parsed
        URLs are cached (a dispatcher posts to a handful)."""
        text = str(url)
        found = self._urls.get(text)
        if found is None:
            if len(self._urls) > 256:
                self._urls.clear()
            found = self._urls[text] = URL(text, encoded=True)
        return found

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        session = self._session or self._open()
        timeout = self._client_timeout(request.extensions.get("timeout", _DEFAULT_TIMEOUT))
        headers = request.headers
        if not isinstance(request.stream, httpx.ByteStream):  # streamed: send it read
            await request.aread()
            headers = headers.copy()
            headers.pop("transfer-encoding", None)  # aiohttp sets Content-Length
        started = time.monotonic()
        try:
            async with session.request(
                request.method,
                self._url(request.url),
                headers=headers.multi_items(),
                data=request.content,
                timeout=timeout,
                allow_redirects=False,
            ) as response:
                body, truncated = await self._read(response)
        except (aiohttp.ClientError, OSError) as error:  # TimeoutError is an OSError
            budget = timeout.connect
            spent = budget is not None and time.monotonic() - started >= budget
            raise _translate(error, request, spent) from error
        return httpx.Response(
            response.status,
            headers=response.raw_headers,
            stream=httpx.ByteStream(body),
            extensions={**_HTTP_11, TRUNCATED: truncated},
        )

    async def _read(self, response: aiohttp.ClientResponse) -> tuple[bytes, bool]:
        """The body, whole if it fits in `max_response_bytes`, else cut there (True)."""
        limit = self.max_response_bytes
        length = response.content_length
        if length is not None and length <= limit:  # aiohttp reads no more than declared
            return await response.read(), False
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = await response.content.read(limit + 1 - size)
            if not chunk:
                return b"".join(chunks), False
            chunks.append(chunk)
            size += len(chunk)
        response.close()  # the rest stays unread: drop the connection, never drain it
        return b"".join(chunks)[:limit], True

    async def aclose(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None


def _translate(error: Exception, request: httpx.Request, budget_spent: bool) -> Exception:
    """The httpx exception for an aiohttp (or socket) error; `budget_spent` tells a pool
    timeout from a connect timeout (see AiohttpTransport)."""
    kind: type[httpx.TransportError]
    if isinstance(error, aiohttp.ConnectionTimeoutError):
        kind = httpx.PoolTimeout if budget_spent else httpx.ConnectTimeout
    elif isinstance(error, TimeoutError):  # aiohttp.SocketTimeoutError: sock_read
        kind = httpx.ReadTimeout
    elif isinstance(error, aiohttp.ClientConnectorError):  # refused, DNS, TLS handshake
        kind = httpx.ConnectError
    elif isinstance(
        error,
        aiohttp.ServerDisconnectedError | aiohttp.ClientResponseError | aiohttp.ClientPayloadError,
    ):  # closed before a whole response, malformed status line, headers or body
        kind = httpx.RemoteProtocolError
    elif isinstance(error, aiohttp.NonHttpUrlClientError | aiohttp.InvalidURL):
        kind = httpx.UnsupportedProtocol
    elif isinstance(error, aiohttp.ClientConnectionResetError):  # writing to a closed socket
        kind = httpx.WriteError
    elif isinstance(error, aiohttp.ClientConnectionError | OSError):
        kind = httpx.ReadError
    else:
        kind = httpx.TransportError
    return kind(str(error) or type(error).__name__, request=request)
