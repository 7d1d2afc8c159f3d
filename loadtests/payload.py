"""The message body: who sent it, with which key, in which order, and when.

Every message starts with a fixed 24-byte header, padded with zeros to the scenario's message
size, so the consumer side can check delivery and order without a lookup table::

    >>> body = pack(producer=7, key=42, sequence=3, sent_ns=1_000, size=128)
    >>> len(body), unpack(body)
    (128, (7, 42, 3, 1000))

``sent_ns`` is ``time.perf_counter_ns()`` in the load generator. Producers and consumers run
in the same process, so end-to-end latency is a plain subtraction.
"""

from __future__ import annotations

import struct

__all__ = ["HEADER_SIZE", "pack", "unpack"]

_HEADER = struct.Struct(">IIQq")  # producer, key, sequence, sent_ns
HEADER_SIZE = _HEADER.size


def pack(producer: int, key: int, sequence: int, sent_ns: int, size: int) -> bytes:
    """A message body of ``size`` bytes (at least the header's 24)."""
    header = _HEADER.pack(producer, key, sequence, sent_ns)
    return header + bytes(max(0, size - HEADER_SIZE))


def unpack(body: bytes) -> tuple[int, int, int, int]:
    """``(producer, key, sequence, sent_ns)`` from a body made by :func:`pack`.

    Raises:
        struct.error: the body is shorter than the header.
    """
    producer, key, sequence, sent_ns = _HEADER.unpack_from(body)
    return producer, key, sequence, sent_ns
