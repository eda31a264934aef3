"""The forwarding client's ceiling: one process POSTing an update to a trivial local server.

Issue 4 forwards every update with httpx's API; httpx's default transport is slower under
concurrency than sequentially (encode/httpx#3215). This measures, in one run, requests/s at 1
and 64 concurrent requests for httpx's default transport, httpx over aiohttp (httpx-aiohttp),
httpx over our own `app.dispatch.transport.AiohttpTransport` at three levels (the whole
`AsyncClient.post`; `AsyncClient.send` of a ready `httpx.Request`, skipping `build_request`;
the transport's `handle_async_request` called directly, skipping the client), the
transport's own `send` without httpx's Request and Response (what the workers forward with
since issue 33), and aiohttp itself. The server is a separate process (aiohttp, answering 200
at once).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

from app.dispatch.transport import AiohttpTransport as OurTransport
from bench.child import free_port, process

BODY = b'{"update_id": 1, "message": {"message_id": 1, "chat": {"id": 42, "type": "private"}}}'
SERVER = """
import sys
from aiohttp import web
async def ok(request):
    await request.read()
    return web.Response(text="{}")
app = web.Application()
app.router.add_post("/hook", ok)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


async def _rate(post: Callable[[], Awaitable[int]], concurrency: int, seconds: float) -> float:
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            assert await post() == 200
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done / (time.perf_counter() - started)


async def _both(post: Callable[[], Awaitable[int]], seconds: float) -> tuple[float, float]:
    """Requests/s one at a time and 64 at a time, after warming the connection pool."""
    await _rate(post, 8, 0.5)
    return await _rate(post, 1, seconds), await _rate(post, 64, seconds)


async def _measure(url: str, seconds: float) -> dict[str, tuple[float, float]]:
    results: dict[str, tuple[float, float]] = {}
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    clients = {
        "httpx, default transport": lambda: httpx.AsyncClient(limits=limits),
        "httpx over aiohttp (httpx-aiohttp)": lambda: httpx.AsyncClient(
            transport=AiohttpTransport(), limits=limits
        ),
    }
    for name, make in clients.items():
        async with make() as client:

            async def post(client: httpx.AsyncClient = client) -> int:
                return (await client.post(url, content=BODY)).status_code

            results[name] = await _both(post, seconds)
    target = httpx.URL(url)  # parsed once, as a dispatcher keeps its downstream's URL
    async with httpx.AsyncClient(transport=OurTransport(max_connections=64)) as client:

        async def post_client() -> int:
            return (await client.post(url, content=BODY)).status_code

        async def send_request() -> int:
            request = httpx.Request("POST", target, content=BODY)
            return (await client.send(request)).status_code

        for name, post in {
            "httpx over app AiohttpTransport: AsyncClient.post": post_client,
            "httpx over app AiohttpTransport: AsyncClient.send(Request)": send_request,
        }.items():
            results[name] = await _both(post, seconds)
    transport = OurTransport(max_connections=64)
    timeout = {"timeout": httpx.Timeout(5.0).as_dict()}
    try:

        async def handle() -> int:
            request = httpx.Request("POST", target, content=BODY, extensions=timeout)
            response = await transport.handle_async_request(request)
            await response.aread()
            return response.status_code

        name = "httpx over app AiohttpTransport: handle_async_request(Request)"
        results[name] = await _both(handle, seconds)
        headers = {"content-type": "application/json"}
        limits = timeout["timeout"]

        async def send() -> int:
            status, _, _, _ = await transport.send("POST", target, headers.items(), BODY, limits)
            return status

        name = "app AiohttpTransport.send, no httpx objects (how the workers forward)"
        results[name] = await _both(send, seconds)
    finally:
        await transport.aclose()
    connector = aiohttp.TCPConnector(limit=64)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def post_aiohttp() -> int:
            async with session.post(url, data=BODY) as response:
                await response.read()
                return response.status

        results["aiohttp"] = await _both(post_aiohttp, seconds)
    return results


async def main(*, quick: bool = False) -> str:
    port = free_port()
    async with process(sys.executable, "-c", SERVER, str(port), label="aiohttp server"):
        await asyncio.sleep(1.5)
        results = await _measure(f"http://127.0.0.1:{port}/hook", 1.0 if quick else 5.0)
    best = max(rate for _, rate in results.values())
    rows = [
        f"| {name} | {one:,.0f} | {many:,.0f} | {many / best:.2f} |"
        for name, (one, many) in results.items()
    ]
    head = "| client | requests/s, 1 at a time | requests/s, 64 concurrent | x @64 |\n"
    return head + "| --- | --- | --- | --- |\n" + "\n".join(rows)
