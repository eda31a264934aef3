"""The key ring: AES-256 keys named by id (the first encrypts, all decrypt) and the index key
that keys the digests of identifiers.

`INTAKE_ENCRYPTION_KEYS` is `id:base64,id:base64,...` of 32-byte keys; `INTAKE_INDEX_KEY` is
base64 of 32 bytes. Each may come from a file instead (`..._FILE`), for a secret mounted by the
platform. The keys live in the process only: the database holds key ids, never a key.
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path

KEY_BYTES = 32
# What a key id may be: short, and free of the separators of the stored form (`enc1:ID:...`).
KEY_ID = re.compile(r"[A-Za-z0-9_-]{1,32}")


class KeyRingError(ValueError):
    """A ring that cannot be used: said in one line, naming the setting, never a key."""


@dataclass(frozen=True)
class KeyRing:
    """`keys`: (id, key) pairs, the first encrypts; `index_key` keys the digests."""

    keys: tuple[tuple[str, bytes], ...]
    index_key: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if not self.keys:
            raise KeyRingError("the key ring holds no key")
        ids = [key_id for key_id, _ in self.keys]
        if len(set(ids)) != len(ids):
            raise KeyRingError(f"key ids {sorted({i for i in ids if ids.count(i) > 1})} repeat")

    def __repr__(self) -> str:  # no key material in a log or a traceback
        return f"KeyRing(ids={self.ids!r})"

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(key_id for key_id, _ in self.keys)

    @property
    def current(self) -> str:
        """The id of the key that encrypts."""
        return self.keys[0][0]


def _key_bytes(text: str, what: str) -> bytes:
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise KeyRingError(f"{what} is not base64") from None
    if len(raw) != KEY_BYTES:
        raise KeyRingError(f"{what} is {len(raw)} bytes, not {KEY_BYTES}")
    return raw


def parse_keys(text: str, setting: str = "encryption_keys") -> tuple[tuple[str, bytes], ...]:
    """`id:base64,...` as (id, key) pairs, in order; KeyRingError naming the bad entry by its
    place and id (never its key)."""
    pairs: list[tuple[str, bytes]] = []
    entries = [entry.strip() for entry in text.replace("\n", ",").split(",")]
    for place, entry in enumerate((e for e in entries if e), start=1):
        key_id, colon, encoded = entry.partition(":")
        key_id = key_id.strip()
        if not colon or not KEY_ID.fullmatch(key_id):
            raise KeyRingError(
                f"{setting}: entry {place} is not id:base64 with an id of 1 to 32 letters,"
                " digits, _ or -"
            )
        pairs.append((key_id, _key_bytes(encoded, f"{setting}: key {key_id!r}")))
    if not pairs:
        raise KeyRingError(f"{setting}: no key given")
    return tuple(pairs)


def parse_index_key(text: str, setting: str = "index_key") -> bytes:
    return _key_bytes(text, setting)


def read_secret_file(path: Path, setting: str) -> str:
    """A secret mounted as a file: its text, stripped; KeyRingError naming the setting."""
    try:
        return path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or type(error).__name__
        raise KeyRingError(f"{setting}: cannot read {path}: {reason}") from None


def new_key_text(key_id: str = "k1") -> tuple[str, str]:
    """A fresh ring's text: (`id:base64` of a new key, base64 of a new index key)."""
    encode = base64.b64encode
    keys = f"{key_id}:{encode(secrets.token_bytes(KEY_BYTES)).decode()}"
    return keys, encode(secrets.token_bytes(KEY_BYTES)).decode()
