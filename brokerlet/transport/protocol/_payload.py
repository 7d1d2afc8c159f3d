"""The payload section that follows SEND and MESSAGE commands.

On the wire the section is::

    [0x0e02][size u32][BrokerEntryMetadata]   optional, broker to client only
    [0x0e01][crc32c u32]                      optional
    [metadata_size u32][MessageMetadata][payload]

brokerlet stores the last line (the *entry*) verbatim and never re-encodes the producer's
metadata, because consumers read meaning from which metadata fields are present.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from typing import Final, NamedTuple, TypeAlias

import crc32c as _crc32c_lib
from google.protobuf.message import DecodeError

from brokerlet.transport.protocol import pulsar_pb2 as pb
from brokerlet.transport.protocol._errors import ProtocolError
from brokerlet.transport.protocol._proto import merge_from, missing_fields

__all__ = [
    "ANY_VARINT",
    "COMPILED",
    "MAGIC_BROKER_ENTRY_METADATA",
    "MAGIC_CRC32C",
    "Payload",
    "PayloadFields",
    "build_entry",
    "crc32c",
    "decode_payload",
    "encode_batch",
    "metadata_problem",
    "parse_metadata",
    "plain_key",
    "plain_key_by_regex",
    "plain_key_by_walk",
    "split_batch",
    "split_checksummed",
    "varint_field",
    "walk_varint",
]

MAGIC_CRC32C: Final = 0x0E01
MAGIC_BROKER_ENTRY_METADATA: Final = 0x0E02

_U16: Final = struct.Struct(">H")
_U32: Final = struct.Struct(">I")
_metadata_from: Final = pb.MessageMetadata.FromString
_MAGIC_AND_U32: Final = struct.Struct(">HI")
_U32_PAIR: Final = struct.Struct(">II")
_crc32c: Final = _crc32c_lib.crc32c  # bound once: compiled, a C static, not a lookup
_CRC32C_FIRST: Final = MAGIC_CRC32C >> 8
_CRC32C_SECOND: Final = MAGIC_CRC32C & 0xFF
_as_named: Final = tuple.__new__  # a Payload without its Python-level constructor


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """CRC-32C (Castagnoli) of ``data``, computed in hardware where the CPU allows.

    Args:
        data: Bytes to checksum.

    Returns:
        The checksum as an unsigned 32-bit integer (0xE3069283 for b"123456789").
    """
    result: int = _crc32c(data)
    return result


class Payload(NamedTuple):
    """A decoded payload section.

    Attributes:
        entry: ``[metadata_size u32][MessageMetadata][payload]`` exactly as the producer
            sent it. Only structurally checked when ``checksum_ok`` is True.
        checksum: CRC-32C of ``entry``: the value the sender wrote if it sent one,
            otherwise computed here.
        checksum_ok: False only when a sent checksum does not match ``entry``.
    """

    entry: bytes
    checksum: int
    checksum_ok: bool


PayloadFields: TypeAlias = tuple[bytes, int, bool]
"""A `Payload`'s fields ``(entry, checksum, checksum_ok)`` as a plain tuple: what
`split_checksummed` gives for every SEND (a NamedTuple per message costs several times a
tuple to build and free; docs/performance.md, twenty-fourth pass)."""


def decode_payload(data: bytes) -> Payload:
    """Split a payload section into its checksum and entry.

    Skips an optional broker-entry-metadata block; the checksum magic is optional too
    (clients below protocol version 6 send none). A checksum mismatch is reported, not
    raised, because Pulsar answers it with a per-message error and keeps the connection.

    Args:
        data: Everything in the frame after the command.

    Returns:
        The entry with its checksum.

    Raises:
        ProtocolError: The section is truncated or its metadata size points past its end.
    """
    size = len(data)
    section = split_checksummed(data, 0, size)
    if section is not None:
        return _as_named(Payload, section)
    offset = 0
    if size >= 2 and _U16.unpack_from(data, 0)[0] == MAGIC_BROKER_ENTRY_METADATA:
        if size < 6:
            raise ProtocolError("payload ends inside the broker entry metadata header")
        (metadata_size,) = _U32.unpack_from(data, 2)
        offset = 6 + metadata_size
        if offset > size:
            raise ProtocolError(
                f"broker entry metadata of {metadata_size} bytes runs past the end of "
                f"a {size}-byte payload"
            )

    sent_checksum: int | None = None
    if size - offset >= 2 and _U16.unpack_from(data, offset)[0] == MAGIC_CRC32C:
        if size - offset < 6:
            raise ProtocolError("payload ends inside the checksum")
        (sent_checksum,) = _U32.unpack_from(data, offset + 2)
        offset += 6

    entry = data[offset:] if offset else data
    if sent_checksum is not None:
        computed = crc32c(entry)
        if computed != sent_checksum:
            # Corruption is what the checksum is for: let the caller answer it per message.
            return Payload(entry=bytes(entry), checksum=sent_checksum, checksum_ok=False)
    _check_entry(entry)
    checksum = crc32c(entry) if sent_checksum is None else sent_checksum
    return Payload(entry=bytes(entry), checksum=checksum, checksum_ok=True)


def split_checksummed(data: bytes, start: int, end: int) -> PayloadFields | None:
    """`decode_payload` of ``data[start:end]`` when it is what every producer sends: a
    checksum, then an entry whose metadata size fits. None for any other layout.

    Takes the frame's buffer and the section's bounds, so the entry is copied out once.
    """
    if end - start >= 10 and data[start] == _CRC32C_FIRST and data[start + 1] == _CRC32C_SECOND:
        if COMPILED:
            sent = read_u32(data, start + 2)
            metadata_size = read_u32(data, start + 6)
        else:
            sent, metadata_size = _U32_PAIR.unpack_from(data, start + 2)
        if metadata_size <= end - start - 10:
            entry = data[start + 6 : end]
            return (entry, sent, _crc32c(entry) == sent)
    return None


def _check_entry(entry: bytes | memoryview) -> int:
    """Validate an entry's metadata size and return it."""
    if len(entry) < 4:
        raise ProtocolError(f"entry of {len(entry)} bytes is too short for its metadata size")
    (metadata_size,) = _U32.unpack_from(entry, 0)
    if metadata_size > len(entry) - 4:
        raise ProtocolError(
            f"metadata size {metadata_size} runs past the end of a {len(entry)}-byte entry"
        )
    return int(metadata_size)


