"""An async client for the callback API: owns, renew, settle, acknowledge.

Connection failures are retried by httpx's own transport (`retries`); an answer that is not
2xx raises `CallbackError` with the service's message. The answers are the models of
`telegram_intake_kit.wire`, the same ones the service validates with.
"""

from __future__ import annotations

from types import TracebackType
from typing import TypeVar

import httpx
from pydantic import BaseModel

from telegram_intake_kit.wire import (
    DEFAULT_DESTINATION,
    Acknowledged,
    Identity,
    Outcome,
    Owned,
    Renewed,
    RenewRequest,
    Settled,
    SettleRequest,
)

Answer = TypeVar("Answer", bound=BaseModel)


class CallbackError(Exception):
    """The service refused or failed a call (401, 403, 404, 409, 422, 503, ...)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class IntakeClient:
    """Calls `/v1/claims/*` and `/v1/exhaustions/acknowledge` of one telegram-intake."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 10.0,
        retries: int = 2,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url,
            headers={"authorization": f"Bearer {api_key}"},
            timeout=timeout,
            transport=transport or httpx.AsyncHTTPTransport(retries=retries),
        )

    async def __aenter__(self) -> IntakeClient:
        return self

    async def __aexit__(
        self,
        _type: type[BaseException] | None,
        _error: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def owns(self, identity: Identity) -> Owned:
        """Whether `identity` still holds its lease, and until when."""
        return await self._call("/v1/claims/owns", identity, Owned)

    async def renew(self, identity: Identity, lease_ms: int | None = None) -> Renewed:
        """Extend a live lease to `lease_ms` from now (default: the bot's lease)."""
        request = RenewRequest(**identity.model_dump(), lease_ms=lease_ms)
        return await self._call("/v1/claims/renew", request, Renewed)

    async def settle(
        self,
        identity: Identity,
        outcome: Outcome,
        *,
        error: str | None = None,
        retry_after_ms: int | None = None,
    ) -> Settled:
        """End the attempt: completed, failed (retried) or exhausted."""
        request = SettleRequest(
            **identity.model_dump(), outcome=outcome, error=error, retry_after_ms=retry_after_ms
        )
        return await self._call("/v1/claims/settle", request, Settled)

    async def acknowledge(self, identity: Identity) -> Acknowledged:
        """Acknowledge the exhaustion with exactly this identity."""
        return await self._call("/v1/exhaustions/acknowledge", identity, Acknowledged)

    async def _call(self, path: str, message: BaseModel, answer: type[Answer]) -> Answer:
        response = await self._http.post(path, content=_json(message), headers=_JSON)
        if not response.is_success:
            try:
                problem = str(response.json().get("error", response.text))
            except ValueError:
                problem = response.text
            raise CallbackError(response.status_code, problem)
        return answer.model_validate_json(response.content)


_JSON = {"content-type": "application/json"}


def _json(message: BaseModel) -> str:
    """The request's JSON: no nulls, and no `destination` when it is `default`, so that a
    service from before destinations (which refuses fields it does not know) takes it."""
    defaulted = getattr(message, "destination", None) == DEFAULT_DESTINATION
    return message.model_dump_json(
        exclude_none=True, exclude={"destination"} if defaulted else None
    )
