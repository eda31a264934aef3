"""Calling Telegram's Bot API: one method, its `result`, or a BotApiError in Telegram's words.

The base URL is `INTAKE_BOT_API_URL` (a local Bot API server is a real use; tests point it at a
fake). The bot token travels in the request path only: no error, log line or metric ever
carries it, so an HTTP failure is named by its kind, never by httpx's message (which holds the
URL). Connection failures are retried by httpx's transport (`retries`), nothing else is.
"""

from __future__ import annotations

from typing import Any

import httpx

from app.config import BotSettings, Settings

TIMEOUT_SECONDS = 30.0


class BotApiError(Exception):
    """Telegram refused a call (`code`: its error_code; `retry_after`: the seconds a 429 asks
    to wait), or could not be reached (`code` None)."""

    def __init__(self, message: str, code: int | None = None, retry_after: float | None = None):
        super().__init__(message)
        self.code = code
        self.retry_after = retry_after


def _request(settings: Settings, bot: BotSettings, method: str, params: dict[str, Any]) -> Any:
    if bot.bot_token is None:
        raise BotApiError(f"bot {bot.name!r} has no bot_token (INTAKE_BOT_TOKEN or bot_token)")
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


def _result(method: str, response: httpx.Response) -> Any:
    try:
        answer = response.json()
    except ValueError:
        raise BotApiError(
            f"{method}: HTTP {response.status_code}, not a Bot API answer", response.status_code
        ) from None
    if not isinstance(answer, dict) or not answer.get("ok"):
        code = answer.get("error_code", response.status_code) if isinstance(answer, dict) else ""
        words = answer.get("description", "no description") if isinstance(answer, dict) else ""
        number = code if isinstance(code, int) else response.status_code
        parameters = answer.get("parameters") if isinstance(answer, dict) else None
        wait = parameters.get("retry_after") if isinstance(parameters, dict) else None
        retry_after = float(wait) if isinstance(wait, int | float) and wait >= 0 else None
        raise BotApiError(f"{method}: Telegram refused: {code} {words}", number, retry_after)
    return answer.get("result")


def call(settings: Settings, bot: BotSettings, method: str, **params: Any) -> Any:
    """One Bot API method, blocking (the command line's); its `result`."""
    url, payload = _request(settings, bot, method, params)
    transport = httpx.HTTPTransport(retries=2)  # connection failures only
    try:
        with httpx.Client(transport=transport, timeout=TIMEOUT_SECONDS) as client:
            response = client.post(url, json=payload)
    except httpx.HTTPError as error:
        raise _unreachable(settings, method, error) from None
    return _result(method, response)


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
        response = await client.post(url, json=payload, timeout=timeout)
    except httpx.HTTPError as error:
        raise _unreachable(settings, method, error) from None
    return _result(method, response)


def async_client() -> httpx.AsyncClient:
    """A client for `call_async`: connection failures retried twice, no redirects."""
    transport = httpx.AsyncHTTPTransport(retries=2)
    return httpx.AsyncClient(transport=transport, timeout=TIMEOUT_SECONDS)
