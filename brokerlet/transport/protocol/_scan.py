"""Reading single MessageMetadata fields of a stored entry without decoding it all.

The dispatcher needs ``deliver_at_time`` of every entry it reads (delayed delivery) and a seek
by time needs ``publish_time`` of a few; a full protobuf decode per entry costs more than the
rest of dispatch. These walk the metadata's wire format to the one field and stop there.
"""

from __future__ import annotations

import base64
import re
import struct
from collections.abc import Iterable

from brokerlet.transport.protocol._payload import PLAIN_METADATA_FIELDS, varint_field

__all__ = ["deliver_at_time", "may_deliver_later", "publish_time", "sticky_key"]

_U32 = struct.Struct(">I")
_DELIVER_AT_TAG = b"\x98\x01"  # field 19, varint
_PUBLISH_TIME = 3
_DELIVER_AT = 19


def _field(entry: bytes, number: int) -> int | None:
    """The varint value of field ``number`` of the entry's metadata, or None if absent or
    the metadata is malformed (a stored entry was checked on SEND; be safe anyway)."""
    if len(entry) < 4:
        return None
    end = 4 + _U32.unpack_from(entry, 0)[0]
    if end > len(entry):
        return None
    return varint_field(entry, number, 4, end, first=True)


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


def may_deliver_later(entries: Iterable[bytes]) -> bool:
    """False when no entry of ``entries`` has a ``deliver_at_time``; True says only "look
    at each with `deliver_at_time`" (the tag bytes may sit inside another field).

    `deliver_at_time`'s first test for a whole read without a call per entry: most reads
    hold no delayed message.
    """
    unpack = _U32.unpack_from
    try:
        for entry in entries:
            if entry.find(_DELIVER_AT_TAG, 4, 4 + unpack(entry, 0)[0]) >= 0:
                return True
    except struct.error:
        return True  # shorter than a metadata size: let the per-entry reading decide
    return False


_PRODUCER_NAME = 1
_SEQUENCE_ID = 2
_PROPERTIES = 4
_PARTITION_KEY = 6
_PARTITION_KEY_B64 = 17
_ORDERING_KEY = 18


# The plain layout with a partition key (field 6) last: its size byte, then the key.
_PLAIN_KEYED = re.compile(PLAIN_METADATA_FIELDS + rb"\x32([\x00-\x7f])([\x00-\x7f]*)").fullmatch


def sticky_key(entry: bytes) -> bytes | None:
    """The Key_Shared routing key of a stored entry, read off its metadata's wire format.

    The ordering key, else the partition key (base64-decoded when
    ``partition_key_b64_encoded`` is set and it decodes, else as it is), else
    ``b"<producer_name>-<sequence_id>"``: what a protobuf decode of the metadata gives.

    Returns None for anything this walk cannot answer exactly as protobuf would; the
    caller then takes the protobuf path, which also decides what unreadable metadata
    means. That covers: a truncated or malformed walk, a missing required field
    (``producer_name``, ``sequence_id``, ``publish_time``, a property's key or value),
    wire types 3, 4, 6 and 7, tags and lengths of three bytes or more, varints of ten
    bytes, and a key or name that is not ASCII (protobuf hands invalid UTF-8 back as
    bytes, which the protobuf path treats its own way).
    """
    size = len(entry)
    if size < 4:
        return None
    end = 4 + _U32.unpack_from(entry, 0)[0]
    if end > size:
        return None
    if end > 6 and entry[4] == 0x0A and entry[5] < 0x80:
        # The common layout in a few C calls: producer_name, sequence_id, publish_time and
        # an ASCII partition key of under 128 bytes that ends the metadata.
        plain = _PLAIN_KEYED(entry, 6 + entry[5], end)
        if plain is not None:
            key_size, key = plain.groups()
            if len(key) == key_size[0]:
                return key
    return _walk(entry, end)


def _walk(entry: bytes, end: int) -> bytes | None:
    """`sticky_key` by walking every field of the metadata ``entry[4:end]``."""
    pos = 4
    name: bytes | None = None
    partition_key: bytes | None = None
    ordering_key: bytes | None = None
    sequence_id = -1
    published = b64 = False
    try:
        while pos < end:
            tag = entry[pos]
            pos += 1
            if tag >= 0x80:  # a two-byte tag: fields 16 to 2047
                high = entry[pos]
                pos += 1
                if high >= 0x80:
                    return None
                tag = (tag & 0x7F) | (high << 7)
            field = tag >> 3
            wire = tag & 7
            if field == 0:
                return None
            if wire == 2:
                length = entry[pos]
                pos += 1
                if length >= 0x80:
                    high = entry[pos]
                    pos += 1
                    if high >= 0x80:
                        return None
                    length = (length & 0x7F) | (high << 7)
                following = pos + length
                if following > end:
                    return None
                if field == _PRODUCER_NAME:
                    name = entry[pos:following]
                elif field == _PARTITION_KEY:
                    partition_key = entry[pos:following]
                elif field == _ORDERING_KEY:
                    ordering_key = entry[pos:following]
                elif field == _PROPERTIES and not _key_value_complete(entry, pos, following):
                    return None
                pos = following
            elif wire == 0:
                value = entry[pos]
                pos += 1
                if value >= 0x80:
                    value &= 0x7F
                    shift = 7
                    while True:
                        byte = entry[pos]
                        pos += 1
                        value |= (byte & 0x7F) << shift
                        if byte < 0x80:
                            break
                        shift += 7
                        if shift > 56:  # a tenth byte: protobuf's 64-bit truncation
                            return None
                if field == _SEQUENCE_ID:
                    sequence_id = value
                elif field == _PUBLISH_TIME:
                    published = True
                elif field == _PARTITION_KEY_B64:
                    b64 = value != 0
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            else:
                return None
    except IndexError:
        return None
    if pos != end or name is None or sequence_id < 0 or not published:
        return None
    if ordering_key is not None:
        return ordering_key
    if partition_key is not None:
        if not partition_key.isascii():
            return None
        if b64:
            try:
                return base64.b64decode(partition_key, validate=True)
            except ValueError:
                pass  # as the protobuf path: an undecodable key routes as written
        return partition_key
    if not name.isascii():
        return None
    return b"%s-%d" % (name, sequence_id)


def _key_value_complete(entry: bytes, pos: int, end: int) -> bool:
    """Whether ``entry[pos:end]`` is a KeyValue with both its required strings, walked
    simply (one-byte tags and lengths); False also for anything else, to fall back."""
    seen = 0
    while pos < end:
        tag = entry[pos]
        if tag >= 0x80 or tag & 7 != 2 or tag < 8:
            return False
        if tag == 0x0A:
            seen |= 1
        elif tag == 0x12:
            seen |= 2
        length = entry[pos + 1] if pos + 1 < end else 0x80
        if length >= 0x80:
            return False
        pos += 2 + length
    return pos == end and seen == 3
