"""The downstream kit: what a bot's own service needs behind telegram-intake.

- `read_forwarded(headers, body, signing_secret=..., secret_token=...)` verifies a forwarded
  request and returns its update and attempt identity (`Forwarded`), or raises `Rejected`;
- `IntakeClient(base_url, api_key)` calls the callback API: `owns`, `renew`, `settle`,
  `acknowledge`;
- `Identity` and the other messages of the callback API (`app.kit.wire`).

It needs only httpx and pydantic (the service's own dependencies stay out of it). Where the
downstream shares the service's database, `app.store.fencing` checks ownership inside the
domain write's own transaction instead of over HTTP.
"""

from app.kit.client import CallbackError, IntakeClient
from app.kit.forwarded import Forwarded, Rejected, read_forwarded, sign
from app.kit.wire import Identity, Owned, Renewed, Settled

__all__ = [
    "CallbackError",
    "Forwarded",
    "Identity",
    "IntakeClient",
    "Owned",
    "Rejected",
    "Renewed",
    "Settled",
    "read_forwarded",
    "sign",
]