def parse_metadata(entry: bytes) -> pb.MessageMetadata:
    """Decode the MessageMetadata at the start of an entry.

    Args:
        entry: ``[metadata_size u32][MessageMetadata][payload]``.

    Returns:
        The parsed metadata.

    Raises:
        ProtocolError: The entry is truncated, or the metadata is undecodable or lacks a
            required field.
    """
    metadata_size = _check_entry(entry)
    metadata = pb.MessageMetadata()
    try:
        merge_from(metadata, memoryview(entry)[4 : 4 + metadata_size])
    except DecodeError as exc:
        raise ProtocolError(f"undecodable message metadata: {exc}") from None
    if not metadata.IsInitialized():
        missing = missing_fields(metadata)
        raise ProtocolError(f"message metadata is missing required fields: {missing}")
    return metadata


# The metadata of a plain message as the official client writes it, after producer_name:
# sequence_id and publish_time as varints of at most nine bytes, a partition key's tag next
# if it has one.
PLAIN_METADATA_FIELDS: Final = rb"\x10[\x80-\xff]{0,8}[\x00-\x7f]\x18[\x80-\xff]{0,8}[\x00-\x7f]"
_PLAIN_METADATA_TAIL: Final = re.compile(PLAIN_METADATA_FIELDS).match
# The same with nothing after it but a partition key: its size byte, then the key.
_PLAIN_NO_PROPERTIES: Final = re.compile(
    PLAIN_METADATA_FIELDS + rb"(?:\x32([\x00-\x7f])(.*))?", re.S
).fullmatch


def read_u32(data: bytes, at: int) -> int:
    """The big-endian u32 at ``data[at : at + 4]``, which the caller knows is there: compiled,
    four byte reads in C instead of a struct call and its tuple (from source, a struct call
    is faster)."""
    return (data[at] << 24) | (data[at + 1] << 16) | (data[at + 2] << 8) | data[at + 3]


def _plain_metadata_end(entry: bytes) -> int:
    """Where the metadata of an entry ends if it starts as the plain layout does (a
    producer_name under 128 bytes), or -1. (Only `plain_key_by_walk`, compiled, calls it.)"""
    size = len(entry)
    if size < 6 or entry[4] != 0x0A or entry[5] >= 0x80:
        return -1
    end = 4 + read_u32(entry, 0)
    return end if end <= size else -1


