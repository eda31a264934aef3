"""The webhook's lean path answers exactly as FastAPI's way to the same route (app.http.front).

Two real uvicorn servers over fresh storage of the same backend: one as the service runs, its
front handing `POST /telegram/{bot}` to the intake ahead of FastAPI; the other with the front
off (its `webhook` unset once it has started), every request through FastAPI's middleware,
the request guard and the router. The same raw requests go to both, byte for byte: a corpus
of every check's edge (paths and methods the route does not match, doubled headers,
encodings, sizes declared and streamed, strict JSON's refusals, the allowlist behind a proxy,
a table gone from under the store), then a few hundred mutations of a valid update. Status,
headers and body must match, and so must the rows stored and the intake's counters. A probe
on the intake shows each server did take the way it stands for, so the comparison cannot hold
by both taking the same one.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from app.api_keys import ApiKey
from app.config import Settings
from app.http.front import Service
from app.main import create_app
from tests.conftest import Storage, rename_table, serve_asgi, table_rows
from tests.http.raw import Answer, connect, read_answer
from tests.intake.conftest import BOTS, SECRET

KEY = "lean-differential-key-0123"
LIMIT = 2048  # max_body_bytes, small enough to cross by hand
VALID = (
    '{"update_id":%d,"message":{"message_id":7,"from":{"id":42,"is_bot":false,'
    '"first_name":"Ada"},"chat":{"id":42,"type":"private"},"date":1764480000,'
    '"text":"hello \\u2603"}}'
)
# Differs by necessity between any two servers: the time, and a failure's fresh request id.
VARYING = {"date"}
COUNTERS = ("telegram_intake_webhook_requests_total", "telegram_intake_requests_refused_total")
REQUEST_ID = re.compile(rb'"request_id": ?"[^"]*"')


@dataclass
class Served:
    base: str
    port: int
    url: str
    app: Service
    ways: list[bool]  # for each request the intake answered: whether FastAPI's router ran


@asynccontextmanager
async def served(storage: Storage, *, lean: bool) -> AsyncIterator[Served]:
    url = storage.url()
    settings = Settings(
        database_url=url,
        bots=BOTS,
        api_keys=(ApiKey(key=SecretStr(KEY)),),
        max_body_bytes=LIMIT,
        commit_pending_max_bytes=LIMIT * 4,
        allowed_sources="127.0.0.1/32,10.1.0.0/16",
        trusted_proxies="127.0.0.1/32",
    )
    app = create_app(settings)
    async with serve_asgi(app) as base:
        if not lean:
            app.webhook = None  # every request through FastAPI's layers, to the same intake
        intake = app.state.intake
        ways: list[bool] = []
        answer = intake.answer

        async def probed(bot: str, scope: Any, receive: Any, send: Any) -> None:
            ways.append("route" in scope)  # the router puts the matched route in the scope
            await answer(bot, scope, receive, send)

        intake.answer = probed
        yield Served(base, int(base.rsplit(":", 1)[1]), url, app, ways)


def raw(method: str, path: str, headers: list[tuple[str, str]], body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "host: 127.0.0.1", *(f"{n}: {v}" for n, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def post(body: bytes | str, *, path: str = "/telegram/shop", **options: Any) -> bytes:
    data = body.encode() if isinstance(body, str) else body
    headers = [("content-type", "application/json")]
    if options.get("secret", SECRET) is not None:
        headers.append(("x-telegram-bot-api-secret-token", options.get("secret", SECRET)))
    headers += options.get("headers", [])
    if not options.get("chunked"):
        headers.append(("content-length", str(options.get("length", len(data)))))
        sent = data if options.get("send_body", True) else b""
        return raw(options.get("method", "POST"), path, headers, sent)
    headers.append(("transfer-encoding", "chunked"))
    half = len(data) // 2
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (data[:half], data[half:]) if p)
    return raw(options.get("method", "POST"), path, headers, chunks + b"0\r\n\r\n")


def corpus() -> Iterator[tuple[str, bytes]]:
    """(name, raw request): every check of the webhook, and its neighbours."""
    yield "valid", post(VALID % 1)
    yield "duplicate", post(VALID % 1)
    yield "other bot", post(VALID % 1, path="/telegram/news", secret="another-secret")
    yield "chunked", post(VALID % 2, chunked=True)
    yield "query string", post(VALID % 3, path="/telegram/shop?from=telegram")
    yield "percent-encoded bot", post(VALID % 4, path="/telegram/%73hop")
    yield "wrong secret", post(VALID % 5, secret="wrong")
    yield "no secret", post(VALID % 5, secret=None)
    yield "empty secret", post(VALID % 5, secret="")
    yield "unknown bot", post(VALID % 5, path="/telegram/nobody")
    yield "another bot's secret", post(VALID % 5, path="/telegram/news")
    yield "two secrets", post(VALID % 5, headers=[("x-telegram-bot-api-secret-token", SECRET)])
    two_encodings = [("content-encoding", "identity"), ("content-encoding", "identity")]
    yield "two encodings", post(VALID % 5, headers=two_encodings)
    yield "two authorizations", post(VALID % 5, headers=[("authorization", "a")] * 2)
    yield "gzip", post(VALID % 5, headers=[("content-encoding", "gzip")])
    yield "identity encoding", post(VALID % 6, headers=[("content-encoding", "Identity")])
    yield "declared too large", post(VALID % 7, length=LIMIT + 1, send_body=False)
    big = '{"update_id":8,"message":{"text":"%s"}}' % ("x" * LIMIT)
    yield "streamed too large", post(big, chunked=True)
    yield "at the limit", post('{"update_id":9,"x":"%s"}' % ("y" * (LIMIT - 22)))
    allowed = [("x-forwarded-for", "10.1.2.3")]
    yield "allowed behind the proxy", post(VALID % 10, headers=allowed)
    yield "refused behind the proxy", post(VALID % 11, headers=[("x-forwarded-for", "10.2.0.1")])
    two_lines = [("x-forwarded-for", "10.2.0.1"), ("x-forwarded-for", "10.1.0.9")]
    yield "two forwarded lines", post(VALID % 12, headers=two_lines)
    for name, body in [
        ("empty", b""),
        ("not JSON", b"{update_id: 1}"),
        ("a BOM", b"\xef\xbb\xbf" + (VALID % 13).encode()),
        ("not UTF-8", b'{"update_id":13,"x":"\xff"}'),
        ("a name twice", b'{"update_id":13,"update_id":14}'),
        ("a lone surrogate", b'{"update_id":13,"x":"\\ud800"}'),
        ("an array", b"[1]"),
        ("a string id", b'{"update_id":"13"}'),
        ("a negative id", b'{"update_id":-1}'),
        ("an id past bigint", b'{"update_id":9223372036854775808}'),
        ("a float id", b'{"update_id":13.0}'),
        ("a boolean id", b'{"update_id":true}'),
        ("no id", b'{"message":{}}'),
        ("NaN", b'{"update_id":13,"x":NaN}'),
        ("nested too deep", b'{"update_id":13,"x":' + b"[" * 600 + b"]" * 600 + b"}"),
        ("a number past a double", b'{"update_id":13,"x":1e999}'),
        ("an odd type name", b'{"update_id":15,"Not A Type":{}}'),
        ("only an id", b'{"update_id":16}'),
    ]:
        yield name, post(body)
    yield "GET the webhook", post(VALID % 17, method="GET")
    yield "PUT the webhook", post(VALID % 17, method="PUT")
    yield "no bot", post(VALID % 17, path="/telegram/")
    yield "a trailing slash", post(VALID % 17, path="/telegram/shop/")
    yield "two segments", post(VALID % 17, path="/telegram/shop/more")
    yield "an encoded slash", post(VALID % 17, path="/telegram/sh%2Fop")
    yield "the prefix alone", post(VALID % 17, path="/telegram")


def mutations(count: int) -> Iterator[tuple[str, bytes]]:
    """Seeded random edits of valid updates: what a fuzzer of the parser would send."""
    rng = random.Random(20261204)
    alphabet = b'{}[]":,0123456789-.eE \\u\x00\xff\xc3\xa9ntrufalse'
    for n in range(count):
        data = bytearray((VALID % (1000 + n)).encode())
        for _ in range(rng.randint(1, 4)):
            where = rng.randrange(len(data))
            edit = rng.choice(("insert", "delete", "replace"))
            if edit == "insert":
                data.insert(where, rng.choice(alphabet))
            elif edit == "delete":
                del data[where]
            else:
                data[where] = rng.choice(alphabet)
        yield f"mutation {n}", post(bytes(data))


def exchange(port: int, request: bytes) -> Answer:
    with connect(port) as sock:
        sock.sendall(request)
        return read_answer(sock)


def comparable(answer: Answer) -> tuple[int, list[tuple[str, str]], bytes]:
    headers = [(n, v) for n, v in answer.extra if n not in VARYING]
    if answer.status >= 500:
        headers = [(n, "<id>" if n == "x-request-id" else v) for n, v in headers]
    return answer.status, headers, REQUEST_ID.sub(b'"request_id":"<id>"', answer.body)


async def both(lean: Served, fastapi: Served, request: bytes) -> tuple[Any, Any]:
    return (
        comparable(await asyncio.to_thread(exchange, lean.port, request)),
        comparable(await asyncio.to_thread(exchange, fastapi.port, request)),
    )


def intake_counters(exposition: str) -> list[str]:
    return sorted(
        line
        for line in exposition.splitlines()
        if line.startswith(tuple(f"{name}{{" for name in COUNTERS))
    )


@pytest.mark.slow
async def test_the_lean_webhook_answers_as_fastapis_route(storage: Storage) -> None:
    async with served(storage, lean=True) as lean, served(storage, lean=False) as fastapi:
        cases = [*corpus(), *mutations(300)]
        for name, request in cases:
            ours, theirs = await both(lean, fastapi, request)
            assert ours == theirs, name
        # A table gone from under the store: 503 with Retry-After, the same way in.
        for server in (lean, fastapi):
            rename_table(server.url, "telegram_updates", "telegram_updates_away")
        try:
            ours, theirs = await both(lean, fastapi, post(VALID % 99))
        finally:
            for server in (lean, fastapi):
                rename_table(server.url, "telegram_updates_away", "telegram_updates")
        assert ours[0] == 503
        assert ours == theirs
        pages = []
        for server in (lean, fastapi):
            async with httpx.AsyncClient(base_url=server.base) as http:
                page = await http.get("/metrics", headers={"authorization": f"Bearer {KEY}"})
            pages.append(intake_counters(page.text))
        columns = ("bot", "update_id", "body", "update_type", "queue_key", "state", "attempts")
        rows = [table_rows(server.url, *columns) for server in (lean, fastapi)]
    assert pages[0] == pages[1]
    assert rows[0] == rows[1]
    # What the corpus proves rests on these: updates were stored, and refusals counted.
    assert len(rows[0]) >= 12
    assert any('result="invalid"' in line and not line.endswith(" 0.0") for line in pages[0])
    # Each server took the way it stands for, for every request its intake answered.
    assert lean.ways
    assert not any(lean.ways)
    assert fastapi.ways
    assert all(fastapi.ways)
    # The three heads with a header twice reach the lean intake, which refuses them by the
    # guard's own rule; on FastAPI's way the guard refuses them before the route.
    assert len(lean.ways) == len(fastapi.ways) + 3
