"""Calling the Bot API (app/bot_api.py) against real servers on 127.0.0.1, the fake Bot API
(app/fake_bot_api.py) among them: answers read up to a cap, and a warning when the token would
cross the network in clear text."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from app import bot_api
from app.config import Settings
from app.fake_bot_api import TOKEN, FakeBotApi
from tests.conftest import serve_asgi

CAP = 4096  # MAX_ANSWER_BYTES in these tests: a handful of updates pass, a batch does not


def settings(bot_api_url: str) -> Settings:
    return Settings(
        bot_api_url=bot_api_url,
        secret_token=SecretStr("webhook-secret"),
        bot_token=SecretStr(TOKEN),
    )


async def ask(how: str, config: Settings, method: str, **params: Any) -> Any:
    """One Bot API call, blocking (`call`, in a thread) or through the service's client."""
    (bot,) = config.bots
    if how == "call":
        return await asyncio.to_thread(bot_api.call, config, bot, method, **params)
    async with bot_api.async_client() as client:
        return await bot_api.call_async(client, config, bot, method, **params)


def updates(count: int, text: str = "hello") -> list[dict[str, Any]]:
    return [
        {
            "update_id": n,
            "message": {"message_id": n, "date": 0, "chat": {"id": 1}, "text": text},
        }
        for n in range(1, count + 1)
    ]


@pytest.fixture(autouse=True)
def _warnings_afresh() -> Iterator[None]:
    """Each test sees the once-per-process warning afresh."""
    bot_api.warn_if_in_clear.cache_clear()
    yield
    bot_api.warn_if_in_clear.cache_clear()


@pytest.mark.parametrize("how", ["call", "call_async"])
async def test_an_answer_over_the_cap_is_refused(how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bot_api, "MAX_ANSWER_BYTES", CAP)
    fake = FakeBotApi()
    fake.produce(*updates(100))
    async with serve_asgi(fake.app()) as url:
        config = settings(url)
        assert len(await ask(how, config, "getUpdates", limit=2)) == 2  # under the cap
        with pytest.raises(bot_api.BotApiError, match="getUpdates: the answer is over 4096 bytes"):
            await ask(how, config, "getUpdates", limit=100)


@dataclass
class Endless:
    """A server that answers a JSON string for ever, 64 KiB at a time (64 MiB at most), until
    the client hangs up; `sent`: how much it could send before that."""

    url: str = ""
    sent: int = 0
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    async def answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
            writer.write(b"Transfer-Encoding: chunked\r\n\r\n")
            start, piece = b'{"ok": true, "result": "', b"x" * 65536
            writer.write(b"%x\r\n%s\r\n" % (len(start), start))
            while self.sent < 64 << 20:
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
                self.sent += len(piece)
            writer.write(b'2\r\n"}\r\n0\r\n\r\n')
            await writer.drain()
        except ConnectionError:
            pass  # the client stopped reading: what the cap is for
        finally:
            writer.close()
            self.ended.set()


@asynccontextmanager
async def endless_answer() -> AsyncIterator[Endless]:
    endless = Endless()
    server = await asyncio.start_server(endless.answer, "127.0.0.1", 0)
    endless.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield endless
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("how", ["call", "call_async"])
async def test_an_endless_answer_is_read_no_further_than_the_cap(
    how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bot_api, "MAX_ANSWER_BYTES", 65536)
    async with endless_answer() as endless:
        with pytest.raises(bot_api.BotApiError, match="over 65536 bytes") as refused:
            await ask(how, settings(endless.url), "getMe")
        async with asyncio.timeout(10):
            await endless.ended.wait()  # the server learns that the client hung up
    assert refused.value.code is None
    assert endless.sent < 64 << 20  # stopped early, not read to the end


async def test_a_full_batch_of_the_longest_messages_fits_under_the_cap() -> None:
    assert bot_api.MAX_ANSWER_BYTES == 16 << 20
    fake = FakeBotApi()
    fake.produce(*updates(100, text="\U0001f600" * 4096))  # 4096 characters, 16 KiB in UTF-8
    async with serve_asgi(fake.app()) as url:
        got = await ask("call_async", settings(url), "getUpdates", limit=100)
    assert len(got) == 100


@pytest.mark.parametrize(
    ("url", "warns"),
    [
        ("http://api.example:8081", True),
        ("http://10.0.0.7:8081", True),
        ("http://127.0.0.1:8081", False),
        ("http://127.8.0.1:8081", False),
        ("http://[::1]:8081", False),
        ("http://localhost:8081", False),
        ("https://api.example:8443", False),
        ("https://api.telegram.org", False),
    ],
)
async def test_a_clear_text_bot_api_url_off_the_loopback_warns_once(
    url: str, warns: bool, caplog: pytest.LogCaptureFixture
) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"ok": True, "result": True})

    config = settings(url)
    (bot,) = config.bots
    caplog.set_level(logging.WARNING, logger="app.bot_api")
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        for _ in range(3):
            assert await bot_api.call_async(client, config, bot, "getWebhookInfo") is True
    records = [r for r in caplog.records if r.name == "app.bot_api"]
    if not warns:
        assert records == []
        return
    (record,) = records  # once per process, not once per call
    assert record.levelno == logging.WARNING
    host = url.split("//")[1].split(":")[0]
    assert host in record.getMessage()
    assert "clear text" in record.getMessage()
    assert TOKEN not in record.getMessage()
    assert TOKEN.split(":")[1] not in record.getMessage()
