"""The request guard: refusals decided from a request's head alone, before any route runs and
before a byte of its body is read. An ASGI middleware in front of every app of ours (inside
only Starlette's own error and body-limit layers).

- Two `Authorization` headers, or two `X-Telegram-Bot-Api-Secret-Token`, or two
  `Content-Encoding`: 400. Servers and proxies disagree on which one counts.
- Every path but `/telegram/{bot}`, `/healthz`, `/readyz` and the apps mounted beside ours
  (the console, with its own sign-in; the demo downstream) needs a valid bearer key: 401
  without one, the body unread (FastAPI reads a JSON body before any dependency runs, so a
  route's own check would come after the whole body sat in memory). The key found is kept
  in the scope, where `app.api.deps` takes it. `/readyz` answers without a key, but a key
  presented to it is looked up as on any other path (a wrong one is 401): with a viewer key
  it says why it is not ready (`app.api.health`).
- Each wrong key counts against its source address (`app.http.throttle`); a source past its
  allowance is 429 with `Retry-After` before its key is looked at, right or wrong.
- Behind a key: a `Content-Encoding` other than `identity` is 415 (nothing here decodes one),
  and a body over `api_max_body_bytes`, declared or as it streams in, is 413.
- An admitted request for a lean route (`app.api.lean`: the callbacks asked on every update)
  is answered by that route's handler here, without the layers and the router inside.

The webhook route makes the same encoding and size checks itself, after its secret (a wrong
secret is 403 before anything about the body). Each refusal is counted
(`telegram_intake_requests_refused_total{reason}`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from fastapi.security.utils import get_authorization_scheme_param
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api_keys import ApiKey
from app.config import Settings
from app.http.keys import API_KEY_SCOPE, KEY_REQUIRED, NO_KEYS, Keys
from app.http.throttle import AuthThrottle
from app.metric_labels import Refusal

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = [
    "PUBLIC_PATHS",
    "WEBHOOK_PREFIX",
    "Refusal",
    "RequestGuard",
    "install_guard",
    "read_head",
    "refuse",
    "unsupported_encoding",
]

# What answers without a key: Telegram's route and the probes.
PUBLIC_PATHS = frozenset({"/healthz", "/readyz"})
# The public path that reads a key when one is presented: with it, it says more.
KEYED_WHEN_PRESENTED = "/readyz"
WEBHOOK_PREFIX = "/telegram/"
# Headers that must come at most once.
_SINGLE = {
    b"authorization": "Authorization",
    b"x-telegram-bot-api-secret-token": "X-Telegram-Bot-Api-Secret-Token",
    b"content-encoding": "Content-Encoding",
}
# A route answered here: its handler, by (method, path).
Lean = Mapping[tuple[str, str], Callable[[Request], Awaitable[Response]]]


def read_head(headers: Iterable[tuple[bytes, bytes]]) -> dict[bytes, bytes] | str:
    """The headers that must come at most once (`_SINGLE`) and the first `Content-Length`, by
    name; or, when one of the former came twice, the 400's words saying so. The webhook's lean
    path reads a request's head with it too (`app.intake.route`), so both refuse alike."""
    once: dict[bytes, bytes] = {}
    for name, value in headers:
        if name in _SINGLE:
            if name in once:
                return f"more than one {_SINGLE[name]} header"
            once[name] = value
        elif name == b"content-length":
            once.setdefault(name, value)
    return once


