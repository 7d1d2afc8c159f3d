"""Reading single MessageMetadata fields of a stored entry without decoding it all.

The dispatcher needs ``deliver_at_time`` of every entry it reads (delayed delivery) and a seek
by time needs ``publish_time`` of a few; a full protobuf decode per entry costs more than the
rest of dispatch. These walk the metadata's wire format to the one field and stop there.
"""

from __future__ import annotations

import struct

__all__ = ["deliver_at_time", "publish_time"]

_U32 = struct.Struct(">I")
_DELIVER_AT_TAG = b"\x98\x01"  # field 19, varint
_PUBLISH_TIME = 3
_DELIVER_AT = 19


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while pos < end:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            break
    raise ValueError("truncated or overlong varint")


def _field(entry: bytes, number: int) -> int | None:
    """The varint value of field ``number`` of the entry's metadata, or None if absent or
    the metadata is malformed (a stored entry was checked on SEND; be safe anyway)."""
    if len(entry) < 4:
        return None
    end = 4 + _U32.unpack_from(entry, 0)[0]
    if end > len(entry):
        return None
    pos = 4
    try:
        while pos < end:
            tag, pos = _varint(entry, pos, end)
            field, wire = tag >> 3, tag & 7
            if wire == 0:
                value, pos = _varint(entry, pos, end)
                if field == number:
                    return value
            elif wire == 2:
                size, pos = _varint(entry, pos, end)
                pos += size
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            else:
                return None
    except ValueError:
        return None
    return None


def publish_time(entry: bytes) -> int:
    """The entry's ``publish_time`` (epoch ms), 0 if it cannot be read."""
    return _field(entry, _PUBLISH_TIME) or 0


def deliver_at_time(entry: bytes) -> int:
    """The entry's ``deliver_at_time`` (epoch ms), 0 if it has none.

    Most entries have none: a search for the field's tag bytes (in C) rules them out before
    any walk. A negative value (an int64 on the wire) reads as 0: deliver now.
    """
    if len(entry) < 4:
        return 0
    end = 4 + _U32.unpack_from(entry, 0)[0]
    if entry.find(_DELIVER_AT_TAG, 4, end) < 0:
        return 0
    value = _field(entry, _DELIVER_AT)
    if value is None or value >= 1 << 63:
        return 0
    return value
