"""Sticky keys and their hashes, bit-compatible with Pulsar's Key_Shared routing.

A Key_Shared message is routed by the Murmur3 (x86, 32-bit, seed 0) hash of its
sticky key, masked to 31 bits. Each selector then reduces that hash into its own
slot range (see `brokerlet.keyshared.selectors`). The hash is computed once per
entry and travels with it into pending acks and the replay queue, so it must match
what an Apache Pulsar broker computes for the same message.

Example:
    >>> murmur3_32(b"hello")
    613153351
    >>> sticky_key_hash(b"hello")
    613153351
    >>> sticky_key_hash(b"\\xff\\xff\\xff\\xff") == murmur3_32(b"\\xff\\xff\\xff\\xff") & 0x7FFFFFFF
    True
"""

from __future__ import annotations

import base64
import binascii
import struct
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from brokerlet.transport.protocol.pulsar_pb2 import MessageMetadata

__all__ = [
    "NONE_KEY",
    "RANGE_SIZE",
    "STICKY_KEY_HASH_NOT_SET",
    "murmur3_32",
    "plain_key_hash",
    "sticky_key",
    "sticky_key_hash",
]

RANGE_SIZE = 65536
"""Number of hash slots in Pulsar's Key_Shared hash space (`DEFAULT_RANGE_SIZE`)."""

STICKY_KEY_HASH_NOT_SET = 0
"""A slot value meaning "no hash"; selectors never produce it."""

NONE_KEY = b"NONE_KEY"
"""Sticky key of a message with no ordering key, partition key or producer identity."""

_MASK_31: Final = 0x7FFFFFFF
_MASK_32: Final = 0xFFFFFFFF


def _murmur3_32_pure(data: bytes, seed: int = 0) -> int:
    """Murmur3 x86_32 in pure Python: the fallback when `mmh3` is not installed."""
    length = len(data)
    body_end = length - (length & 3)
    h = seed & _MASK_32
    for (block,) in struct.iter_unpack("<I", data[:body_end]):
        h ^= _mix_block(block)
        h = ((h << 13) | (h >> 19)) & _MASK_32
        h = (h * 5 + 0xE6546B64) & _MASK_32
    # The 1-3 tail bytes are mixed like a block but without the rotate-and-add step.
    h ^= _mix_block(int.from_bytes(data[body_end:], "little"))
    h ^= length
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK_32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK_32
    return h ^ (h >> 16)


def _mix_block(k: int) -> int:
    k = (k * 0xCC9E2D51) & _MASK_32
    k = ((k << 15) | (k >> 17)) & _MASK_32
    return (k * 0x1B873593) & _MASK_32


def _murmur3_pure(key: bytes | str, seed: int = 0, signed: Any = True) -> int:
    """`mmh3.hash` in pure Python: the fallback when `mmh3` is not installed."""
    data = key.encode() if isinstance(key, str) else key
    h = _murmur3_32_pure(data, seed)
    return h - (1 << 32) if signed and h >> 31 else h


try:
    from mmh3 import hash as _mmh3_hash
except ImportError:  # pragma: no cover - only where mmh3 is missing
    _mmh3_hash = _murmur3_pure

# Final: compiled, a call reads a C static rather than the module's dict. One definition
# of each function below, whichever hash this is: mypyc compiles no function defined
# twice. A signed hash has the same low 31 bits as the unsigned one, and a call without
# the optional arguments is the cheaper one.
_murmur3: Final = _mmh3_hash
_isascii: Final = bytes.isascii  # called unbound: no method lookup per key


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """Murmur3 x86_32 of `data`, as an unsigned 32-bit integer.

    Args:
        data: the bytes to hash.
        seed: the Murmur3 seed; Pulsar uses 0.

    Returns:
        The hash in ``[0, 2**32)``.
    """
    return _murmur3(data, seed, False)


def sticky_key_hash(key: bytes) -> int:
    """Pulsar's 31-bit sticky-key hash: ``murmur3_32(key) & 0x7fffffff``.

    Args:
        key: the sticky key, as returned by `sticky_key`.

    Returns:
        The hash in ``[0, 2**31)``, before a selector reduces it to a slot.
    """
    return _murmur3(key) & _MASK_31


def plain_key_hash(key: bytes) -> int:
    """The hash a SEND's check keeps with an entry whose partition key it read on the way
    (``brokerlet.transport.protocol.plain_key``), as dispatch would work it out.

    Args:
        key: the partition key; ``b""`` for none.

    Returns:
        ``sticky_key_hash(key) or 1`` (0 means "no hash"); 0 for ``b""`` (an empty key
        or none, which route differently) and for a key that is not ASCII, which
        dispatch reads as protobuf does.
    """
    if key and _isascii(key):
        return _murmur3(key) & _MASK_31 or 1  # one call: once per keyed SEND
    return 0


def sticky_key(metadata: MessageMetadata) -> bytes:
    """The key that Key_Shared routes a message by, as Pulsar 4.x resolves it.

    In order of precedence: the ordering key; else the partition key (base64-decoded
    when `partition_key_b64_encoded` is set); else ``"<producer_name>-<sequence_id>"``
    when both are present (Pulsar's newer fallback, which spreads keyless messages
    over consumers instead of pinning them all to one); else ``b"NONE_KEY"``.

    Args:
        metadata: the message's (or batch entry's) metadata.

    Returns:
        The sticky key bytes.
    """
    if metadata.HasField("ordering_key"):
        return metadata.ordering_key
    if metadata.HasField("partition_key"):
        if metadata.partition_key_b64_encoded:
            return _decode_b64_key(metadata.partition_key)
        return metadata.partition_key.encode()
    if metadata.HasField("producer_name") and metadata.HasField("sequence_id"):
        return f"{metadata.producer_name}-{metadata.sequence_id}".encode()
    return NONE_KEY


def _decode_b64_key(text: str) -> bytes:
    """Decode a base64 partition key the way Java's basic decoder accepts it.

    Java tolerates missing ``=`` padding; Python does not, so it is restored first.
    An undecodable key falls back to `NONE_KEY`, as Pulsar's key peeking does.
    """
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        return NONE_KEY
