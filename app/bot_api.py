"""Calling Telegram's Bot API: one method, its `result`, or a BotApiError in Telegram's words.

The base URL is `INTAKE_BOT_API_URL` (a local Bot API server is a real use; tests point it at a
fake). The bot token travels in the request path only: no error, log line or metric ever
carries it, so an HTTP failure is named by its kind, never by httpx's message (which holds the
URL). Connection failures are retried by httpx's transport (`retries`), nothing else is.

An answer is read up to MAX_ANSWER_BYTES and no further. A bot_api_url in clear text (http://)
off the loopback is logged once per process: the token would cross the network readable.

Parameters go as a JSON body; with `files` (setWebhook's certificate), as multipart/form-data,
each other parameter a form field (a list or an object JSON-encoded, as Telegram reads it).
"""

from __future__ import annotations

import functools
import ipaddress
import json
import logging
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import httpx
from pydantic import AnyHttpUrl

from app.bot_settings import BotSettings
from app.config import Settings

log = logging.getLogger(__name__)

TIMEOUT_SECONDS = 30.0
MAX_ANSWER_BYTES = 16 << 20
"""The most of one answer read, decoded (16 MiB). getUpdates' largest batch fits many times
over (100 updates, each a longest message of 4096 characters: under 2 MiB of JSON); past it the
read stops and the call fails with BotApiError."""


class BotApiError(Exception):
    """Telegram refused a call (`code`: its error_code; `retry_after`: the seconds a 429 asks
    to wait), or could not be reached (`code` None)."""

    def __init__(self, message: str, code: int | None = None, retry_after: float | None = None):
        super().__init__(message)
        self.code = code
        self.retry_after = retry_after


def _form_value(value: Any) -> str:
    """A parameter as a multipart form field: Telegram reads every field as a string."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value)


def _request(settings: Settings, bot: BotSettings, method: str, params: dict[str, Any]) -> Any:
    if bot.bot_token is None:
        raise BotApiError(f"bot {bot.name!r} has no bot_token (INTAKE_BOT_TOKEN or bot_token)")
    warn_if_in_clear(settings.bot_api_url)
    base = str(settings.bot_api_url).rstrip("/")
    url = f"{base}/bot{bot.bot_token.get_secret_value()}/{method}"
    payload = {name: value for name, value in params.items() if value is not None}
    return url, payload


def _unreachable(settings: Settings, method: str, error: httpx.HTTPError) -> BotApiError:
    # str(error) may carry the URL, and so the token: name the failure only.
    base = str(settings.bot_api_url).rstrip("/")
    return BotApiError(
        f"{method}: the Bot API at {base} could not be reached ({type(error).__name__})"
    )


@functools.cache  # once per process and URL: every call passes here
def warn_if_in_clear(url: AnyHttpUrl) -> None:
    """Log a warning when `url` is http:// to a host off the loopback (127.0.0.0/8, ::1,
    localhost): the bot token, in every request's path, would travel readable. The log names
    the host only (a URL may carry a password)."""
    host = (url.host or "").strip("[]").lower()
    if url.scheme != "http" or host == "localhost":
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:  # a name, not an address
        pass
    log.warning(
        "bot_api_url is http:// to %s, not a loopback address: the bot token travels in "
        "clear text; use https://",
        host,
    )


def _too_big(method: str) -> BotApiError:
    return BotApiError(f"{method}: the answer is over {MAX_ANSWER_BYTES} bytes; not read further")


def _read(method: str, chunks: Iterator[bytes]) -> bytes:
    body = bytearray()
    for chunk in chunks:
        body += chunk
        if len(body) > MAX_ANSWER_BYTES:
            raise _too_big(method)
    return bytes(body)


async def _aread(method: str, chunks: AsyncIterator[bytes]) -> bytes:
    body = bytearray()
    async for chunk in chunks:
        body += chunk
        if len(body) > MAX_ANSWER_BYTES:
            raise _too_big(method)
    return bytes(body)


def _result(method: str, status: int, body: bytes) -> Any:
    try:
        answer = json.loads(body)
    except ValueError:
        raise BotApiError(f"{method}: HTTP {status}, not a Bot API answer", status) from None
    if not isinstance(answer, dict) or not answer.get("ok"):
        code = answer.get("error_code", status) if isinstance(answer, dict) else ""
        words = answer.get("description", "no description") if isinstance(answer, dict) else ""
        number = code if isinstance(code, int) else status
        parameters = answer.get("parameters") if isinstance(answer, dict) else None
        wait = parameters.get("retry_after") if isinstance(parameters, dict) else None
        retry_after = float(wait) if isinstance(wait, int | float) and wait >= 0 else None
        raise BotApiError(f"{method}: Telegram refused: {code} {words}", number, retry_after)
    return answer.get("result")


def call(
    settings: Settings,
    bot: BotSettings,
    method: str,
    *,
    files: Mapping[str, tuple[str, bytes]] | None = None,
    **params: Any,
) -> Any:
    """One Bot API method, blocking (the command line's); its `result`. `files`: field name ->
    (file name, content), sent with the parameters as multipart/form-data."""
    url, payload = _request(settings, bot, method, params)
    transport = httpx.HTTPTransport(retries=2)  # connection failures only
    if files:
        form = {name: _form_value(value) for name, value in payload.items()}
        request: dict[str, Any] = {"data": form, "files": dict(files)}
    else:
        request = {"json": payload}
    try:
        with (
            httpx.Client(transport=transport, timeout=TIMEOUT_SECONDS) as client,
            client.stream("POST", url, **request) as response,
        ):
            body = _read(method, response.iter_bytes())
    except httpx.HTTPError as error:
        raise _unreachable(settings, method, error) from None
    return _result(method, response.status_code, body)


async def call_async(
    client: httpx.AsyncClient,
    settings: Settings,
    bot: BotSettings,
    method: str,
    *,
    wait: float | None = None,
    **params: Any,
) -> Any:
    """One Bot API method through `client` (the service's); its `result`. `wait`: how long
    the answer may take (a long poll's timeout and a margin), else the client's own."""
    url, payload = _request(settings, bot, method, params)
    timeout = httpx.USE_CLIENT_DEFAULT if wait is None else httpx.Timeout(10.0, read=wait)
    try:
        async with client.stream("POST", url, json=payload, timeout=timeout) as response:
            body = await _aread(method, response.aiter_bytes())
    except httpx.HTTPError as error:
        raise _unreachable(settings, method, error) from None
    return _result(method, response.status_code, body)


def async_client() -> httpx.AsyncClient:
    """A client for `call_async`: connection failures retried twice, no redirects."""
    transport = httpx.AsyncHTTPTransport(retries=2)
    return httpx.AsyncClient(transport=transport, timeout=TIMEOUT_SECONDS)
