"""What the key ring's upkeep offers (revision 0009, docs/privacy.md)."""

from __future__ import annotations

from typing import Protocol


class Keys(Protocol):
    """The registry of key ids, their counts, and the re-encryption to the current key."""

    async def check_key_ring(self, *, at: int) -> None:
        """Register the key this store seals under; MissingKeys when its ring lacks a key
        that stored values may still be sealed under."""
        ...

    async def count_keys(self, *, at: int) -> dict[str, int]:
        """Every sealed-column value by its key id ("none": stored as it is); recorded, so
        that a key counted at 0 may leave the ring."""
        ...

    async def reencrypt(self, *, limit: int = ...) -> int:
        """One bounded batch of the pass that moves every value to the current key; the rows
        rewritten, 0 once a whole pass found nothing left."""
        ...