def plain_key_by_regex(entry: bytes) -> bytes | None:
    """`plain_key` with regexes: faster than `plain_key_by_walk` from source."""
    # _plain_metadata_end inlined: from source, the call was 1% of the produce path.
    size = len(entry)
    if size < 6 or entry[4] != 0x0A or entry[5] >= 0x80:
        return None
    end = 4 + _U32.unpack_from(entry, 0)[0]
    if end > size:
        return None
    simple = _PLAIN_NO_PROPERTIES(entry, 6 + entry[5], end)
    if simple is not None:  # the usual SEND, in one C call
        key = simple[2]
        if key is None:
            return b""
        return key if len(key) == simple[1][0] else None
    match = _PLAIN_METADATA_TAIL(entry, 6 + entry[5], end)
    if match is None:
        return None
    return _properties_and_key(entry, match.end(), end)


def plain_key_by_walk(entry: bytes) -> bytes | None:
    """`plain_key` by a walk over the bytes: faster than `plain_key_by_regex` compiled."""
    end = _plain_metadata_end(entry)
    if end < 0:
        return None
    at = 6 + entry[5]
    if at >= end or entry[at] != 0x10:
        return None
    sequence_id, at = walk_varint(entry, at + 1, end)
    if sequence_id < 0 or at >= end or entry[at] != 0x18:
        return None
    publish_time, at = walk_varint(entry, at + 1, end)
    if publish_time < 0:
        return None
    return _properties_and_key(entry, at, end)


def _properties_and_key(entry: bytes, at: int, end: int) -> bytes | None:
    """The plain layout's tail from ``at``: properties, then an optional partition key."""
    while at < end and entry[at] == 0x22:  # a property: 0x22 size 0x0A key-size key 0x12 ...
        if at + 6 > end:
            return None
        stop = at + 2 + entry[at + 1]
        value_at = at + 4 + entry[at + 3]
        if (
            entry[at + 1] >= 0x80
            or stop > end
            or entry[at + 2] != 0x0A
            or entry[at + 3] >= 0x80
            or value_at + 2 > stop
            or entry[value_at] != 0x12
            or entry[value_at + 1] >= 0x80
            or value_at + 2 + entry[value_at + 1] != stop
        ):
            return None
        at = stop
    if at == end:
        return b""
    # A partition key that ends the metadata: its tag, its one-byte size, the key.
    size_at = at + 1
    if entry[at] == 0x32 and size_at < end and entry[size_at] < 0x80:
        return entry[size_at + 1 : end] if size_at + 1 + entry[size_at] == end else None
    return None


ANY_VARINT: Final = 70
"""`walk_varint`'s ``shift_limit`` for any varint protobuf writes (ten bytes)."""


def walk_varint(data: bytes, at: int, end: int, shift_limit: int = 63) -> tuple[int, int]:
    """The value of the varint at ``at`` and the offset after it, or (-1, 0) if the bytes
    before ``end`` hold none. At most nine bytes by default (no 64-bit overflow rules on the
    hot path); ``shift_limit`` `ANY_VARINT` takes protobuf's longest."""
    value = 0
    shift = 0
    while at < end and shift < shift_limit:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
    return -1, 0


def varint_field(
    data: bytes, number: int, start: int = 0, end: int = -1, *, first: bool = False
) -> int | None:
    """The raw value of varint field ``number`` of the message serialised in
    ``data[start:end]`` (``end`` -1: to the end of ``data``).

    Walks the top-level fields without interpreting them; returns the last value seen
    (protobuf's rule for repeated scalars), or with ``first`` the first, without walking
    further; None if there is none. A walk that breaks returns what it found before.
    """
    if end < 0:
        end = len(data)
    found: int | None = None
    offset = start
    while offset < end:
        tag, offset = walk_varint(data, offset, end, ANY_VARINT)
        if tag < 0:
            return found
        field_number, wire_type = tag >> 3, tag & 7
        if wire_type == 0:
            value, offset = walk_varint(data, offset, end, ANY_VARINT)
            if value < 0:
                return found
            if field_number == number:
                if first:
                    return value
                found = value
        elif wire_type == 1:
            offset += 8
        elif wire_type == 2:
            length, offset = walk_varint(data, offset, end, ANY_VARINT)
            if length < 0:
                return found
            offset += length
        elif wire_type == 5:
            offset += 4
        else:
            return found
    return found


