"""The console's sign-in: a server-side session named by a random token in a cookie, and the CSRF
token of every form (docs/security.md).

Signing in posts a key in a form (never in a URL). The cookie holds a random token, signed with
itsdangerous and stamped with its time; the database keeps only the token's SHA-256, the key's
HMAC under the console's secret, and when the session started and was last seen (the store's
`start_session`). Each request finds the session again there, and so a session ends, in every
process at once and with no restart:
- at sign-out (`end_session`);
- after `console_idle_seconds` without a request, and `console_session_seconds` after sign-in;
- when its key is removed from the configuration or its value changes: the key's HMAC no longer
  matches a configured key (with no `console_secret`, the secret is drawn from the keys, so a
  change of any key ends every session).
The cookie is HttpOnly, SameSite=Strict, and Secure when the request came over HTTPS (directly,
or through a proxy of `trusted_proxies` that says so in X-Forwarded-Proto). Every form carries a
CSRF token: an HMAC of the session's id under the secret, valid for this session only (never the
token itself, which pages would then carry where the HttpOnly cookie keeps it from scripts).
A request a page makes by itself (the overview's refresh) finds its session without marking it
seen, so an open tab left alone still ends after the idle time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from itsdangerous import BadSignature, URLSafeTimedSerializer
from starlette.requests import Request
from starlette.responses import Response

from app.api.deps import Services
from app.api_keys import ApiKey
from app.config import Settings
from app.http.sources import came_over_https

COOKIE = "intake_console"
PATH = "/console"


@dataclass(frozen=True, slots=True)
class Session:
    """A signed-in person: the key they signed in with, the session's id (the digest of its
    token) and its CSRF token."""

    key: ApiKey
    id: str
    csrf: str

    @property
    def may_act(self) -> bool:
        return self.key.may("operator")

    def allows(self, bot: str) -> bool:
        return self.key.allows(bot)


class Sessions:
    """Starts, finds and ends the console's sessions for one configuration."""

    def __init__(self, settings: Settings) -> None:
        secret = _secret(settings)
        self._secret = secret
        self._cookies = URLSafeTimedSerializer(secret, salt="console-session")
        self._keys = {self._digest(key): key for key in settings.api_keys}
        self._lifetime_ms = settings.console_session_seconds * 1000
        self._idle_ms = settings.console_idle_seconds * 1000
        self._proxies = settings.trusted_proxies

    def _digest(self, key: ApiKey) -> str:
        value = key.key.get_secret_value().encode()
        return hmac.new(self._secret, value, hashlib.sha256).hexdigest()

    async def sign_in(
        self, response: Response, request: Request, key: ApiKey, services: Services
    ) -> None:
        """Start a session for `key`, its cookie set on `response`."""
        token = secrets.token_urlsafe(32)
        await services.store.start_session(
            _session_id(token),
            key_digest=self._digest(key),
            at=services.now(),
            idle_ms=self._idle_ms,
            lifetime_ms=self._lifetime_ms,
        )
        response.set_cookie(
            COOKIE,
            self._cookies.dumps(token),
            max_age=self._lifetime_ms // 1000,
            path=PATH,
            secure=came_over_https(
                request.url.scheme,
                request.client.host if request.client else None,
                request.headers.get("x-forwarded-proto"),
                self._proxies,
            ),
            httponly=True,
            samesite="strict",
        )

    async def sign_out(self, response: Response, session: Session, services: Services) -> None:
        """End `session` in every process, and drop its cookie."""
        await services.store.end_session(session.id)
        response.delete_cookie(COOKIE, path=PATH, httponly=True, samesite="strict")

    async def of(
        self, request: Request, services: Services, *, seen: bool = True
    ) -> Session | None:
        """The request's session: its cookie is ours, the session is live in the database
        (with `seen`, now marked seen), and its key is still configured with the same value."""
        value = request.cookies.get(COOKIE)
        if not value:
            return None
        try:
            token = self._cookies.loads(value, max_age=self._lifetime_ms // 1000)
        except BadSignature:  # SignatureExpired included
            return None
        if not isinstance(token, str):
            return None
        session_id = _session_id(token)
        digest = await services.store.find_session(
            session_id,
            at=services.now(),
            idle_ms=self._idle_ms,
            lifetime_ms=self._lifetime_ms,
            seen=seen,
        )
        key = None if digest is None else self._keys.get(digest)
        if key is None:
            return None
        csrf = hmac.new(self._secret, b"console-csrf\0" + session_id.encode(), hashlib.sha256)
        return Session(key, session_id, csrf.hexdigest())

    @staticmethod
    def csrf_matches(session: Session, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(session.csrf, given)


def _session_id(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _secret(settings: Settings) -> bytes:
    if settings.console_secret is not None:
        return settings.console_secret.get_secret_value().encode()
    # Drawn from the keys: every process of one configuration agrees on it, and it changes
    # (ending every session) when the keys do. Never a key itself.
    keys = sorted(key.key.get_secret_value() for key in settings.api_keys)
    return hashlib.sha256(("telegram-intake console\0" + "\0".join(keys)).encode()).digest()
