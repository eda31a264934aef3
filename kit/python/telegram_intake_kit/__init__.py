"""The downstream kit: what a bot's own service needs behind telegram-intake.

- `read_forwarded(headers, body, signing_secret=..., secret_token=...)` verifies a forwarded
  request and returns its update, attempt identity and fencing token (`Forwarded`), or
  raises `Rejected`;
- `IntakeClient(base_url, api_key)` calls the callback API: `owns`, `renew`, `settle`,
  `acknowledge`;
- `Identity` and the other messages of the callback API (`telegram_intake_kit.wire`);
- `Terminal`, `IntakeAttempt` and `current_attempt()`, what the framework adapters give a
  bot's handlers: `telegram_intake_kit.aiogram` (extra `aiogram`) and
  `telegram_intake_kit.ptb` (extra `ptb`), imported only when asked for.

It needs only httpx and pydantic (the service's own dependencies stay out of it). `owns` over
HTTP is check-then-act, a hint: a reclaim can pass between its answer and the write. The
guarantee for a downstream with a database of its own is `telegram_intake_kit.fence` (which needs
SQLAlchemy, and is not imported here): the fencing token, checked and recorded in the
domain write's own transaction. A downstream that shares the service's database uses
`app.store.fencing` instead, which holds the claim itself until the write commits.
"""

from telegram_intake_kit.attempt import IntakeAttempt, Terminal, current_attempt
from telegram_intake_kit.client import CallbackError, IntakeClient
from telegram_intake_kit.forwarded import FenceToken, Forwarded, Rejected, read_forwarded, sign
from telegram_intake_kit.wire import Identity, Owned, Renewed, Settled

__all__ = [
    "CallbackError",
    "FenceToken",
    "Forwarded",
    "Identity",
    "IntakeAttempt",
    "IntakeClient",
    "Owned",
    "Rejected",
    "Renewed",
    "Settled",
    "Terminal",
    "current_attempt",
    "read_forwarded",
    "sign",
]
