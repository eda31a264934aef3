"""The one seam personal data crosses on its way into and out of the database (docs/privacy.md).

Every column that holds what Telegram sent or a downstream answered is written through
`Codec.seal` and read through `Codec.open`: update bodies, the rows' and the attempt history's
errors, operational events' data and audit entries' details. With a key ring, a sealed value is

    enc1:<key id>:<base64 of a 12-byte nonce, then AES-256-GCM's ciphertext and tag>

under the ring's first key and a fresh random nonce, with its column and its row bound as
associated data (`where`): a value copied to another row or column does not open. Without a
ring, values are stored as they are. Reading takes both: a value that does not start with the
prefix is plaintext from before encryption was turned on (the re-encryption moves it), and a
sealed value opens under whichever key of the ring its id names, or raises Undecryptable:
never plaintext, never a guess.

Identifiers that the store compares but need not read (a row's queue key, the chat and user
ids operators search by) are stored as `Codec.digest`: HMAC-SHA256 under the ring's index key,
`h1:` and 22 characters of base64url. A digest keeps equality, which ordering and search need,
and reveals equality and frequency, nothing else; without a ring, the identifier itself.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from app.privacy.keyring import KEY_ID, KeyRing
from app.store.errors import Undecryptable

PREFIX = "enc1:"
DIGEST_PREFIX = "h1:"
NONCE_BYTES = 12
DIGEST_BYTES = 16  # 128 bits: no two of a table's identifiers meet by chance
DIGEST_CACHE = 65_536  # identifiers whose digest a codec keeps (a few MiB at most)


class Codec:
    """Seals and opens stored values under a key ring, or passes them through without one."""

    __slots__ = ("_ciphers", "_current", "_digests", "_index", "ring")

    def __init__(self, ring: KeyRing | None = None) -> None:
        self.ring = ring
        self._ciphers = {} if ring is None else {i: AESGCM(k) for i, k in ring.keys}
        self._current = None if ring is None else (ring.current, self._ciphers[ring.current])
        self._index = None if ring is None else ring.index_key
        # The digests of recent identifiers: a chat's updates come in runs, and each names
        # its ids more than once (the queue key, the sender, the chat). In memory only.
        self._digests: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"Codec({self.ring!r})"

    @property
    def encrypting(self) -> bool:
        return self._current is not None

    @property
    def current_key(self) -> str | None:
        """The id new values are sealed under; None: stored as they are."""
        return None if self._current is None else self._current[0]

    def seal(self, value: str, where: str) -> str:
        """`value` as stored: sealed under the current key, bound to `where` (its column and
        row, e.g. `body:default:42`)."""
        if self._current is None:
            return value
        key_id, cipher = self._current
        nonce = os.urandom(NONCE_BYTES)
        sealed = cipher.encrypt(nonce, value.encode(), where.encode())
        return f"{PREFIX}{key_id}:{base64.b64encode(nonce + sealed).decode('ascii')}"

    def seal_optional(self, value: str | None, where: str) -> str | None:
        return None if value is None else self.seal(value, where)

    def open(self, stored: str, where: str) -> str:
        """The value that `seal` stored at `where`; Undecryptable when the ring cannot open it."""
        if not stored.startswith(PREFIX):
            return stored
        key_id, _, encoded = stored[len(PREFIX) :].partition(":")
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            held = "no key ring is configured" if self.ring is None else "the ring lacks it"
            raise Undecryptable(f"{where.partition(':')[0]}: sealed under key {key_id!r}; {held}")
        try:
            raw = base64.b64decode(encoded, validate=True)
            return cipher.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], where.encode()).decode()
        except (InvalidTag, binascii.Error, ValueError):
            raise Undecryptable(
                f"{where.partition(':')[0]}: does not open under key {key_id!r}"
                " (altered, or moved from another row)"
            ) from None

    def open_optional(self, stored: str | None, where: str) -> str | None:
        return None if stored is None else self.open(stored, where)

    def digest(self, identifier: str) -> str:
        """What the store keeps of an identifier it compares but need not read."""
        if self._index is None:
            return identifier
        found = self._digests.get(identifier)
        if found is None:
            if len(self._digests) >= DIGEST_CACHE:
                self._digests.clear()
            mac = hmac.new(self._index, identifier.encode(), hashlib.sha256).digest()
            found = DIGEST_PREFIX + base64.urlsafe_b64encode(mac[:DIGEST_BYTES]).decode()[:22]
            self._digests[identifier] = found
        return found

    def digest_optional(self, identifier: str | None) -> str | None:
        return None if identifier is None else self.digest(identifier)


PLAIN = Codec()


# Where each sealed value is bound (its associated data): its column and its row, as every
# writer and reader of that column names them. A value opens only where it was sealed.
def body_at(bot: str, update_id: int) -> str:
    return f"body:{bot}:{update_id}"


def error_at(bot: str, update_id: int) -> str:
    """An update's error: the row's and its attempt history's share the one excerpt."""
    return f"error:{bot}:{update_id}"


def event_at(kind: str, at: int) -> str:
    return f"event:{kind}:{at}"


def audit_at(action: str, at: int) -> str:
    return f"audit:{action}:{at}"


def erasure_at(bot: str) -> str:
    return f"erasure:{bot}"


def key_of(stored: str | None) -> str | None:
    """The key id a stored value is sealed under; None for plaintext (or no value)."""
    if stored is None or not stored.startswith(PREFIX):
        return None
    key_id = stored[len(PREFIX) :].partition(":")[0]
    return key_id if KEY_ID.fullmatch(key_id) else None