async def refuse(
    send: Send, status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """Answer `{"error": message}` with `status`, straight through ASGI."""
    body = json.dumps({"error": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(body)),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def unsupported_encoding(value: str | bytes | None) -> bool:
    """Whether a Content-Encoding header names an encoding (nothing here decodes any)."""
    if value is None:
        return False
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    return value.strip().lower() not in ("", "identity")


class RequestGuard:
    def __init__(
        self,
        app: ASGIApp,
        *,
        keys: Keys,
        no_keys: bool,
        max_body_bytes: int,
        refused: Callable[[Refusal], None] | None = None,
        mounted: tuple[str, ...] = (),
        lean: Lean | None = None,
        throttle: AuthThrottle | None = None,
    ) -> None:
        self.app = app
        self._lean = lean or {}
        if any(not path.strip("/") for path in mounted):
            raise ValueError("an app mounted at / would leave every path without a key")
        # Apps mounted beside ours (the demo downstream, the console) check their own callers.
        self._open_prefixes = (WEBHOOK_PREFIX, *(f"{path.rstrip('/')}/" for path in mounted))
        self._open_paths = PUBLIC_PATHS | {path.rstrip("/") for path in mounted}
        self._keys = keys
        self._unauthenticated = NO_KEYS if no_keys else KEY_REQUIRED
        self._max_body_bytes = max_body_bytes
        self._refused = refused
        self._throttle = throttle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        once = read_head(scope["headers"])
        if isinstance(once, str):
            await self._refuse(send, "duplicate_header", 400, once)
            return
        declared = once.get(b"content-length")
        path: str = scope["path"]
        authorization = once.get(b"authorization")
        public = path.startswith(self._open_prefixes) or path in self._open_paths
        # A key presented to /readyz is looked up, and a wrong one refused, as anywhere else.
        if public and (path != KEYED_WHEN_PRESENTED or authorization is None):
            await self.app(scope, receive, send)
            return
        throttle = self._throttle
        # Before the key is looked at: a guesser past its allowance learns nothing more. With
        # no failure remembered (the usual case) nobody is throttled: no address to read.
        if (
            throttle is not None
            and len(throttle) > 0
            and (wait := throttle.retry_after(throttle.source(scope)))
        ):
            await self._refuse(
                send,
                "throttled",
                429,
                f"too many failed authentications from this address: retry after {wait} s",
                [(b"retry-after", b"%d" % wait)],
            )
            return
        key = self._key(authorization)
        if key is None:
            # Only a key presented and refused counts: a request with none guesses nothing.
            if throttle is not None and authorization is not None:
                throttle.failed(throttle.source(scope))
            await self._refuse(
                send,
                "unauthenticated",
                401,
                self._unauthenticated,
                [(b"www-authenticate", b"Bearer")],
            )
            return
        if unsupported_encoding(once.get(b"content-encoding")):
            await self._refuse(send, "encoding", 415, "no Content-Encoding is accepted")
            return
        limit = self._max_body_bytes
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._refuse(send, "too_large", 413, f"body over {limit} bytes")
            return
        scope[API_KEY_SCOPE] = key
        receive = self._capped(receive)
        lean = self._lean.get((scope["method"], path))
        if lean is None:
            await self.app(scope, receive, send)
            return
        response = await lean(Request(scope, receive))
        await response(scope, receive, send)

    def _key(self, authorization: bytes | None) -> ApiKey | None:
        if authorization is None:
            return None
        scheme, token = get_authorization_scheme_param(authorization.decode("latin-1"))
        return self._keys.find(token) if scheme.lower() == "bearer" and token else None

    def _capped(self, receive: Receive) -> Receive:
        """`receive`, refusing (413, through the app's error handler) past the body limit."""
        limit = self._max_body_bytes
        size = 0

        async def capped() -> Message:
            nonlocal size
            message = await receive()
            if message["type"] == "http.request":
                size += len(message.get("body", b""))
                if size > limit:
                    if self._refused is not None:
                        self._refused("too_large")
                    raise HTTPException(413, f"body over {limit} bytes")
            return message

        return capped

    async def _refuse(
        self,
        send: Send,
        reason: Refusal,
        status: int,
        message: str,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        if self._refused is not None:
            self._refused(reason)
        await refuse(send, status, message, headers)


def install_guard(
    app: FastAPI,
    settings: Settings,
    refused: Callable[[Refusal], None],
    mounted: tuple[str, ...] = (),
    lean: Lean | None = None,
) -> None:
    """Put the request guard in front of `app`, with the keys and limits of `settings`, each
    refusal told to `refused` (the metrics' counter); the apps `mounted` at those paths are
    left to check their own callers; the `lean` routes are answered by the guard itself.
    The guard's throttle of failed authentications is `app.state.auth_throttle`, for the
    console's sign-in to count against too."""
    throttle = AuthThrottle.of(settings)
    app.state.auth_throttle = throttle
    app.add_middleware(
        RequestGuard,
        keys=Keys(settings.api_keys),
        no_keys=not settings.api_keys,
        max_body_bytes=settings.api_max_body_bytes,
        refused=refused,
        mounted=mounted,
        lean=lean,
        throttle=throttle,
    )
