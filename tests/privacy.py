"""Key rings for tests: fixed, so a failure can be replayed, and never a production key."""

from __future__ import annotations

import base64

from app.privacy.keyring import KeyRing


def key_text(seed: int) -> str:
    return base64.b64encode(bytes([seed]) * 32).decode()


def test_ring(*ids: str) -> KeyRing:
    """A ring of `ids` (default one key, `t1`), the first encrypting, with an index key."""
    names = ids or ("t1",)
    keys = tuple((name, bytes([index + 1]) * 32) for index, name in enumerate(names))
    return KeyRing(keys, bytes([99]) * 32)


test_ring.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test
