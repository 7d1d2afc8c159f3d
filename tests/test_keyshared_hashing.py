"""Sticky-key hashing: Murmur3 vectors, Pulsar's 31-bit mask, and key precedence."""

from __future__ import annotations

import ast
import base64
import doctest

import mmh3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brokerlet._compiled import source_of
from brokerlet.keyshared import NONE_KEY, murmur3_32, sticky_key, sticky_key_hash
from brokerlet.keyshared import hashing as hashing_module
from brokerlet.transport.protocol import pb


def reference_murmur3_32(data: bytes, seed: int = 0) -> int:
    """Murmur3 x86_32 written straight from the algorithm, byte by byte.

    Deliberately simple and independent of the module's code, to cross-check it.
    """

    def rotl(value: int, shift: int) -> int:
        return ((value << shift) | (value >> (32 - shift))) & 0xFFFFFFFF

    def scramble(k: int) -> int:
        k = (k * 0xCC9E2D51) & 0xFFFFFFFF
        k = rotl(k, 15)
        return (k * 0x1B873593) & 0xFFFFFFFF

    h = seed
    full_blocks = len(data) // 4
    for block in range(full_blocks):
        b0, b1, b2, b3 = data[block * 4 : block * 4 + 4]
        h ^= scramble(b0 | (b1 << 8) | (b2 << 16) | (b3 << 24))
        h = rotl(h, 13)
        h = (h * 5 + 0xE6546B64) & 0xFFFFFFFF
    k = 0
    for shift, byte in enumerate(data[full_blocks * 4 :]):
        k |= byte << (8 * shift)
    if k:
        h ^= scramble(k)
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


# Murmur3 x86_32's published verification vectors: (input, seed, hash).
STANDARD_VECTORS = [
    (b"", 0, 0x00000000),
    (b"", 1, 0x514E28B7),
    (b"", 0xFFFFFFFF, 0x81F16F39),
    (b"\x00", 0, 0x514E28B7),
    (b"\x00\x00", 0, 0x30F4C306),
    (b"\x00\x00\x00", 0, 0x85F0B427),
    (b"\x00\x00\x00\x00", 0, 0x2362F9DE),
    (b"\xff\xff\xff\xff", 0, 0x76293B50),
    (b"\x21", 0, 0x72661CF4),
    (b"\x21\x43", 0, 0xA0F7B07A),
    (b"\x21\x43\x65", 0, 0x7E4A8634),
    (b"\x21\x43\x65\x87", 0, 0xF55B516B),
    (b"\x21\x43\x65\x87", 0x5082EDEE, 0x2362F9DE),
    (b"aaaa", 0x9747B28C, 0x5A97808A),
    (b"abc", 0, 0xB3DD93FA),
    (b"Hello, world!", 1234, 0xFAF6CDB3),
    (b"The quick brown fox jumps over the lazy dog", 0x9747B28C, 0x2FA826CD),
]


@pytest.mark.parametrize(("data", "seed", "expected"), STANDARD_VECTORS)
def test_standard_vectors(data: bytes, seed: int, expected: int) -> None:
    assert reference_murmur3_32(data, seed) == expected
    assert murmur3_32(data, seed) == expected
    assert hashing_module._murmur3_32_pure(data, seed) == expected


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=64), seed=st.integers(0, 0xFFFFFFFF))
def test_all_implementations_agree(data: bytes, seed: int) -> None:
    expected = reference_murmur3_32(data, seed)
    assert murmur3_32(data, seed) == expected
    assert hashing_module._murmur3_32_pure(data, seed) == expected


@settings(max_examples=200, deadline=None)
@given(
    key=st.one_of(st.binary(max_size=40), st.text(max_size=20)),
    seed=st.integers(0, 0xFFFFFFFF),
    signed=st.booleans(),
)
def test_the_fallback_answers_as_mmh3_does(key: bytes | str, seed: int, signed: bool) -> None:
    # Without mmh3 every hash goes through _murmur3_pure with mmh3.hash's arguments,
    # signed by default; the hashes keep the low 31 bits, the same either way.
    assert hashing_module._murmur3_pure(key, seed, signed) == mmh3.hash(key, seed, signed)
    assert hashing_module._murmur3_pure(key) == mmh3.hash(key)


def test_sticky_key_hash_clears_the_sign_bit() -> None:
    # 0xF55B516B has its top bit set; Pulsar keeps the low 31 bits.
    assert murmur3_32(b"\x21\x43\x65\x87") == 0xF55B516B
    assert sticky_key_hash(b"\x21\x43\x65\x87") == 0x755B516B


@settings(max_examples=200, deadline=None)
@given(key=st.binary(max_size=40))
def test_sticky_key_hash_is_31_bit_murmur(key: bytes) -> None:
    assert sticky_key_hash(key) == reference_murmur3_32(key) & 0x7FFFFFFF


def test_module_doctests() -> None:
    # From the source's docstring: the module may be loaded compiled, which keeps none.
    docstring = ast.get_docstring(ast.parse(source_of(hashing_module.__name__).read_text()))
    assert docstring is not None
    test = doctest.DocTestParser().get_doctest(
        docstring, dict(vars(hashing_module)), hashing_module.__name__, None, 0
    )
    runner = doctest.DocTestRunner()
    runner.run(test)
    results = runner.summarize(verbose=False)
    assert results.attempted >= 3
    assert results.failed == 0


def _metadata(**fields: object) -> pb.MessageMetadata:
    metadata = pb.MessageMetadata()
    for name, value in fields.items():
        setattr(metadata, name, value)
    return metadata


def test_ordering_key_beats_partition_key() -> None:
    metadata = _metadata(
        ordering_key=b"order-1", partition_key="part-1", producer_name="p", sequence_id=7
    )
    assert sticky_key(metadata) == b"order-1"


def test_empty_but_present_ordering_key_still_wins() -> None:
    # Presence decides, as Java's hasOrderingKey() does, not truthiness.
    metadata = _metadata(ordering_key=b"", partition_key="part-1")
    assert sticky_key(metadata) == b""


def test_partition_key_is_utf8_encoded() -> None:
    assert sticky_key(_metadata(partition_key="clé", producer_name="p")) == "clé".encode()


def test_base64_partition_key_is_decoded() -> None:
    raw = b"\x00\xffbinary key"
    metadata = _metadata(
        partition_key=base64.b64encode(raw).decode(), partition_key_b64_encoded=True
    )
    assert sticky_key(metadata) == raw


def test_base64_partition_key_without_padding_is_decoded() -> None:
    encoded = base64.b64encode(b"ab").decode().rstrip("=")
    metadata = _metadata(partition_key=encoded, partition_key_b64_encoded=True)
    assert sticky_key(metadata) == b"ab"


def test_malformed_base64_partition_key_falls_back_to_none_key() -> None:
    metadata = _metadata(partition_key="not base64!", partition_key_b64_encoded=True)
    assert sticky_key(metadata) == NONE_KEY


def test_without_keys_the_producer_and_sequence_id_are_the_key() -> None:
    metadata = _metadata(producer_name="standalone-0-1", sequence_id=42)
    assert sticky_key(metadata) == b"standalone-0-1-42"


def test_without_keys_or_producer_identity_the_key_is_none_key() -> None:
    assert sticky_key(_metadata(sequence_id=42)) == NONE_KEY
    assert sticky_key(_metadata(producer_name="p")) == NONE_KEY
    assert sticky_key(pb.MessageMetadata()) == b"NONE_KEY"
