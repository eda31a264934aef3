"""What settling offers its users."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from app.store.types import (
    ClaimIdentity,
    Settlement,
)


class Settles(Protocol):
    """The base level's settle, by attempt number."""

    async def settle(self, bot: str, update_id: int, attempt: int, settlement: Settlement) -> None:
        """Apply the settlement, only if `attempt` holds a live lease at `settlement.at`."""
        ...


class FencedSettles(Protocol):
    """Settles by full identity, one or many in one statement."""

    async def settle_owned(self, identity: ClaimIdentity, settlement: Settlement) -> bool:
        """Apply the settlement if `identity` holds a live lease at `settlement.at`; False
        (and no change) otherwise: the caller lost ownership. `HandedBack` makes the row due
        at once, keeps its error, and spends no attempt: the next claim's `counted` is this
        attempt's, and `max_attempts` allows one more attempt number."""
        ...

    async def settle_many_owned(
        self,
        items: Sequence[tuple[ClaimIdentity, Settlement]],
        *,
        waiting: set[tuple[str, int]] | None = None,
    ) -> list[bool | None]:
        """`settle_owned` for each item, in one commit; for each, whether it took effect, by
        the same fence (every identity field, a live lease at its `settlement.at`), or None
        when the row was held locked by another transaction: not settled, still owned, and
        not waited for (so one locked row never holds up the rest). A key may appear once per
        batch (ValueError otherwise). `waiting`, when given, receives settled
        keys whose chat may have a later update to deliver (a superset is allowed)."""
        ...
