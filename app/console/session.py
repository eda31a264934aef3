"""The console's sign-in: a session cookie that names an API key without holding it, and the
CSRF token of every form.

Signing in posts a key in a form (never in a URL). What the cookie carries is the key's name
(`ApiKey.label`: the audit log's name for it, never the key) and a random nonce, signed with
itsdangerous and stamped with its time, so it expires after `console_session_seconds`; each
request finds the key again by its name, and a key removed from the configuration ends its
sessions. The cookie is HttpOnly, SameSite=Strict, and Secure when the request came over HTTPS
(directly, or through a proxy of `trusted_proxies` that says so in X-Forwarded-Proto).
Every form carries a CSRF token: the nonce signed under another salt, so it is valid for this
session only.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from itsdangerous import BadSignature, Signer, URLSafeTimedSerializer
from starlette.requests import Request
from starlette.responses import Response

from app.config import ApiKey, Settings
from app.intake.sources import came_over_https

COOKIE = "intake_console"
PATH = "/console"


@dataclass(frozen=True, slots=True)
class Session:
    """A signed-in person: the key they signed in with, and this session's CSRF token."""

    key: ApiKey
    csrf: str

    @property
    def may_act(self) -> bool:
        return self.key.may("operator")

    def allows(self, bot: str) -> bool:
        return self.key.allows(bot)


class Sessions:
    """Issues and reads the console's session cookies for one configuration."""

    def __init__(self, settings: Settings) -> None:
        secret = _secret(settings)
        self._cookies = URLSafeTimedSerializer(secret, salt="console-session")
        self._csrf = Signer(secret, salt="console-csrf")
        self._keys = {key.label: key for key in settings.api_keys}
        self._max_age = settings.console_session_seconds
        self._proxies = settings.trusted_proxies

    def sign_in(self, response: Response, request: Request, key: ApiKey) -> None:
        """Start a session for `key` on `response`."""
        value = self._cookies.dumps({"key": key.label, "nonce": secrets.token_urlsafe(16)})
        response.set_cookie(
            COOKIE,
            value,
            max_age=self._max_age,
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

    def sign_out(self, response: Response) -> None:
        response.delete_cookie(COOKIE, path=PATH, httponly=True, samesite="strict")

    def of(self, request: Request) -> Session | None:
        """The request's session, if its cookie is ours, unexpired, and its key still exists."""
        value = request.cookies.get(COOKIE)
        if not value:
            return None
        try:
            found = self._cookies.loads(value, max_age=self._max_age)
        except BadSignature:  # SignatureExpired included
            return None
        if not isinstance(found, dict):
            return None
        key = self._keys.get(str(found.get("key")))
        nonce = found.get("nonce")
        if key is None or not isinstance(nonce, str):
            return None
        return Session(key, self._csrf.sign(nonce).decode())

    @staticmethod
    def csrf_matches(session: Session, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(session.csrf, given)


def _secret(settings: Settings) -> bytes:
    if settings.console_secret is not None:
        return settings.console_secret.get_secret_value().encode()
    # Drawn from the keys: every process of one configuration agrees on it, and it changes
    # (ending every session) when the keys do. Never a key itself.
    keys = sorted(key.key.get_secret_value() for key in settings.api_keys)
    return hashlib.sha256(("telegram-intake console\0" + "\0".join(keys)).encode()).digest()
