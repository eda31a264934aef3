"""The codec: what a sealed value is, what opens it, and what never does."""

from __future__ import annotations

import base64

import pytest

from app.store.codec import PLAIN, PREFIX, Codec, key_of
from app.store.errors import Undecryptable
from tests.privacy.rings import test_ring

WHERE = "body:default:42"
BODY = '{"update_id": 42, "message": {"text": "hello"}}'


def test_seal_stores_neither_the_value_nor_its_length_in_clear_and_opens_it_back() -> None:
    codec = Codec(test_ring())
    sealed = codec.seal(BODY, WHERE)

    assert sealed.startswith(f"{PREFIX}t1:")
    assert "hello" not in sealed
    assert key_of(sealed) == "t1"
    assert codec.open(sealed, WHERE) == BODY


def test_each_seal_takes_a_fresh_nonce() -> None:
    codec = Codec(test_ring())
    assert codec.seal(BODY, WHERE) != codec.seal(BODY, WHERE)


def test_a_value_moved_to_another_row_or_column_does_not_open() -> None:
    codec = Codec(test_ring())
    sealed = codec.seal(BODY, WHERE)

    with pytest.raises(Undecryptable, match="moved from another row"):
        codec.open(sealed, "body:default:43")
    with pytest.raises(Undecryptable):
        codec.open(sealed, "error:default:42")


def test_an_altered_value_does_not_open() -> None:
    codec = Codec(test_ring())
    sealed = codec.seal(BODY, WHERE)
    head, _, encoded = sealed.rpartition(":")
    raw = bytearray(base64.b64decode(encoded))
    raw[-1] ^= 1
    with pytest.raises(Undecryptable, match="altered"):
        codec.open(f"{head}:{base64.b64encode(bytes(raw)).decode()}", WHERE)


def test_a_key_the_ring_lacks_is_named_and_nothing_is_read_as_plaintext() -> None:
    sealed = Codec(test_ring("old")).seal(BODY, WHERE)

    with pytest.raises(Undecryptable, match="key 'old'; the ring lacks it"):
        Codec(test_ring("new")).open(sealed, WHERE)
    with pytest.raises(Undecryptable, match="no key ring is configured"):
        PLAIN.open(sealed, WHERE)


def test_a_new_first_key_seals_while_the_older_ones_still_open() -> None:
    old = Codec(test_ring("k1")).seal(BODY, WHERE)
    rotated = Codec(test_ring("k2", "k1"))

    assert key_of(rotated.seal(BODY, WHERE)) == "k2"
    assert rotated.open(old, WHERE) == BODY


def test_plaintext_from_before_encryption_reads_as_it_is() -> None:
    assert Codec(test_ring()).open(BODY, WHERE) == BODY
    assert key_of(BODY) is None
    assert PLAIN.seal(BODY, WHERE) == BODY


def test_a_digest_keeps_equality_only_and_depends_on_the_index_key() -> None:
    codec = Codec(test_ring())
    digest = codec.digest("730000000100")

    assert digest == codec.digest("730000000100")
    assert digest != codec.digest("730000000101")
    assert "730000000100" not in digest
    other_index = Codec(type(test_ring())(test_ring().keys, bytes(32)))
    assert other_index.digest("730000000100") != digest
    assert PLAIN.digest("730000000100") == "730000000100"


def test_the_ring_never_shows_a_key() -> None:
    ring = test_ring()
    shown = repr(Codec(ring)) + repr(ring) + str(ring)
    assert "t1" in shown
    assert base64.b64encode(ring.keys[0][1]).decode() not in shown
    assert repr(ring.keys[0][1]) not in shown
