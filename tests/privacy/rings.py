"""Key rings for tests: fixed, so a failure can be replayed, and never a production key."""

from __future__ import annotations

import base64
import hashlib

from app.privacy.keyring import KeyRing

INDEX_KEY = bytes([99]) * 32


def key_of(key_id: str) -> bytes:
    """The test key named `key_id`: the same id is the same key in every ring."""
    return hashlib.sha256(f"test key {key_id}".encode()).digest()


def key_text(key_id: str) -> str:
    """`key_of(key_id)` as INTAKE_ENCRYPTION_KEYS spells a key."""
    return base64.b64encode(key_of(key_id)).decode()


INDEX_KEY_TEXT = base64.b64encode(INDEX_KEY).decode()


def test_ring(*ids: str) -> KeyRing:
    """A ring of `ids` (default one key, `t1`), the first encrypting, with the index key."""
    return KeyRing(tuple((key_id, key_of(key_id)) for key_id in ids or ("t1",)), INDEX_KEY)


test_ring.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test
