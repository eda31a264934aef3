"""What every conformance family shares: the findings of one rule, the registry the families
fill, and the fixtures their rules start from (the bots, a body, a recorded or claimed row)."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from app.store.contract import FencedUpdateStore, UpdateStore
from app.store.types import Capability, ClaimIdentity

_LEVELS: dict[Capability, int] = {"base": 0, "fenced": 1, "durable": 2}
BOT = "conformance"
OTHER_BOT = "conformance-b"
MAX = 2


@dataclass
class _Findings:
    rule: str
    found: list[str] = field(default_factory=list)

    def expect(self, holds: bool, what: str) -> None:
        if not holds:
            self.found.append(f"{self.rule}: {what}")

    def equal(self, actual: object, expected: object, what: str) -> None:
        self.expect(actual == expected, f"{what}: expected {expected!r}, got {actual!r}")


Rule = Callable[[Any, _Findings], Awaitable[None]]
# Each rule's name and level, filled as the family modules are imported; the order the rules
# run in is `_RULES` in `app.store.conformance.check`.
_REGISTERED: dict[Rule, tuple[str, Capability]] = {}


def _rule(name: str, level: Capability) -> Callable[[Rule], Rule]:
    def register(function: Rule) -> Rule:
        _REGISTERED[function] = (name, level)
        return function

    return register


def stored_key(store: object, queue_key: str) -> str:
    """A queue key as the store reads it back: a store that keeps identifiers as keyed digests
    (`codec`, docs/privacy.md) answers with the digest, which keeps equality."""
    codec = getattr(store, "codec", None)
    return queue_key if codec is None else str(codec.digest(queue_key))


def _body(update_id: int) -> str:
    return f'{{"update_id": {update_id}, "message": {{"text": "u{update_id}"}}}}'


async def _record(store: UpdateStore, *update_ids: int, bot: str = BOT, at: int = 0) -> None:
    for update_id in update_ids:
        await store.add(bot, update_id, _body(update_id), at)


def _other(
    identity: ClaimIdentity, *, attempt: int | None = None, claim_id: str = ""
) -> ClaimIdentity:
    """The same key with another attempt or claim_id: an identity that must never match."""
    return dataclasses.replace(
        identity,
        attempt=identity.attempt if attempt is None else attempt,
        claim_id=claim_id or identity.claim_id,
    )


async def _claimed(
    store: FencedUpdateStore, f: _Findings, update_id: int = 1, *, max_attempts: int = MAX
) -> ClaimIdentity | None:
    """Claim the recorded `update_id` at 10 with a lease until 100; None (a finding) if refused."""
    identity = await store.claim_owned(
        BOT, update_id, now=10, lease_until=100, max_attempts=max_attempts
    )
    if identity is None:
        f.expect(False, f"claim_owned of pending row {update_id} gave None")
    return identity


async def _two_claims(
    store: FencedUpdateStore, f: _Findings
) -> tuple[ClaimIdentity, ClaimIdentity] | None:
    """Record update 1 and claim it twice around a lapse: leases until 100, then until 200."""
    await _record(store, 1)
    first = await store.claim_owned(BOT, 1, now=10, lease_until=100, max_attempts=3)
    second = await store.claim_owned(BOT, 1, now=101, lease_until=200, max_attempts=3)
    if first is None or second is None:
        f.expect(False, f"claims around a lapse gave {first!r} and {second!r}")
        return None
    return first, second
