"""AiohttpTransport against real servers on 127.0.0.1: what is sent, what comes back, and
every failure as the httpx exception a caller expects."""

from __future__ import annotations

import asyncio
import gzip
import socket
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from aiohttp import web
from multidict import CIMultiDict

from app.dispatch.transport import TRUNCATED, AiohttpTransport

BODY = bytes(range(256)) + '{"update_id": 1, "text": "привет"}'.encode() + b"\r\n\x00"
TIMEOUT = {"timeout": httpx.Timeout(5.0).as_dict()}


@dataclass
class Seen:
    """One request as the server got it."""

    path: str
    headers: list[tuple[str, str]]
    body: bytes


@dataclass
class Downstream:
    """An aiohttp server with one route per behaviour; it records what it receives."""

    url: str = ""
    seen: list[Seen] = field(default_factory=list)
    in_flight: int = 0
    most_in_flight: int = 0
    hung: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/echo", self.echo)
        app.router.add_route("*", "/status/{code}", self.status)
        app.router.add_route("*", "/target", self.echo)
        app.router.add_route("*", "/cookie", self.cookie)
        app.router.add_route("*", "/hang", self.hang)
        app.router.add_route("*", "/big/{size}", self.big)
        app.router.add_route("*", "/chunked/{size}", self.chunked)
        app.router.add_route("*", "/slow", self.slow)
        app.router.add_route("*", "/gzip", self.gzipped)
        return app

    async def _record(self, request: web.Request) -> Seen:
        seen = Seen(request.path, list(request.headers.items()), await request.read())
        self.seen.append(seen)
        return seen

    async def echo(self, request: web.Request) -> web.Response:
        seen = await self._record(request)
        headers = [("X-Echo-Length", str(len(seen.body))), ("X-Multi", "a"), ("X-Multi", "b")]
        return web.Response(body=seen.body, headers=CIMultiDict(headers))

    async def status(self, request: web.Request) -> web.Response:
        await self._record(request)
        code = int(request.match_info["code"])
        headers = {"Location": "/target"} if code == 301 else {}
        if code == 429:
            headers["Retry-After"] = "7"
        return web.Response(status=code, text=f"status {code}", headers=headers)

    async def cookie(self, request: web.Request) -> web.Response:
        await self._record(request)
        response = web.Response(text="{}")
        response.set_cookie("session", "s3cret")
        return response

    async def hang(self, request: web.Request) -> web.Response:
        await self._record(request)
        self.hung.set()
        await self.release.wait()
        return web.Response(text="late")

    async def big(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.Response(body=b"x" * int(request.match_info["size"]))

    async def chunked(self, request: web.Request) -> web.StreamResponse:
        await self._record(request)
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        left = int(request.match_info["size"])
        while left:
            piece = min(left, 10_000)
            await response.write(b"y" * piece)
            left -= piece
        await response.write_eof()
        return response

    async def slow(self, request: web.Request) -> web.Response:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await self._record(request)
            await asyncio.sleep(0.02)
            return web.Response(text="{}")
        finally:
            self.in_flight -= 1

    async def gzipped(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.Response(body=gzip.compress(b"z" * 1000), headers={"Content-Encoding": "gzip"})


@pytest.fixture
async def downstream() -> AsyncIterator[Downstream]:
    server = Downstream()
    runner = web.AppRunner(server.app(), access_log=None, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    server.url = f"http://127.0.0.1:{port}"
    yield server
    server.release.set()
    await runner.cleanup()


@pytest.fixture
async def transport() -> AsyncIterator[AiohttpTransport]:
    made = AiohttpTransport(max_response_bytes=1024)
    yield made
    await made.aclose()


@pytest.fixture
async def client(transport: AiohttpTransport) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=transport) as made:
        yield made


async def send(transport: AiohttpTransport, url: str, **options: Any) -> httpx.Response:
    """One request straight to the transport, the way a dispatcher may call it."""
    request = httpx.Request("POST", url, extensions=TIMEOUT, **options)
    response = await transport.handle_async_request(request)
    await response.aread()
    return response


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A port bound but not listening: connecting to it is refused, and nothing can take it."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield int(bound.getsockname()[1])


async def test_body_arrives_byte_for_byte_and_comes_back(
    downstream: Downstream, transport: AiohttpTransport, client: httpx.AsyncClient
) -> None:
    direct = await send(transport, f"{downstream.url}/echo", content=BODY)
    through_client = await client.post(f"{downstream.url}/echo", content=BODY)
    for response in (direct, through_client):
        assert response.status_code == 200
        assert response.content == BODY
        assert response.headers["x-echo-length"] == str(len(BODY))
        assert response.extensions[TRUNCATED] is False
        assert response.http_version == "HTTP/1.1"
        assert response.request.url == f"{downstream.url}/echo"
    assert [seen.body for seen in downstream.seen] == [BODY, BODY]


async def test_a_streamed_body_is_sent_whole_with_a_length(
    downstream: Downstream, client: httpx.AsyncClient
) -> None:
    async def pieces() -> AsyncIterator[bytes]:
        yield BODY[:100]
        yield BODY[100:]

    response = await client.post(f"{downstream.url}/echo", content=pieces())
    assert response.content == BODY
    headers = dict(downstream.seen[0].headers)
    assert headers["Content-Length"] == str(len(BODY))
    assert "Transfer-Encoding" not in headers


async def test_headers_are_sent_as_given_and_received_in_full(
    downstream: Downstream, transport: AiohttpTransport
) -> None:
    sent = [
        ("Content-Type", "application/json"),
        ("X-Intake-Bot", "shop"),
        ("X-Intake-Attempt", "3"),
        ("X-Telegram-Bot-Api-Secret-Token", "t0ken"),
        ("X-Twice", "one"),
        ("X-Twice", "two"),
    ]
    response = await send(transport, f"{downstream.url}/echo", content=b"{}", headers=sent)
    seen = downstream.seen[0].headers
    for name, value in sent:
        assert (name, value) in seen
    names = {name.lower() for name, _ in seen}
    # Only what the httpx request carries, plus framing: aiohttp adds none of its defaults.
    assert names == {"host", "content-length"} | {name.lower() for name, _ in sent}
    assert response.headers.get_list("x-multi") == ["a", "b"]
    assert response.headers["content-type"].startswith("application/octet-stream")


@pytest.mark.parametrize("code", [200, 202, 500])
async def test_status_codes_are_returned(
    downstream: Downstream, client: httpx.AsyncClient, code: int
) -> None:
    response = await client.post(f"{downstream.url}/status/{code}", content=b"{}")
    assert response.status_code == code
    assert response.text == f"status {code}"


async def test_a_redirect_is_returned_not_followed(
    downstream: Downstream, transport: AiohttpTransport, client: httpx.AsyncClient
) -> None:
    for response in (
        await send(transport, f"{downstream.url}/status/301", content=b"{}"),
        await client.post(f"{downstream.url}/status/301", content=b"{}"),
    ):
        assert response.status_code == 301
        assert response.headers["location"] == "/target"
    assert [seen.path for seen in downstream.seen] == ["/status/301", "/status/301"]


async def test_429_retry_after_is_readable(
    downstream: Downstream, client: httpx.AsyncClient
) -> None:
    response = await client.post(f"{downstream.url}/status/429", content=b"{}")
    assert response.status_code == 429
    assert response.headers["retry-after"] == "7"


async def test_no_cookie_is_kept(downstream: Downstream, transport: AiohttpTransport) -> None:
    first = await send(transport, f"{downstream.url}/cookie")
    assert "session=s3cret" in first.headers["set-cookie"]
    await send(transport, f"{downstream.url}/cookie")
    assert all(name.lower() != "cookie" for name, _ in downstream.seen[1].headers)


async def test_a_compressed_body_is_not_decompressed_by_aiohttp(
    downstream: Downstream, transport: AiohttpTransport
) -> None:
    request = httpx.Request("GET", f"{downstream.url}/gzip", extensions=TIMEOUT)
    response = await transport.handle_async_request(request)
    assert response.headers["content-encoding"] == "gzip"
    raw = b"".join([chunk async for chunk in response.aiter_raw()])
    assert gzip.decompress(raw) == b"z" * 1000  # as sent: httpx decodes only on aread


async def test_refused_connection_is_connect_error(
    transport: AiohttpTransport, client: httpx.AsyncClient, refused_port: int
) -> None:
    url = f"http://127.0.0.1:{refused_port}/hook"
    with pytest.raises(httpx.ConnectError) as direct:
        await send(transport, url, content=b"{}")
    assert direct.value.request.url == url
    with pytest.raises(httpx.ConnectError):
        await client.post(url, content=b"{}")


async def test_a_full_backlog_is_connect_timeout(transport: AiohttpTransport) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        port = server.getsockname()[1]
        fillers = [socket.socket() for _ in range(3)]
        try:
            for filler in fillers:  # fill the accept queue: later SYNs go unanswered
                filler.setblocking(False)
                filler.connect_ex(("127.0.0.1", port))
            timeout = httpx.Timeout(5.0, connect=0.3)
            request = httpx.Request(
                "POST", f"http://127.0.0.1:{port}/", extensions={"timeout": timeout.as_dict()}
            )
            started = time.monotonic()
            with pytest.raises(httpx.ConnectTimeout):
                await transport.handle_async_request(request)
            assert 0.25 < time.monotonic() - started < 2
        finally:
            for filler in fillers:
                filler.close()


async def test_a_hanging_server_is_read_timeout_within_the_timeout(
    downstream: Downstream, transport: AiohttpTransport
) -> None:
    async with httpx.AsyncClient(
        transport=transport, timeout=httpx.Timeout(5.0, read=0.3)
    ) as client:
        started = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            await client.post(f"{downstream.url}/hang", content=b"{}")
        assert 0.25 < time.monotonic() - started < 1.5
        # The hung connection is dropped; the transport goes on serving.
        assert (await client.post(f"{downstream.url}/echo", content=b"ok")).content == b"ok"


async def test_a_body_that_stalls_is_read_timeout(transport: AiohttpTransport) -> None:
    done = asyncio.Event()

    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
        await done.wait()
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(stall, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    timeout = httpx.Timeout(5.0, read=0.3).as_dict()
    request = httpx.Request("GET", f"http://127.0.0.1:{port}/", extensions={"timeout": timeout})
    try:
        started = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            await transport.handle_async_request(request)
        assert 0.25 < time.monotonic() - started < 1.5
    finally:
        done.set()
        server.close()
        await server.wait_closed()
        await asyncio.sleep(0.05)  # the handler closes its side


@pytest.mark.parametrize("where", ["head", "body"])
async def test_a_request_cancelled_midway_drops_its_connection_and_frees_its_slot(
    where: str,
) -> None:
    # app.dispatch.forward bounds a whole attempt by cancelling it (asyncio.timeout): the
    # half-read connection must not be reused, nor the request's semaphore kept.
    connections = 0
    done = asyncio.Event()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await reader.readuntil(b"\r\n\r\n")
        if connections == 1:  # the first answer stops midway
            part = b"HTTP/1.1 200 OK\r\nX-Slow: " if where == "head" else b"x" * 10
            if where == "body":
                part = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + part
            writer.write(part)
            await done.wait()
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
    transport = AiohttpTransport(max_connections=1)
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await send(transport, url)
        timeout = httpx.Timeout(5.0, pool=0.5).as_dict()
        request = httpx.Request("GET", url, extensions={"timeout": timeout})
        response = await transport.handle_async_request(request)
        assert await response.aread() == b"ok"
        assert connections == 2  # a fresh connection, in the one slot
    finally:
        done.set()
        await transport.aclose()
        server.close()
        await server.wait_closed()
        await asyncio.sleep(0.05)  # the handlers close their side


async def test_waiting_for_a_pooled_connection_is_pool_timeout(downstream: Downstream) -> None:
    transport = AiohttpTransport(max_connections=1)
    try:
        hung = asyncio.create_task(send(transport, f"{downstream.url}/hang"))
        await downstream.hung.wait()
        timeout = httpx.Timeout(5.0, pool=0.3)
        request = httpx.Request("POST", f"{downstream.url}/echo")
        request.extensions["timeout"] = timeout.as_dict()
        started = time.monotonic()
        with pytest.raises(httpx.PoolTimeout):
            await transport.handle_async_request(request)
        assert 0.25 < time.monotonic() - started < 1.5
        downstream.release.set()
        assert (await hung).text == "late"
    finally:
        await transport.aclose()


async def test_a_server_closing_without_answering_is_remote_protocol_error(
    transport: AiohttpTransport,
) -> None:
    async def slam(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.close()

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()
        writer.close()

    async def cut_short(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
        await writer.drain()
        writer.close()

    for handler in (slam, garbage, cut_short):
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            with pytest.raises(httpx.RemoteProtocolError):
                await send(transport, f"http://127.0.0.1:{port}/")
        finally:
            server.close()
            await server.wait_closed()


@pytest.mark.parametrize("route", ["big", "chunked"])
async def test_a_body_over_max_response_bytes_is_truncated(
    downstream: Downstream, transport: AiohttpTransport, route: str
) -> None:
    assert transport.max_response_bytes == 1024
    for size, kept, truncated in [(1024, 1024, False), (1025, 1024, True), (5_000_000, 1024, True)]:
        response = await send(transport, f"{downstream.url}/{route}/{size}")
        assert response.status_code == 200
        assert len(response.content) == kept
        assert response.extensions[TRUNCATED] is truncated
    # A truncated response's connection is dropped, not reused half-read.
    assert (await send(transport, f"{downstream.url}/echo", content=b"after")).content == b"after"


async def test_concurrent_requests_stay_under_the_connection_limit(
    downstream: Downstream,
) -> None:
    transport = AiohttpTransport(max_connections=10, max_connections_per_host=4)
    try:
        async with httpx.AsyncClient(transport=transport) as client:
            responses = await asyncio.gather(
                *(client.post(f"{downstream.url}/slow", content=b"%d" % n) for n in range(60))
            )
        assert [response.status_code for response in responses] == [200] * 60
        assert sorted(seen.body for seen in downstream.seen) == sorted(b"%d" % n for n in range(60))
        assert downstream.most_in_flight == 4
    finally:
        await transport.aclose()


async def test_a_closed_transport_refuses_requests(downstream: Downstream) -> None:
    transport = AiohttpTransport()
    assert (await send(transport, f"{downstream.url}/echo", content=b"1")).content == b"1"
    await transport.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        await send(transport, f"{downstream.url}/echo", content=b"2")


def test_made_outside_an_event_loop() -> None:
    """The aiohttp session is made on first use, inside the loop; not in the constructor."""
    transport = AiohttpTransport(max_connections=None, max_response_bytes=0)
    assert transport.max_response_bytes == 0
    with pytest.raises(ValueError, match="max_response_bytes"):
        AiohttpTransport(max_response_bytes=-1)
