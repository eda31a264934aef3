"""What every `/v1` route depends on: the bearer key that grants it, and the service's parts.

Keys come from `INTAKE_API_KEYS` (full access) or `[[api_keys]]` tables (limited to some bots
and to `callback`, `viewer` or `operator` use). A request without a valid key is 401, from the
request guard (`app.http.guard`) before its body is read; the guard leaves the key it found in the
scope, under `API_KEY_SCOPE` (`app.http.keys`, which compares keys in constant time). A valid
key used outside its bots or scope is 403.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Query, Request, Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.api.leases import LeaseChecks, LeaseRenewals
from app.api_keys import ApiKey, Scope
from app.bot_settings import BotSettings
from app.config import Settings
from app.http.keys import API_KEY_SCOPE, KEY_REQUIRED
from app.http.strict_json import NotJson, read_json
from app.store import ClaimIdentity, OperatorStore
from telegram_intake_kit.wire import BOT_PATTERN, Problem

bearer = HTTPBearer(
    auto_error=False,
    description="A key from INTAKE_API_KEYS or an [[api_keys]] table: "
    "`Authorization: Bearer <key>`.",
)
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
# Whose deliveries a read is seen from (`Grant.seen_from`); default: the rows as they stand,
# or, for a key limited to one destination, that destination's.
SeenFromQuery = Annotated[
    str | None,
    Query(pattern=BOT_PATTERN, description="one destination's deliveries; default: the rows'"),
]


@dataclass(frozen=True)
class Services:
    """The parts of the running service the API works with."""

    settings: Settings
    store: OperatorStore
    now: Callable[[], int]  # epoch ms by the database clock
    wake: Callable[[], Awaitable[None]]  # tell the workers a row changed
    # Concurrent owns share a read and renews a write; None: a statement each.
    leases: LeaseChecks | None = None
    renewals: LeaseRenewals | None = None

    async def owned_lease(self, identity: ClaimIdentity) -> int | None:
        """`owns` now: the live lease's expiry of exactly this attempt, or None."""
        if self.leases is None:
            return await self.store.owned_lease(identity, self.now())
        return await self.leases.lease(identity)

    async def renewed_lease(self, identity: ClaimIdentity, lease_ms: int) -> int | None:
        """`renew` to `lease_ms` from now: the lease's expiry after it, or None."""
        if self.renewals is None:
            now = self.now()
            return await self.store.renewed_lease(identity, now + lease_ms, now)
        return await self.renewals.renew(identity, lease_ms)


@dataclass(frozen=True)
class Grant:
    """A request's valid key, with the service it may use."""

    key: ApiKey
    services: Services

    def allow(self, name: str, destination: str | None = None) -> None:
        """403 unless this key may act for bot `name` (and, named, its `destination`)."""
        if not self.key.allows(name):
            raise HTTPException(403, f"this API key is not allowed bot {name!r}")
        if not self.key.allows(name, destination):
            raise HTTPException(403, f"this API key is not allowed destination {destination!r}")

    def whole_bots(self) -> None:
        """403 for a key limited to destinations: what belongs to a bot as a whole (its
        pause, its audit log, its erasures, its metrics) is not any one service's."""
        if self.key.destinations is not None:
            raise HTTPException(
                403,
                f"this API key is limited to destinations {', '.join(self.key.destinations)}: "
                "what concerns a bot as a whole needs a key that is not",
            )

    def seen_from(self, asked: str | None) -> str | None:
        """The destination a read is seen from: `asked`, if this key may see it; for a key
        limited to destinations that asked none, its one destination (403 with several)."""
        limited = self.key.destinations
        if limited is None:
            return asked
        if asked is None:
            if len(limited) > 1:
                raise HTTPException(
                    403,
                    f"this API key is limited to destinations {', '.join(limited)}: "
                    "name one with destination=",
                )
            return limited[0]
        if asked not in limited:
            raise HTTPException(403, f"this API key is not allowed destination {asked!r}")
        return asked

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
    """The request's valid key, as the request guard found it: 401 without one. (`credentials`
    puts the bearer scheme in the OpenAPI document.)"""
    key: ApiKey | None = request.scope.get(API_KEY_SCOPE)
    if key is None:  # only an app without the guard in front
        raise HTTPException(401, KEY_REQUIRED, headers={"WWW-Authenticate": "Bearer"})
    return key


class Granted:
    """A dependency: the request's key, valid and holding one of `scopes`, with the service.
    `grant` is the same check for a caller that has the request but no dependency solving (a
    lean route, `app.api.lean`)."""

    def __init__(self, *scopes: Scope) -> None:
        self.scopes = frozenset(scopes)
        self._lacking = f"this API key lacks the {' or '.join(scopes)} scope"

    def grant(self, request: Request) -> Grant:
        key = authenticated(request, None)
        if not any(key.may(scope) for scope in self.scopes):
            raise HTTPException(403, self._lacking)
        return Grant(key, request.app.state.services)

    # async: FastAPI would run a plain function in its thread pool, a thread hop per request.
    async def __call__(self, request: Request, credentials: Credentials) -> Grant:
        return self.grant(request)


class _StrictJsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            try:
                _, self._json = read_json(await self.body())
            except NotJson as error:
                raise HTTPException(400, str(error)) from None
        return self._json


class StrictJsonRoute(APIRoute):
    """A route whose JSON body is read by the webhook's reader (`app.http.strict_json`): one
    set of rules for both, and a body that is not JSON is 400 as it is there; JSON that does
    not fit the route's model is 422."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(_StrictJsonRequest(request.scope, request.receive))

        return strict


# The refusals every /v1 route may answer, for the OpenAPI document.
REFUSALS: dict[int | str, dict[str, Any]] = {
    400: {"model": Problem, "description": "the body is not strict JSON (docs/api.md)"},
    401: {"model": Problem, "description": "no valid API key"},
    403: {"model": Problem, "description": "the key may not act for this bot or scope"},
    413: {"model": Problem, "description": "the body is over INTAKE_API_MAX_BODY_BYTES"},
    415: {"model": Problem, "description": "a Content-Encoding: none is accepted"},
    503: {"model": Problem, "description": "the database is unavailable; retry"},
}

Callback = Annotated[Grant, Depends(Granted("callback"))]
Viewer = Annotated[Grant, Depends(Granted("viewer"))]
Operator = Annotated[Grant, Depends(Granted("operator"))]
CallbackOrOperator = Annotated[Grant, Depends(Granted("callback", "operator"))]
