"""The bearer keys of `/v1/*`, as the request guard looks them up: `Keys.find` compares the
given key with every configured key in constant time, and the loop never stops early, so
timing tells nothing about any key. The key found rides in the request's scope under
`API_KEY_SCOPE`, where `app.api.deps` takes it."""

from __future__ import annotations

import hmac
from collections.abc import Iterable

from app.api_keys import ApiKey

__all__ = ["API_KEY_SCOPE", "KEY_REQUIRED", "NO_KEYS", "Keys"]

API_KEY_SCOPE = "telegram_intake.api_key"
KEY_REQUIRED = "a valid API key is required: Authorization: Bearer <key>"
NO_KEYS = "no API keys are configured (INTAKE_API_KEYS)"


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
