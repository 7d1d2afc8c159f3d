"""The on-disk format of ledger segments: pure functions, no I/O.

A segment file holds consecutive entries of one ledger, starting at the entry id in its name::

    segment header (32 bytes, little-endian)
        magic        8s   b"BRKLTSEG"
        ledger id    u64
        base entry   u64  id of the segment's first record
        format       u32  SEGMENT_FORMAT
        header crc   u32  CRC-32C of the 28 bytes before it
    records, back to back
        length       u32  bytes of data
        messages     u32  num_messages of the entry
        checksum     u32  the entry's own CRC-32C (what a delivery sends)
        record crc   u32  CRC-32C of the 12 bytes before it, continued over data
        data         length bytes

Record ids are implicit: the n-th record of a segment is entry ``base + n``. The record CRC
covers the header fields and the data, so a torn or scribbled tail is detected wherever it
starts. CRC-32C rather than zlib's CRC-32 because the ``crc32c`` package computes it in
hardware (measured: 0.10 vs 0.15 µs for 128 bytes, 38 vs 247 µs for 1 MiB) and it is the
checksum Pulsar entries already carry. The package is called directly, not through the codec's
wrapper, because the record CRC continues a running value.

The last segment may end in zeros the writer wrote ahead of its records (`scan_records`): a
header of zeros is never a valid record (its CRC would be CRC-32C of twelve zero bytes, which
is not zero), so it marks where the records end.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import crc32c as _crc32c_lib

from brokerlet.storage.ledger import Entry, NewEntry

__all__ = [
    "RECORD_HEADER_SIZE",
    "SEGMENT_HEADER_SIZE",
    "CorruptRecordError",
    "Scan",
    "decode_records",
    "encode_records",
    "encode_segment_header",
    "parse_segment_header",
    "scan_records",
    "segment_base",
    "segment_name",
]

SEGMENT_MAGIC = b"BRKLTSEG"
SEGMENT_FORMAT = 1
SEGMENT_SUFFIX = ".seg"

_SEGMENT_HEADER = struct.Struct("<8sQQII")
_SEGMENT_HEADER_BODY = struct.Struct("<8sQQI")
_RECORD_HEADER = struct.Struct("<IIII")
_RECORD_PREFIX = struct.Struct("<III")
_U32 = struct.Struct("<I")

SEGMENT_HEADER_SIZE = _SEGMENT_HEADER.size
RECORD_HEADER_SIZE = _RECORD_HEADER.size

_crc = _crc32c_lib.crc32c


class CorruptRecordError(Exception):
    """A record read back does not match its checksum."""


def segment_name(base_entry_id: int) -> str:
    """File name of the segment whose first entry is ``base_entry_id`` (sorts by id)."""
    return f"{base_entry_id:020d}{SEGMENT_SUFFIX}"


def segment_base(file_name: str) -> int | None:
    """The base entry id in a segment file name, or None if the name is not a segment's."""
    stem, dot, suffix = file_name.partition(".")
    if dot + suffix != SEGMENT_SUFFIX or len(stem) != 20 or not stem.isdigit():
        return None
    return int(stem)


def encode_segment_header(ledger_id: int, base_entry_id: int) -> bytes:
    body = _SEGMENT_HEADER_BODY.pack(SEGMENT_MAGIC, ledger_id, base_entry_id, SEGMENT_FORMAT)
    return body + _U32.pack(_crc(body))


def parse_segment_header(data: bytes) -> tuple[int, int] | None:
    """Return ``(ledger_id, base_entry_id)``, or None if ``data`` holds no valid header."""
    if len(data) < SEGMENT_HEADER_SIZE:
        return None
    magic, ledger_id, base, fmt, crc = _SEGMENT_HEADER.unpack_from(data)
    if magic != SEGMENT_MAGIC or crc != _crc(data[: _SEGMENT_HEADER_BODY.size]):
        return None
    if fmt != SEGMENT_FORMAT:
        return None
    return ledger_id, base


