"""Hand-rolled codecs for the commands on the per-message hot path.

Building a protobuf object costs more than the rest of a MESSAGE frame put together, so
the encoders write the varints directly. Each produces exactly the bytes protobuf's
serialiser would for the same field values (fields in number order, every listed field
present); the tests compare the two byte for byte.

Two commands arrive once per message: SEND, and ACK (one message id per message, however
the client groups them). `decode_send` and `decode_ack` read the plain shapes every client
writes and decline everything else (unknown or rare fields, odd encodings, malformed bytes)
by returning None, so that the protobuf path decodes, validates and rejects those exactly as
before. What they accept, protobuf decodes to the same field values; differential tests
check that.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, NamedTuple, TypeAlias, TypeVar

import crc32c as _crc32c_lib

from brokerlet.transport.protocol._payload import COMPILED, MAGIC_CRC32C, walk_varint

__all__ = [
    "AckFields",
    "SendFields",
    "decode_ack",
    "decode_send",
    "decode_send_by_regex",
    "decode_send_by_walk",
    "encode_ack",
    "encode_flow",
    "encode_lookup_connect",
    "encode_message",
    "encode_messages",
    "encode_producer_success",
    "encode_send",
    "encode_send_receipt",
    "encode_send_receipts",
    "encode_success",
    "encode_topic_partitions",
]

_FRAME_HEADER: Final = struct.Struct(">II")
_CHECKSUM_HEADER: Final = struct.Struct(">HI")
_U16: Final = struct.Struct(">H")
_U32: Final = struct.Struct(">I")
_ONE_BYTE_VARINTS: Final = [bytes((value,)) for value in range(0x80)]
_K = TypeVar("_K")
_V = TypeVar("_V")
_UINT32_LIMIT: Final = 1 << 32
_UINT64_LIMIT: Final = 1 << 64
_UINT64_MASK: Final = _UINT64_LIMIT - 1

# BaseCommand prefixes: field 1 (type) as a varint, then the body's length-delimited tag,
# whose field number equals the type value.
_SEND_PREFIX: Final = b"\x08\x06\x32"  # type SEND (6), field 6
_RECEIPT_PREFIX: Final = b"\x08\x07\x3a"  # type SEND_RECEIPT (7), field 7
_MESSAGE_PREFIX: Final = b"\x08\x09\x4a"  # type MESSAGE (9), field 9
_ACK_PREFIX: Final = b"\x08\x0a\x52"  # type ACK (10), field 10
_FLOW_PREFIX: Final = b"\x08\x0b\x5a"  # type FLOW (11), field 11
_SUCCESS_PREFIX: Final = b"\x08\x0d\x6a"  # type SUCCESS (13), field 13
_PRODUCER_SUCCESS_PREFIX: Final = b"\x08\x11\x8a\x01"  # type PRODUCER_SUCCESS (17), field 17
_PARTITIONS_PREFIX: Final = b"\x08\x16\xb2\x01"  # PARTITIONED_METADATA_RESPONSE (22), field 22
_LOOKUP_PREFIX: Final = b"\x08\x18\xc2\x01"  # type LOOKUP_RESPONSE (24), field 24
_REDELIVERY_ZERO: Final = b"\x18\x00"  # redelivery_count = 0, written explicitly


def _varint_tables() -> tuple[list[bytes], list[bytes]]:
    """The varint of every value below 2**14, and every 14-bit value with both continuation
    bits set (the first two bytes of a three-byte varint); indexed by value, 1.4 MB together."""
    lows = [bytes((low | 0x80,)) for low in range(0x80)]
    continued_highs = [bytes((high | 0x80,)) for high in range(0x80)]
    # Concatenating one-byte objects builds them three times faster than bytes((a, b)).
    varints = [low + high for high in _ONE_BYTE_VARINTS for low in lows]
    varints[:0x80] = _ONE_BYTE_VARINTS
    continued = [low + high for high in continued_highs for low in lows]
    return varints, continued


# Entry and sequence ids are mostly two or three bytes long; a table lookup is several
# times faster than building the bytes (a receipt and a delivery encode two or three).
_VARINT_TABLES = _varint_tables()
_VARINTS_14_BITS: Final = _VARINT_TABLES[0]
_CONTINUED_14_BITS: Final = _VARINT_TABLES[1]


def _uint(value: int, limit: int = _UINT64_LIMIT) -> bytes:
    """Varint of an unsigned field; rejects values protobuf would reject.

    ``limit`` (exclusive) is 2**32 or 2**64: values below 2**21 need no range check.
    """
    if 0 <= value < 0x4000:
        return _VARINTS_14_BITS[value]
    if 0 < value < 0x200000:
        return _CONTINUED_14_BITS[value & 0x3FFF] + _ONE_BYTE_VARINTS[value >> 14]
    if not 0 <= value < limit:
        raise ValueError(f"{value} is out of range for an unsigned field below {limit}")
    groups = []
    while value >= 0x80:
        groups.append((value & 0x7F) | 0x80)
        value >>= 7
    groups.append(value)
    return bytes(groups)


def _int32(value: int) -> bytes:
    """Varint of an int32 field: negatives take ten bytes, as protobuf writes them."""
    if not -(1 << 31) <= value < (1 << 31):
        raise ValueError(f"{value} is out of range for an int32 field")
    return _uint(value + _UINT64_LIMIT if value < 0 else value)


def _message_id(ledger_id: int, entry_id: int) -> bytes:
    """MessageIdData with ledger and entry id, as a length-delimited field value."""
    body = _ledger_prefix(ledger_id) + _uint(entry_id)
    return _ONE_BYTE_VARINTS[len(body)] + body  # at most 22 bytes: a one-byte length


def _cached(encode: Callable[[_K], _V]) -> Callable[[_K], _V]:
    """Memoise what depends on small, long-lived ids (a ledger, a consumer)."""
    cache: dict[_K, _V] = {}

    def lookup(key: _K) -> _V:
        found = cache.get(key)
        if found is None:
            if len(cache) >= 4096:
                cache.clear()
            found = cache[key] = encode(key)
        return found

    return lookup


_ledger_prefix: Callable[[int], bytes] = _cached(
    lambda ledger_id: b"\x08" + _uint(ledger_id) + b"\x10"
)
_consumer_prefix: Callable[[int], bytes] = _cached(
    lambda consumer_id: b"\x08" + _uint(consumer_id) + b"\x12"
)
_producer_prefix: Callable[[int], bytes] = _cached(
    lambda producer_id: b"\x08" + _uint(producer_id) + b"\x10"
)


def _frame(command: bytes) -> bytes:
    return _FRAME_HEADER.pack(len(command) + 4, len(command)) + command


def _message_head(  # noqa: PLR0917 (positional: it runs once per delivered message)
    consumer: bytes,
    message_id: bytes,
    redelivery_count: int,
    ack_set: Sequence[int],
    epoch: bytes,
    entry_size: int,
    checksum: int,
) -> tuple[bytes, ...]:
    """The pieces of a MESSAGE frame before its entry, to be joined.

    Args:
        consumer: `_consumer_prefix` of the consumer id (it ends with message_id's tag).
        message_id: the MessageIdData field value, its length byte first (`_message_id`).
        redelivery_count: written even when 0.
        ack_set: int64 words of a partly acknowledged batch's members not acked yet.
        epoch: the consumer_epoch field, or b"" for none.
        entry_size: length of the entry that follows.
        checksum: CRC-32C of the entry.
    """
    redelivery = (
        _REDELIVERY_ZERO
        if redelivery_count == 0
        else b"\x18" + _uint(redelivery_count, _UINT32_LIMIT)
    )
    words = b"".join([b"\x20" + _uint(word & _UINT64_MASK) for word in ack_set]) if ack_set else b""
    body_size = len(consumer) + len(message_id) + len(redelivery) + len(words) + len(epoch)
    # Without an ack set the body is at most 52 bytes: its length is one varint byte.
    size = _ONE_BYTE_VARINTS[body_size] if body_size < 0x80 else _uint(body_size)
    command_size = len(_MESSAGE_PREFIX) + len(size) + body_size
    return (
        _FRAME_HEADER.pack(command_size + 10 + entry_size, command_size),
        _MESSAGE_PREFIX,
        size,
        consumer,
        message_id,
        redelivery,
        words,
        epoch,
        _CHECKSUM_HEADER.pack(MAGIC_CRC32C, checksum),
    )


def encode_message(  # noqa: PLR0917 (the positional signature is the public API)
    consumer_id: int,
    ledger_id: int,
    entry_id: int,
    redelivery_count: int,
    entry: bytes,
    checksum: int,
    ack_set: Sequence[int] = (),
    consumer_epoch: int | None = None,
) -> tuple[bytes, bytes]:
    """Encode a MESSAGE frame (broker to consumer).

    ``redelivery_count`` is always written, even when 0, matching a protobuf object
    where it was set explicitly.

    Args:
        consumer_id: The consumer's id on its connection.
        ledger_id: Ledger of the entry.
        entry_id: Entry id within the ledger.
        redelivery_count: Times this entry was delivered before.
        entry: ``[metadata_size u32][MessageMetadata][payload]``.
        checksum: CRC-32C of ``entry`` (stored with it, so not recomputed here).
        ack_set: int64 words of a partly acknowledged batch's members not acked yet.
        consumer_epoch: the consumer's epoch (Exclusive/Failover clients that send one).

    Returns:
        (header, entry): the frame is their concatenation; write both with one
        vectored send to avoid copying the entry.
    """
    epoch = b"" if consumer_epoch is None else b"\x28" + _uint(consumer_epoch)
    header = b"".join(
        _message_head(
            _consumer_prefix(consumer_id),
            _message_id(ledger_id, entry_id),
            redelivery_count,
            ack_set,
            epoch,
            len(entry),
            checksum,
        )
    )
    return header, entry


StoredEntry = tuple[int, int, bytes, int, int, int]
"""What :func:`encode_messages` takes of an entry: the fields of a ledger's ``Entry`` in its
order (ledger id, entry id, data, checksum, messages, key hash), unpacked at once rather than read
one attribute at a time."""


COPY_LIMIT = 8 * 1024
"""Entries up to this size are copied into their batch's buffer by :func:`encode_messages`.

A separate buffer costs more than copying this much: the channel's bookkeeping per buffer and
the kernel's per iovec come to a few µs, a memcpy of 8 KiB to about half of one."""


_FirstDelivery = tuple[Callable[..., bytes], bytes, bytes, int]


def _first_delivery_layout(key: tuple[int, int, int, int | None]) -> _FirstDelivery:
    """How :func:`encode_messages` frames a whole entry delivered the first time (redelivery
    count 0, no ack set), for ``key`` = (consumer id, ledger id, length of the entry id's
    varint, consumer epoch): everything before the entry is then one ``pack`` of the frame's
    total size, the constant bytes up to the entry id, the entry id, the constant bytes
    after it, and the checksum. Returns ``(pack, before, after, size_without_entry)``."""
    consumer_id, ledger_id, id_size, consumer_epoch = key
    consumer = _consumer_prefix(consumer_id)
    ledger = _ledger_prefix(ledger_id)
    epoch = b"" if consumer_epoch is None else b"\x28" + _uint(consumer_epoch)
    message_id_size = len(ledger) + id_size
    after = _REDELIVERY_ZERO + epoch + _U16.pack(MAGIC_CRC32C)
    # At most 12 + 23 + 13 bytes: the body's length is one varint byte.
    body_size = len(consumer) + 1 + message_id_size + len(_REDELIVERY_ZERO) + len(epoch)
    command_size = len(_MESSAGE_PREFIX) + 1 + body_size
    before = b"".join(
        (
            _U32.pack(command_size),
            _MESSAGE_PREFIX,
            _ONE_BYTE_VARINTS[body_size],
            consumer,
            _ONE_BYTE_VARINTS[message_id_size],
            ledger,
        )
    )
    layout = struct.Struct(f">I{len(before)}s{id_size}s{len(after)}sI")
    return layout.pack, before, after, command_size + 10


# A consumer's frames differ only in ids and sizes: memoised as the prefixes are.
_first_delivery = _cached(_first_delivery_layout)


def encode_messages(
    consumer_id: int,
    entries: Iterable[StoredEntry],
    redelivery_counts: Iterable[int],
    ack_sets: Mapping[int, Sequence[int]] | None = None,
    consumer_epoch: int | None = None,
) -> list[bytes]:
    """Encode the MESSAGE frames of one consumer batch into as few buffers as possible.

    The bytes are those of :func:`encode_message` for each entry, back to back. Frame
    headers, and entries up to :data:`COPY_LIMIT` bytes, are joined into one buffer; a
    larger entry is passed through uncopied as a buffer of its own. A batch of small
    messages is then one buffer for the channel and one iovec for the kernel.

    Args:
        consumer_id: The consumer's id on its connection.
        entries: The batch's entries, in delivery order.
        redelivery_counts: Times each entry was delivered before (same order).
        ack_sets: entry id -> int64 words of a partly acknowledged batch's members not
            acked yet; entries not in it are sent whole.
        consumer_epoch: the consumer's epoch, written in every frame when given.

    Returns:
        The buffers, to be written back to back with one vectored write.
    """
    buffers: list[bytes] = []
    pieces: list[bytes] = []
    ledger_id = -1
    ledger = b""
    id_size = 0  # of the first-delivery layout in hand (0: none yet)
    # Compiled, a fixed-length tuple type is unboxed into a C struct (each int converted, and
    # boxed again where an object is needed); a tuple of any length is read item by item.
    rows: Iterable[tuple[Any, ...]] = entries
    entry_ledger: int
    entry_id: int
    data: bytes
    for (entry_ledger, entry_id, data, checksum, _, _), redelivery_count in zip(
        rows, redelivery_counts, strict=True
    ):
        if entry_ledger != ledger_id:
            ledger_id = entry_ledger
            ledger = _ledger_prefix(ledger_id)
            id_size = 0
        id_varint = _uint(entry_id)
        ack_set = ack_sets.get(entry_id, ()) if ack_sets else ()
        if redelivery_count or ack_set:
            message_id = ledger + id_varint  # at most 22 bytes: one length byte
            pieces += _message_head(
                _consumer_prefix(consumer_id),
                _ONE_BYTE_VARINTS[len(message_id)] + message_id,
                redelivery_count,
                ack_set,
                b"" if consumer_epoch is None else b"\x28" + _uint(consumer_epoch),
                len(data),
                checksum,
            )
        else:
            # Nearly every delivery: one pack for everything before the entry.
            if len(id_varint) != id_size:
                id_size = len(id_varint)
                pack, before, after, overhead = _first_delivery(
                    (consumer_id, ledger_id, id_size, consumer_epoch)
                )
            pieces.append(pack(overhead + len(data), before, id_varint, after, checksum))
        if len(data) <= COPY_LIMIT:
            pieces.append(data)
        else:
            buffers.append(b"".join(pieces))
            buffers.append(data)
            pieces = []
    if pieces:
        buffers.append(b"".join(pieces))
    return buffers


def encode_send_receipt(
    producer_id: int,
    sequence_id: int,
    highest_sequence_id: int,
    ledger_id: int,
    entry_id: int,
) -> bytes:
    """Encode a SEND_RECEIPT frame; ``highest_sequence_id`` is always written.

    Args:
        producer_id: The producer's id on its connection.
        sequence_id: The SEND's sequence id, echoed exactly.
        highest_sequence_id: The SEND's highest sequence id (0 if it had none).
        ledger_id: Ledger the entry was stored in.
        entry_id: Entry id it was stored at.

    Returns:
        The frame.
    """
    return encode_send_receipts(
        producer_id, ledger_id, entry_id, ((sequence_id, highest_sequence_id),)
    )


def encode_send_receipts(
    producer_id: int,
    ledger_id: int,
    first_entry_id: int,
    sends: Iterable[Sequence[Any]],
) -> bytes:
    """Encode the SEND_RECEIPT frames of a run of SENDs stored at consecutive entry ids.

    One frame per SEND, back to back, with the producer and ledger prefixes looked up once
    (:func:`encode_send_receipt` is a run of one).

    Args:
        producer_id: The producer's id on its connection.
        ledger_id: Ledger the entries were stored in.
        first_entry_id: Entry id of the first SEND's entry; each next one is one more.
        sends: one sequence per SEND starting (sequence_id, highest_sequence_id), such as
            the connection's append items.

    Returns:
        The frames as one buffer.
    """
    producer = _producer_prefix(producer_id)
    id_heads = _receipt_id_heads(ledger_id)
    # The body is at most 57 bytes: its length is one varint byte.
    fixed_size = len(producer) + len(id_heads[0]) + 1
    heads = _RECEIPT_HEADS
    pieces: list[bytes] = []
    entry_id = first_entry_id
    for send in sends:
        sequence_id = send[0]
        sequence = _uint(sequence_id)
        highest = sequence if send[1] == sequence_id else _uint(send[1])
        entry = _uint(entry_id)
        entry_id += 1
        size = fixed_size + len(sequence) + len(entry) + len(highest)
        pieces += (
            heads[size],
            producer,
            sequence,
            id_heads[len(entry)],
            entry,
            b"\x20",
            highest,
        )
    return b"".join(pieces)


# Everything of a SEND_RECEIPT before its body, by the body's size (at most 57 bytes).
_RECEIPT_HEADS: Final = [
    _FRAME_HEADER.pack(size + 8, size + 4) + _RECEIPT_PREFIX + _ONE_BYTE_VARINTS[size]
    for size in range(0x80)
]


def _receipt_id_heads_of(ledger_id: int) -> list[bytes]:
    """A receipt's message_id tag, its length and the ledger's field, by the entry id's
    varint size (1 to 10 bytes)."""
    ledger = _ledger_prefix(ledger_id)
    return [b"\x1a" + _ONE_BYTE_VARINTS[len(ledger) + size] + ledger for size in range(11)]


_receipt_id_heads = _cached(_receipt_id_heads_of)


def encode_send(
    producer_id: int,
    sequence_id: int,
    num_messages: int,
    entry: bytes,
    highest_sequence_id: int | None = None,
) -> tuple[bytes, bytes]:
    """Encode a SEND frame (producer to broker) with a CRC-32C checksum.

    ``num_messages`` is always written; ``highest_sequence_id`` only when given.

    Args:
        producer_id: The producer's id on its connection.
        sequence_id: Sequence id of the (first) message.
        num_messages: Messages in the entry (1 unless it is a batch).
        entry: ``[metadata_size u32][MessageMetadata][payload]``.
        highest_sequence_id: Sequence id of the last message of a batch, if any.

    Returns:
        (header, entry), to be written back to back.
    """
    parts = [b"\x08", _uint(producer_id), b"\x10", _uint(sequence_id), b"\x18"]
    parts.append(_int32(num_messages))
    if highest_sequence_id is not None:
        parts.append(b"\x30")
        parts.append(_uint(highest_sequence_id))
    body = b"".join(parts)
    command = _SEND_PREFIX + _uint(len(body)) + body
    header = b"".join(
        (
            _FRAME_HEADER.pack(len(command) + 10 + len(entry), len(command)),
            command,
            _CHECKSUM_HEADER.pack(MAGIC_CRC32C, _crc32c_lib.crc32c(entry)),
        )
    )
    return header, entry


def encode_flow(consumer_id: int, permits: int) -> bytes:
    """Encode a FLOW frame granting ``permits`` more messages to a consumer.

    Args:
        consumer_id: The consumer's id on its connection.
        permits: Messages added to the consumer's permits (uint32).

    Returns:
        The frame.
    """
    body = b"\x08" + _uint(consumer_id) + b"\x10" + _uint(permits, _UINT32_LIMIT)
    return _frame(_FLOW_PREFIX + _uint(len(body)) + body)


def _text(key: bytes, text: str) -> bytes:
    data = text.encode()
    return key + _uint(len(data)) + data


def encode_success(request_id: int) -> bytes:
    """Encode a SUCCESS frame answering ``request_id``, as protobuf writes it (a control
    request that comes alone pays for the code it touches: its answer avoids protobuf's)."""
    body = b"\x08" + _uint(request_id)
    return _frame(_SUCCESS_PREFIX + _ONE_BYTE_VARINTS[len(body)] + body)


def encode_producer_success(
    request_id: int,
    producer_name: str,
    last_sequence_id: int = -1,
    schema_version: bytes | None = None,
    topic_epoch: int | None = None,
    *,
    ready: bool = True,
) -> bytes:
    """Encode a PRODUCER_SUCCESS frame; ``ready`` False is a WaitForExclusive producer's
    first answer (``producer_ready`` is written only then, its default being true)."""
    if not -(1 << 63) <= last_sequence_id < (1 << 63):
        raise ValueError(f"{last_sequence_id} is out of range for an int64 field")
    parts = [
        b"\x08",
        _uint(request_id),
        _text(b"\x12", producer_name),
        b"\x18",
        _uint(last_sequence_id + _UINT64_LIMIT if last_sequence_id < 0 else last_sequence_id),
    ]
    if schema_version is not None:
        parts += (b"\x22", _uint(len(schema_version)), schema_version)
    if topic_epoch is not None:
        parts += (b"\x28", _uint(topic_epoch))
    if not ready:
        parts.append(b"\x30\x00")
    body = b"".join(parts)
    return _frame(_PRODUCER_SUCCESS_PREFIX + _uint(len(body)) + body)


def encode_topic_partitions(request_id: int, partitions: int) -> bytes:
    """Encode a successful PARTITIONED_METADATA_RESPONSE (``partitions`` 0: not partitioned)."""
    body = b"\x08" + _uint(partitions, _UINT32_LIMIT) + b"\x10" + _uint(request_id) + b"\x18\x00"
    return _frame(_PARTITIONS_PREFIX + _ONE_BYTE_VARINTS[len(body)] + body)


def encode_lookup_connect(request_id: int, service_url: str, service_url_tls: str = "") -> bytes:
    """Encode a LOOKUP_RESPONSE that sends the client to ``service_url`` (and its TLS URL, if
    any) with authority: what a one-broker cluster answers to every lookup it serves."""
    body = b"".join(
        (
            _text(b"\x0a", service_url) if service_url else b"",
            _text(b"\x12", service_url_tls) if service_url_tls else b"",
            b"\x18\x01\x20",  # response Connect, then request_id's key
            _uint(request_id),
            b"\x28\x01",  # authoritative
        )
    )
    return _frame(_LOOKUP_PREFIX + _uint(len(body)) + body)


def encode_ack(
    consumer_id: int,
    positions: Sequence[tuple[int, int]],
    cumulative: bool = False,
) -> bytes:
    """Encode an ACK frame; the ack type is always written.

    Args:
        consumer_id: The consumer's id on its connection.
        positions: (ledger id, entry id) of each acknowledged entry.
        cumulative: Acknowledge everything up to the (single) position.

    Returns:
        The frame.
    """
    parts = [b"\x08", _uint(consumer_id), b"\x10\x01" if cumulative else b"\x10\x00"]
    for ledger_id, entry_id in positions:
        parts.append(b"\x1a")
        parts.append(_message_id(ledger_id, entry_id))
    body = b"".join(parts)
    return _frame(_ACK_PREFIX + _uint(len(body)) + body)


SendFields: TypeAlias = tuple[int, int, int, int | None]
"""What the broker reads from a SEND, the CommandSend fields it acts on, as a plain tuple
``(producer_id, sequence_id, num_messages, highest_sequence_id)``: num_messages is
protobuf's default 1 when absent, highest_sequence_id None when absent. Not a NamedTuple:
one per message (docs/performance.md, twenty-fourth pass)."""

_INT32_LIMIT: Final = 1 << 31
_VARINT = rb"([\x80-\xff]{0,8}[\x00-\x7f])"  # at most nine bytes: no 64-bit overflow rules
# type = SEND, then the send body (length below 128) with fields 1, 2, [3], [6] in number
# order, as protobuf serialisers write them.
_PLAIN_SEND: Final = re.compile(
    rb"\x08\x06\x32([\x00-\x7f])\x08"
    + _VARINT
    + rb"\x10"
    + _VARINT
    + rb"(?:\x18"
    + _VARINT
    + rb")?(?:\x30"
    + _VARINT
    + rb")?",
    re.DOTALL,
)


def _varint(group: bytes) -> int:
    """The value of a varint that `_VARINT` matched (every byte but the last has its high bit)."""
    size = len(group)
    if size == 1:
        return group[0]
    # Sequence and entry ids are mostly two or three bytes long: no loop for those.
    if size == 2:
        return (group[0] & 0x7F) | (group[1] << 7)
    if size == 3:
        return (group[0] & 0x7F) | ((group[1] & 0x7F) << 7) | (group[2] << 14)
    value = 0
    shift = 0
    for byte in group:
        value |= (byte & 0x7F) << shift
        shift += 7
    return value


def decode_send_by_regex(command: bytes) -> SendFields | None:
    """Decode a serialised BaseCommand that is a plain SEND, or decline it.

    Accepted: ``type`` = SEND, then the ``send`` body as the last field; in the body
    producer_id and sequence_id, optionally num_messages (below 2**31) and
    highest_sequence_id, each once, in field-number order, as varints of at most nine
    bytes. Anything else is declined.

    Args:
        command: The command's bytes (between the frame's command size and its payload).

    Returns:
        The fields, or None when the command needs the protobuf path.
    """
    match = _PLAIN_SEND.fullmatch(command)
    if match is None:
        return None
    length, producer_id, sequence_id, num_messages, highest = match.groups()
    if length[0] + 4 != len(command):
        return None
    if num_messages is None:
        count = 1
    else:
        count = num_messages[0] if len(num_messages) == 1 else _varint(num_messages)
    if count >= _INT32_LIMIT:
        return None  # a negative or wrapped int32: protobuf's reading applies
    return (
        producer_id[0] if len(producer_id) == 1 else _varint(producer_id),
        _varint(sequence_id),
        count,
        None if highest is None else _varint(highest),
    )


def decode_send_by_walk(command: bytes) -> SendFields | None:
    """`decode_send_by_regex`'s answer for every input, by a walk over the bytes: compiled,
    the walk takes a tenth of the regex's instructions; from source, the regex is faster."""
    end = len(command)
    if (
        end < 8
        or command[0] != 0x08
        or command[1] != 0x06
        or command[2] != 0x32
        or command[3] >= 0x80
        or command[3] + 4 != end
        or command[4] != 0x08
    ):
        return None
    producer_id, at = walk_varint(command, 5, end)
    if producer_id < 0 or at >= end or command[at] != 0x10:
        return None
    sequence_id, at = walk_varint(command, at + 1, end)
    if sequence_id < 0:
        return None
    count = 1
    if at < end and command[at] == 0x18:
        count, at = walk_varint(command, at + 1, end)
        if count < 0:
            return None
    highest: int | None = None
    if at < end and command[at] == 0x30:
        value, at = walk_varint(command, at + 1, end)
        if value < 0:
            return None
        highest = value
    if at != end or count >= _INT32_LIMIT:
        return None
    return (producer_id, sequence_id, count, highest)


# The build compiles this module with _payload, or neither.
decode_send: Final = decode_send_by_walk if COMPILED else decode_send_by_regex
"""Decode a serialised BaseCommand that is a plain SEND, or decline it (None): the walk when
this module is compiled, the regex from source, which give the same answer for any bytes."""


class AckFields(NamedTuple):
    """What the broker reads from an ACK whose message ids are whole entries.

    Attributes:
        consumer_id: The consumer's id on its connection.
        cumulative: ``ack_type`` is Cumulative (else Individual).
        positions: (ledger id, entry id) of each message id, in order.
        request_id: The ack receipt's request id; None when absent.
    """

    consumer_id: int
    cumulative: bool
    positions: list[tuple[int, int]]
    request_id: int | None


def decode_ack(command: bytes) -> AckFields | None:
    """Decode a serialised BaseCommand that is an ACK of whole entries, or decline it.

    Accepted: ``type`` = ACK, then the ``ack`` body as the last field; in the body
    consumer_id, ack_type (Individual or Cumulative) and request_id, and message ids of
    ledger and entry id with any partition, batch_index and batch_size (non-negative), in
    any order, as varints of at most nine bytes. Declined: an ack_set (part of a batch), a
    chunked message's first id, properties, transactions, validation errors, anything else.

    Compiled, an id costs about 800 instructions here; through protobuf, its decoding and
    the attribute reads after it cost about 4,700, a quarter of a consumed message's work.

    Args:
        command: The command's bytes (the frame holds nothing after them).

    Returns:
        The fields, or None when the command needs the protobuf path.
    """
    end = len(command)
    if end < 7 or command[0] != 0x08 or command[1] != 0x0A or command[2] != 0x52:
        return None
    size, at = walk_varint(command, 3, end)
    if size < 0 or at + size != end:
        return None
    consumer_id = -1
    ack_type = -1
    request_id: int | None = None
    positions: list[tuple[int, int]] = []
    while at < end:
        tag = command[at]
        if tag == 0x1A:  # a MessageIdData: below 128 bytes unless it holds an ack set
            if at + 1 >= end or command[at + 1] >= 0x80:
                return None
            stop = at + 2 + command[at + 1]
            if stop > end:
                return None
            at += 2
            ledger_id = entry_id = -1
            while at < stop:
                field = command[at]
                value, at = walk_varint(command, at + 1, stop)
                if value < 0:
                    return None
                if field == 0x08:
                    ledger_id = value
                elif field == 0x10:
                    entry_id = value
                elif field not in (0x18, 0x20, 0x30):  # partition, batch_index, batch_size
                    return None
            if ledger_id < 0 or entry_id < 0:
                return None
            positions.append((ledger_id, entry_id))
            continue
        value, at = walk_varint(command, at + 1, end)
        if value < 0:
            return None
        if tag == 0x08:
            consumer_id = value
        elif tag == 0x10 and value <= 1:
            ack_type = value
        elif tag == 0x40:
            request_id = value
        else:
            return None
    if consumer_id < 0 or ack_type < 0:
        return None
    return AckFields(consumer_id, ack_type == 1, positions, request_id)
