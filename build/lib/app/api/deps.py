"""What every `/v1` route depends on: the bearer key that grants it, and the service's parts.

Keys come from `INTAKE_API_KEYS` (full access) or `[[api_keys]]` tables (limited to some bots
and to `callback` or `operations` use). A request without a valid key is 401; a valid key
used outside its bots or scope is 403. The given key is compared with every configured key in
constant time, and the loop never stops early, so timing tells nothing about any key.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.config import ApiKey, BotSettings, Scope, Settings
from app.kit.wire import Problem
from app.store import SqlUpdateStore

bearer = HTTPBearer(
    auto_error=False,
    description="A key from INTAKE_API_KEYS or an [[api_keys]] table: "
    "`Authorization: Bearer <key>`.",
)
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


@dataclass(frozen=True)
class Services:
    """The parts of the running service the API works with."""

    settings: Settings
    store: SqlUpdateStore
    now: Callable[[], int]  # epoch ms by the database clock
    wake: Callable[[], Awaitable[None]]  # tell the workers a row changed


class Keys:
    def __init__(self, keys: Iterable[ApiKey]) -> None:
        self._keys = [(key.key.get_secret_value().encode(), key) for key in keys]

    def find(self, given: str) -> ApiKey | None:
        candidate = given.encode()
        found = None
        for secret, key in self._keys:
            if hmac.compare_digest(candidate, secret):
                found = key
        return found


@dataclass(frozen=True)
class Grant:
    """A request's valid key, with the service it may use."""

    key: ApiKey
    services: Services

    def allow(self, name: str) -> None:
        """403 unless this key may act for bot `name`."""
        if not self.key.allows(name):
            raise HTTPException(403, f"this API key is not allowed bot {name!r}")

    def bot(self, name: str) -> BotSettings:
        """The configured bot `name`, if this key may act for it: 403 or 404 otherwise."""
        self.allow(name)
        bot = self.services.settings.bot(name)
        if bot is None:
            raise HTTPException(404, f"no bot {name!r} is configured")
        return bot

    def bots(self, name: str | None) -> list[str] | None:
        """The bots a listing covers: `name` if given and allowed, else all this key may see."""
        if name is not None:
            self.allow(name)
            return [name]
        return None if self.key.bots is None else list(self.key.bots)


def authenticated(request: Request, credentials: HTTPAuthorizationCredentials | None) -> ApiKey:
    """The request's valid key: 401 without one."""
    keys: Keys = request.app.state.api_keys
    key = None if credentials is None else keys.find(credentials.credentials)
    if key is None:
        problem = (
            "no API keys are configured (INTAKE_API_KEYS)"
            if not request.app.state.settings.api_keys
            else "a valid API key is required: Authorization: Bearer <key>"
        )
        raise HTTPException(401, problem, headers={"WWW-Authenticate": "Bearer"})
    return key


def granted(*scopes: Scope) -> Callable[[Request, Credentials], Awaitable[Grant]]:
    """A dependency: the request's key, valid and holding one of `scopes`."""

    # async: FastAPI would run a plain function in its thread pool, a thread hop per request.
    async def check(request: Request, credentials: Credentials) -> Grant:
        key = authenticated(request, credentials)
        if not set(scopes) & set(key.scopes):
            raise HTTPException(403, f"this API key lacks the {' or '.join(scopes)} scope")
        return Grant(key, request.app.state.services)

    return check


# The refusals every /v1 route may answer, for the OpenAPI document.
REFUSALS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "no valid API key"},
    403: {"model": Problem, "description": "the key may not act for this bot or scope"},
    503: {"model": Problem, "description": "the database is unavailable; retry"},
}

Callback = Annotated[Grant, Depends(granted("callback"))]
Operations = Annotated[Grant, Depends(granted("operations"))]
CallbackOrOperations = Annotated[Grant, Depends(granted("callback", "operations"))]