# Compiled by mypyc, functions are built-in functions rather than Python ones.
COMPILED: Final = type(walk_varint).__name__ != "function"
plain_key: Final = plain_key_by_walk if COMPILED else plain_key_by_regex
"""The partition key of an entry whose metadata is in the official client's plain layout:
producer_name (under 128 bytes), sequence_id, publish_time, any properties (each a key
and a value, in that order, under 128 bytes together) and optionally partition_key
(under 128 bytes), in that order; ``b""`` for such an entry without a partition key.

Protobuf accepts every such metadata (proto2 does not check strings are UTF-8): most
SENDs are checked without a parse, and a keyed one's key comes with the check. ``b""``
stands for an empty key too, which Key_Shared routes unlike no key: read it as "no key
read", never as "no key". None says nothing either way. The walk when compiled, the regexes
from source: the same answer for any bytes.
"""


def metadata_problem(entry: bytes) -> str | None:
    """Why an entry's MessageMetadata cannot be decoded, or None if it can.

    The check :func:`parse_metadata` makes, without raising, for the SEND path where every
    message is checked before it is stored (after :func:`plain_key`, which settles
    most of them without a parse).
    """
    try:
        metadata_size = _check_entry(entry)
        # The usual answer in one parse; FromString does not check required fields.
        view = memoryview(entry)[4 : 4 + metadata_size]
        if _metadata_from(view).IsInitialized():  # type: ignore[arg-type]
            return None
    except ProtocolError as error:
        return error.reason
    except DecodeError:
        pass
    try:
        parse_metadata(entry)  # parsed again only to name the problem
    except ProtocolError as error:
        return error.reason
    return None


def build_entry(metadata: pb.MessageMetadata, payload: bytes) -> bytes:
    """Assemble an entry from metadata and payload.

    Args:
        metadata: Complete metadata (required fields set).
        payload: The message body, or a batch from :func:`encode_batch`.

    Returns:
        ``[metadata_size u32][MessageMetadata][payload]``.
    """
    encoded = metadata.SerializeToString()
    return b"".join((_U32.pack(len(encoded)), encoded, payload))


def encode_batch(messages: Sequence[tuple[pb.SingleMessageMetadata, bytes]]) -> bytes:
    """Concatenate messages into a batch payload.

    ``payload_size`` is filled in from each payload; a metadata object whose value
    disagrees is copied rather than modified.

    Args:
        messages: (per-message metadata, payload) pairs in batch order.

    Returns:
        ``[size u32][SingleMessageMetadata][payload]`` repeated for each message.
    """
    parts: list[bytes] = []
    for given, payload in messages:
        single = given
        if not given.HasField("payload_size") or given.payload_size != len(payload):
            single = pb.SingleMessageMetadata()
            single.CopyFrom(given)
            single.payload_size = len(payload)
        encoded = single.SerializeToString()
        parts.append(_U32.pack(len(encoded)))
        parts.append(encoded)
        parts.append(payload)
    return b"".join(parts)


def split_batch(payload: bytes, count: int) -> list[tuple[pb.SingleMessageMetadata, bytes]]:
    """Split a batch payload into its messages.

    Args:
        payload: The (uncompressed) batch payload.
        count: ``num_messages_in_batch`` from the entry's metadata.

    Returns:
        (per-message metadata, payload) pairs in batch order.

    Raises:
        ProtocolError: The batch is truncated, a header is undecodable, or bytes are
            left over after ``count`` messages.
    """
    view = memoryview(payload)
    size = len(payload)
    offset = 0
    messages: list[tuple[pb.SingleMessageMetadata, bytes]] = []
    for index in range(count):
        if size - offset < 4:
            raise ProtocolError(f"batch ends before message {index} of {count}")
        (header_size,) = _U32.unpack_from(payload, offset)
        offset += 4
        if header_size > size - offset:
            raise ProtocolError(f"header of batch message {index} runs past the end")
        single = pb.SingleMessageMetadata()
        try:
            merge_from(single, view[offset : offset + header_size])
        except DecodeError as exc:
            raise ProtocolError(f"undecodable header of batch message {index}: {exc}") from None
        if not single.IsInitialized():
            raise ProtocolError(f"header of batch message {index} has no payload_size")
        offset += header_size
        body_size = single.payload_size
        if body_size < 0 or body_size > size - offset:
            raise ProtocolError(
                f"batch message {index} claims {body_size} bytes; {size - offset} are left"
            )
        messages.append((single, bytes(view[offset : offset + body_size])))
        offset += body_size
    if offset != size:
        raise ProtocolError(f"{size - offset} bytes left over after {count} batch messages")
    return messages
