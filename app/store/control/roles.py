"""What operator control offers its users."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from app.store.operator_types import BotControl
from app.store.types import DEFAULT_DESTINATION, ClaimIdentity


class Control(Protocol):
    """Pause, resume, the rate limit and its shared bucket, the breaker, park (revision 0004)."""

    async def bot_controls(
        self, bots: Sequence[str] | None = None, *, destinations: bool = False
    ) -> list[BotControl]:
        """The controls of these bots in bot order (defaults for a bot never touched); every
        bot that has any, when None. With `destinations`, those of their destinations beside
        `default` that have any (revision 0010)."""
        ...

    async def pause(
        self,
        bot: str,
        *,
        at: int,
        by: str,
        reason: str | None = None,
        destination: str = DEFAULT_DESTINATION,
    ) -> bool:
        """From this commit no claim, in any process, starts an attempt of `bot` (of any of
        its destinations), or with `destination` beside `default` of that destination; its
        updates are still recorded, attempts in flight finish. True when this call paused it
        (one already paused keeps its first pause, and nothing is recorded)."""
        ...

    async def resume(
        self, bot: str, *, at: int, by: str, destination: str = DEFAULT_DESTINATION
    ) -> bool:
        """Lift the pause and wake the workers of every process; False when not paused."""
        ...

    async def set_rate_limit(
        self,
        bot: str,
        per_second: float | None,
        *,
        at: int,
        by: str,
        destination: str = DEFAULT_DESTINATION,
    ) -> None:
        """At most `per_second` attempts of `bot`'s `destination` start per second across
        every process (None: no limit). The limit's bucket starts empty."""
        ...

    async def take_tokens(
        self, bot: str, wanted: int, *, now: int, destination: str = DEFAULT_DESTINATION
    ) -> int:
        """How many of `wanted` attempts of `bot` may start now, taken from the bucket that
        every process shares (refilled at the rate, holding a second's worth and at least
        one); `wanted` when the bot has no limit."""
        ...

    async def return_tokens(
        self, bot: str, count: int, *, destination: str = DEFAULT_DESTINATION
    ) -> None:
        """Give back tokens taken for attempts that did not start."""
        ...

    async def report_breaker(
        self, bot: str, state: str, *, at: int, destination: str = DEFAULT_DESTINATION
    ) -> None:
        """Record a worker's breaker transition for `bot`'s `destination` (closed, open or
        half_open)."""
        ...

    async def replay(
        self,
        bot: str,
        destination: str,
        *,
        first: int,
        last: int,
        ordered: bool,
        at: int,
        by: str,
        dry_run: bool = False,
    ) -> int:
        """Deliver to `destination` the updates of `bot` from `first` to `last` that it never
        had (revision 0010; for `default`, the rows `unrouted`), bodies kept, due at `at`;
        recorded in the audit log. How many (a dry run counts and changes nothing)."""
        ...

    async def park(self, identity: ClaimIdentity, *, at: int, by: str, reason: str) -> bool:
        """End the attempt of exactly `identity` (leased, or waiting for its retry) as an
        exhaustion with `reason`: its chat moves on, and its late settle is refused."""
        ...