def encode_records(entries: Sequence[NewEntry]) -> tuple[bytes, list[int]]:
    """Frame ``entries`` as consecutive records.

    Returns:
        The records as one buffer, and the size of each record in it.
    """
    parts: list[bytes] = []
    sizes: list[int] = []
    pack_prefix = _RECORD_PREFIX.pack
    pack_u32 = _U32.pack
    crc = _crc
    for data, checksum, num_messages, _ in entries:
        prefix = pack_prefix(len(data), num_messages, checksum)
        parts.append(prefix)
        parts.append(pack_u32(crc(data, crc(prefix))))
        parts.append(data)
        sizes.append(RECORD_HEADER_SIZE + len(data))
    return b"".join(parts), sizes


@dataclass(frozen=True, slots=True)
class Scan:
    """What a walk over a segment's records found.

    Attributes:
        offsets: file offset of each whole record, in order.
        end: offset just after the last whole record.
        problem: why the walk stopped before the end of the data, or None if it did not.
        zeros: the records end at a tail of zeros (written ahead of them), running to the
            end of the data; the tail is not counted as a problem.
    """

    offsets: array[int]
    end: int
    problem: str | None
    zeros: bool = False


def scan_records(data: bytes, start: int) -> Scan:
    """Walk the records in ``data[start:]`` and stop at the first one that is not whole.

    A record header of zeros ends the walk: cleanly if only zeros follow it (a tail written
    ahead of the records), as damage if anything else does (writes that reached the disk out
    of order before a power cut: nothing after the gap can be trusted to be in order).

    Args:
        data: a whole segment file.
        start: offset of the first record (just past the segment header).
    """
    view = memoryview(data)
    limit = len(view)
    offsets: array[int] = array("Q")
    unpack = _RECORD_HEADER.unpack_from
    crc = _crc
    position = start
    while position < limit:
        if limit - position < RECORD_HEADER_SIZE:
            return _stopped(data, offsets, position, "record header cut short")
        length, _messages, _checksum, stored = unpack(view, position)
        body = position + RECORD_HEADER_SIZE
        if length > limit - body:
            return _stopped(data, offsets, position, f"record of {length} bytes runs past the end")
        prefix = view[position : position + _RECORD_PREFIX.size]
        if crc(view[body : body + length], crc(prefix)) != stored:
            return _stopped(data, offsets, position, "record checksum mismatch")
        offsets.append(position)
        position = body + length
    return Scan(offsets, position, None)


def _stopped(data: bytes, offsets: array[int], position: int, problem: str) -> Scan:
    """The scan's outcome where ``position`` holds no whole record."""
    zeros = data.count(0, position, position + RECORD_HEADER_SIZE)
    if zeros == min(RECORD_HEADER_SIZE, len(data) - position):
        if data.count(0, position) == len(data) - position:
            return Scan(offsets, position, None, zeros=True)
        problem = "data after a gap of zeros"
    return Scan(offsets, position, problem)


def decode_records(
    data: bytes, ledger_id: int, first_entry_id: int, count: int, *, verify: bool = True
) -> list[Entry]:
    """Turn ``count`` consecutive records at the start of ``data`` back into entries.

    Raises:
        CorruptRecordError: a record is cut short or fails its checksum (only checked when
            ``verify`` is set).
    """
    entries: list[Entry] = []
    unpack = _RECORD_HEADER.unpack_from
    crc = _crc
    position = 0
    limit = len(data)
    for entry_id in range(first_entry_id, first_entry_id + count):
        if limit - position < RECORD_HEADER_SIZE:
            raise CorruptRecordError(f"entry {entry_id}: record header cut short")
        length, messages, checksum, stored = unpack(data, position)
        body = position + RECORD_HEADER_SIZE
        payload = data[body : body + length]
        if len(payload) != length:
            raise CorruptRecordError(f"entry {entry_id}: record cut short")
        if verify and crc(payload, crc(data[position : position + _RECORD_PREFIX.size])) != stored:
            raise CorruptRecordError(f"entry {entry_id}: record checksum mismatch")
        entries.append(Entry(ledger_id, entry_id, payload, checksum, messages))
        position = body + length
    return entries
