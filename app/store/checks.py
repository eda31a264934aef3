"""The checks of the values a store method is given beyond plain arguments (`validate`): a
settlement, an identity, a lease, a list of bots, an actor and a reason; and the grouping of
identities by their destination's table."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from app.store import validate
from app.store.types import (
    Abandoned,
    ClaimIdentity,
    Completed,
    Failed,
    HandedBack,
    Settlement,
)


def check_settlement(value: Settlement) -> Settlement:
    if not isinstance(value, Completed | Failed | Abandoned | HandedBack):
        raise ValueError(f"settlement {value!r} is not Completed, Failed, Abandoned or HandedBack")
    return value


Item = TypeVar("Item")


def by_destination(
    items: Iterable[Item], identity: Callable[[Item], ClaimIdentity]
) -> dict[str, list[Item]]:
    """`items` grouped by the destination of their `identity`, in their order: each group's
    deliveries are in one table (docs/design.md decision 7)."""
    groups: dict[str, list[Item]] = {}
    for item in items:
        groups.setdefault(identity(item).destination, []).append(item)
    return groups


def check_identity(value: ClaimIdentity) -> ClaimIdentity:
    if not isinstance(value, ClaimIdentity):
        raise ValueError(f"identity {value!r} is not a ClaimIdentity")
    return value


def check_lease(now: int, lease_until: int) -> tuple[int, int]:
    validate.millis("now", now)
    validate.millis("lease_until", lease_until)
    if lease_until <= now:
        raise ValueError(f"lease_until {lease_until} is not after now {now}: a lease is positive")
    return now, lease_until


def check_bots(bots: Sequence[str] | None) -> list[str] | None:
    if bots is None:
        return None
    if isinstance(bots, str):
        raise ValueError(f"bots {bots!r} must be a sequence of bot names, not one string")
    return [validate.bot_name(bot) for bot in bots]


MAX_REASON = 500


def check_actor(by: Any) -> str:
    """The name an action is recorded under: an API key's name, or the CLI's user."""
    if not isinstance(by, str) or not 0 < len(by) <= 200:
        raise ValueError(f"by {by!r} is not a name of 1 to 200 characters")
    return by


def check_reason(reason: Any) -> str | None:
    if reason is None:
        return None
    reason = validate.text("reason", reason).strip()
    if len(reason) > MAX_REASON:
        raise ValueError(f"reason is over {MAX_REASON} characters")
    return reason or None
