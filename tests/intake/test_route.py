"""POST /telegram/{bot} against a real uvicorn server, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest

from tests.conftest import table_rows
from tests.intake.conftest import SECRET, Serve, post

MESSAGE = (
    '{"update_id": %d, "message": {"message_id": 7, "from": {"id": 42, "is_bot": false, '
    '"first_name": "Ada"}, "chat": {"id": 42, "type": "private"}, "date": 1764480000, '
    '"text": "hello \\u2603 %s"}}'
)


def message(update_id: int, text: str = "") -> str:
    return MESSAGE % (update_id, text)


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=30) as session:
        yield session


async def test_an_update_is_recorded_verbatim_before_200(
    intake: Serve, client: httpx.AsyncClient
) -> None:
    body = message(1001, "☃ raw UTF-8").replace(", ", ",  ")  # odd spacing stays as sent
    async with intake() as (base, url):
        response = await post(client, base, body)
        assert response.status_code == 200
        # Answered after the commit: the row is there the moment the answer is.
        rows = table_rows(url, "bot", "update_id", "body", "update_type", "queue_key", "state")
    assert rows == [("shop", 1001, body, "message", "42", "pending")]
    assert rows[0][2].encode() == body.encode()


async def test_a_duplicate_gets_200_and_changes_nothing(
    intake: Serve, client: httpx.AsyncClient
) -> None:
    async with intake() as (base, url):
        first = await post(client, base, message(5, "first"))
        again = await post(client, base, message(5, "second"))
        other_bot = await post(client, base, message(5), bot="news", secret="another-secret")
        rows = table_rows(url, "bot", "update_id", "body")
    assert (first.status_code, again.status_code, other_bot.status_code) == (200, 200, 200)
    assert rows == [("news", 5, message(5)), ("shop", 5, message(5, "first"))]


@pytest.mark.parametrize(
    ("bot", "secret"),
    [("shop", "wrong"), ("shop", None), ("shop", ""), ("nobody", SECRET), ("news", SECRET)],
    ids=["wrong-secret", "no-secret", "empty-secret", "unknown-bot", "other-bots-secret"],
)
async def test_unknown_bot_and_bad_secret_are_the_same_403(
    intake: Serve, client: httpx.AsyncClient, bot: str, secret: str | None
) -> None:
    async with intake() as (base, url):
        response = await post(client, base, message(1), bot=bot, secret=secret)
        assert table_rows(url, "update_id") == []
    assert response.status_code == 403
    assert response.json() == {"error": "forbidden"}


@pytest.mark.parametrize(
    ("bot", "secret", "answer"),
    [
        ("shop", "wrong", b"HTTP/1.1 403"),
        ("nobody", SECRET, b"HTTP/1.1 403"),
        ("shop", SECRET, b"HTTP/1.1 413"),  # the declared length alone is over the limit
    ],
    ids=["wrong-secret", "unknown-bot", "declared-too-large"],
)
async def test_answers_that_need_no_body_come_before_it(
    intake: Serve, bot: str, secret: str, answer: bytes
) -> None:
    async with intake() as (base, _):
        host, port = base.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        # A declared 10 MB body that never comes: the answer must not wait for it.
        writer.write(
            f"POST /telegram/{bot} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"X-Telegram-Bot-Api-Secret-Token: {secret}\r\n"
            "Content-Length: 10000000\r\n\r\n".encode()
        )
        await writer.drain()
        async with asyncio.timeout(5):
            status = await reader.readline()
        writer.close()
    assert status.startswith(answer)


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b'{"update_id": 1, "message": ', "not JSON"),
        (b"[1, 2, 3]", "not a JSON object"),
        (b'"update"', "not a JSON object"),
        (b'{"message": {}}', "update_id"),
        (b'{"update_id": -1}', "update_id"),
        (b'{"update_id": 1.5}', "update_id"),
        (b'{"update_id": 1.0}', "update_id"),
        (b'{"update_id": "1"}', "update_id"),
        (b'{"update_id": true}', "update_id"),
        (b'{"update_id": null}', "update_id"),
        (b'{"update_id": 9223372036854775808}', "update_id"),
        (b'{"update_id": 1, "text": "\xff\xfe"}', "not UTF-8"),
        (b"", "not JSON"),
        (b"[" * 100_000, "not JSON"),
        (b'{"update_id": 5, "x": NaN}', "not JSON"),
        (b'{"update_id": 5, "x": -Infinity}', "not JSON"),
    ],
    ids=[
        "truncated",
        "array",
        "string",
        "no-update-id",
        "negative",
        "fractional",
        "float",
        "string-id",
        "bool-id",
        "null-id",
        "over-bigint",
        "not-utf8",
        "empty",
        "deep-nesting",
        "nan",
        "infinity",
    ],
)
async def test_not_an_update_is_400_with_a_reason_and_stores_nothing(
    intake: Serve, client: httpx.AsyncClient, body: bytes, problem: str
) -> None:
    async with intake() as (base, url):
        response = await post(client, base, body)
        assert table_rows(url, "update_id") == []
    assert response.status_code == 400
    assert problem in response.json()["error"]


async def test_the_largest_update_is_9223372036854775807(
    intake: Serve, client: httpx.AsyncClient
) -> None:
    async with intake() as (base, url):
        response = await post(client, base, message(2**63 - 1))
        assert table_rows(url, "update_id") == [(2**63 - 1,)]
    assert response.status_code == 200


def _padded(update_id: int, size: int) -> bytes:
    """A valid update of exactly `size` bytes."""
    head, tail = f'{{"update_id": {update_id}, "message": {{"text": "', '"}}'
    return (head + "x" * (size - len(head) - len(tail)) + tail).encode()


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_body_limit_is_exact_for_declared_and_streamed_bodies(
    intake: Serve, client: httpx.AsyncClient, chunked: bool
) -> None:
    limit = 4096
    exact, over = _padded(1, limit), _padded(2, limit + 1)
    assert (len(exact), len(over)) == (limit, limit + 1)
    json.loads(exact), json.loads(over)

    async def stream(data: bytes) -> AsyncIterator[bytes]:
        for start in range(0, len(data), 1000):
            yield data[start : start + 1000]

    async with intake(max_body_bytes=limit) as (base, url):
        results = []
        for body in (exact, over):
            content = stream(body) if chunked else body
            results.append(await post(client, base, content))  # type: ignore[arg-type]
        rows = table_rows(url, "update_id")
    assert [r.status_code for r in results] == [200, 413]
    assert rows == [(1,)]


async def raw_post(base: str, body: bytes, secret: str = SECRET) -> int:
    """One POST on its own connection, with plain asyncio streams: a thousand of them really
    are concurrent (httpx's pool serialises its waiters)."""
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /telegram/shop HTTP/1.1\r\nHost: intake\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nX-Telegram-Bot-Api-Secret-Token: " + secret.encode() + b"\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    await writer.drain()
    status = await reader.readline()
    await reader.read()
    writer.close()
    return int(status.split()[1])


async def test_concurrent_posts_share_commits_and_lose_or_double_nothing(intake: Serve) -> None:
    bodies = {n: message(n, f"#{n}") for n in range(10_000, 10_500)}
    async with intake() as (base, url):
        posts = [raw_post(base, body.encode()) for body in bodies.values() for _ in range(2)]
        statuses = await asyncio.gather(*posts)
        rows = table_rows(url, "update_id", "body")
    assert statuses == [200] * 1000
    assert rows == sorted(bodies.items())
