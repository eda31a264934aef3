"""What a bot's handler is given about the attempt it runs in, and how it says "never".

- `IntakeAttempt`: the attempt's `identity`, its `fence_token` and `owns()`. The adapters give
  it to handlers (aiogram: the handler argument `intake`; python-telegram-bot and any other
  code: `current_attempt()`); None for a `plain` bot's request, which carries no identity.
- `Terminal`: raised by a handler, the update can never succeed. The adapter answers 422, and
  the service keeps the update as an exhaustion until someone acknowledges it, rather than
  retrying it. Any other exception is a failure the service retries.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field

from telegram_intake_kit.client import IntakeClient
from telegram_intake_kit.forwarded import FenceToken
from telegram_intake_kit.wire import Identity


class Terminal(Exception):
    """This update can never be handled: keep it as an exhaustion, do not retry it."""


@dataclass(frozen=True)
class IntakeAttempt:
    """One attempt at an update, as the service forwarded it."""

    identity: Identity
    fence_token: FenceToken | None
    lease_expires_at: int | None
    client: IntakeClient | None = field(default=None, repr=False)

    @property
    def destination(self) -> str:
        """The destination this attempt delivers to: `default` for the bot's own downstream,
        or the name of another (docs/destinations.md); every callback sends it back."""
        return self.identity.destination

    async def owns(self) -> bool:
        """Whether this attempt still holds its lease, asked of the service now. Over HTTP
        it is a hint (a reclaim can pass between the answer and a write): a downstream with
        a database of its own fences its writes with `fence_token` (`telegram_intake_kit.
        fence`). Needs the adapter's `intake_url` and `api_key`."""
        if self.client is None:
            raise RuntimeError("owns() needs the adapter's intake_url and api_key")
        return (await self.client.owns(self.identity)).owned


_current: ContextVar[IntakeAttempt | None] = ContextVar("telegram_intake_attempt", default=None)


def current_attempt() -> IntakeAttempt | None:
    """The attempt the running handler belongs to: None outside an adapter, or for a plain
    bot's request. Tasks a handler starts see it too (they copy the context)."""
    return _current.get()
