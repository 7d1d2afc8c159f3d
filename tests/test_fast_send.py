"""The hand-rolled SEND decoder against protobuf: same fields when it accepts, same frames
and the same errors from the frame decoder whether or not it takes the fast path."""

from __future__ import annotations

import struct

from google.protobuf.message import DecodeError
from hypothesis import example, given, settings
from hypothesis import strategies as st

from brokerlet.transport.protocol import (
    MAGIC_CRC32C,
    Frame,
    FrameDecoder,
    ProtocolError,
    SendFields,
    _framing,
    build_entry,
    crc32c,
    decode_payload,
    decode_send,
    encode_payload_command,
    encode_send,
    pb,
)
from brokerlet.transport.protocol._fast import decode_send_by_regex, decode_send_by_walk

T = pb.BaseCommand
U64_MAX = (1 << 64) - 1
EDGES = [0, 1, 127, 128, 16383, 16384, (1 << 32) - 1, (1 << 63) - 1, 1 << 63, U64_MAX]
uint64s = st.one_of(st.sampled_from(EDGES), st.integers(0, U64_MAX))
INT32_EDGES = [-1, 0, 1, (1 << 31) - 1]
int32s = st.one_of(st.sampled_from(INT32_EDGES), st.integers(-(1 << 31), (1 << 31) - 1))
ENTRY = build_entry(pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1), b"x")


def _via_protobuf(raw: bytes) -> SendFields | None:
    """What the protobuf path makes of a serialised BaseCommand, or None if it refuses it."""
    command = T()
    try:
        command.MergeFromString(raw)
    except DecodeError:
        return None
    if not command.HasField("type") or command.type != T.SEND or not command.HasField("send"):
        return None
    if not command.IsInitialized():
        return None
    send = command.send
    highest = send.highest_sequence_id if send.HasField("highest_sequence_id") else None
    return (send.producer_id, send.sequence_id, send.num_messages, highest)


def _decode(data: bytes) -> list[Frame] | str:
    try:
        return FrameDecoder(1 << 20).feed(data)
    except ProtocolError as error:
        return f"error: {error.reason}"


def _decode_with_protobuf(data: bytes) -> list[Frame] | str:
    """The frame decoder's protobuf path for every frame of ``data`` (whole frames, each
    with a payload section), as the decoder takes it when `decode_send` declines a SEND."""
    frames = []
    offset = 0
    try:
        while offset < len(data):
            total_size, command_size = struct.unpack_from(">II", data, offset)
            command_end = offset + 8 + command_size
            frame_end = offset + 4 + total_size
            serialized = data[offset + 8 : command_end]
            command, type_value = _framing._decode_command(serialized)
            if type_value not in (T.SEND, T.MESSAGE):  # a later type field won
                name = _framing.command_name(type_value)
                return f"error: {frame_end - command_end} unexpected bytes after a {name} command"
            invalid_text = _framing.invalid_text_field(command, type_value, serialized)
            frames.append(Frame(command, data[command_end:frame_end], invalid_text, type_value))
            offset = frame_end
    except ProtocolError as error:
        return f"error: {error.reason}"
    return frames


@settings(max_examples=300, deadline=None)
@given(uint64s, uint64s, st.none() | int32s, st.none() | uint64s)
def test_plain_sends_take_the_fast_path_with_protobufs_values(
    producer_id: int, sequence_id: int, num_messages: int | None, highest: int | None
) -> None:
    send = pb.CommandSend(producer_id=producer_id, sequence_id=sequence_id)
    if num_messages is not None:
        send.num_messages = num_messages
    if highest is not None:
        send.highest_sequence_id = highest
    raw = T(type=T.SEND, send=send).SerializeToString()
    decoded = decode_send(raw)
    assert decode_send_by_walk(raw) == decode_send_by_regex(raw) == decoded
    assert _via_protobuf(raw) is not None
    if decoded is None:
        # Declined only for what needs ten-byte varints or a negative num_messages.
        assert max(producer_id, sequence_id, highest or 0) >= 1 << 63 or (num_messages or 0) < 0
        return
    assert decoded == _via_protobuf(raw)


@settings(max_examples=200, deadline=None)
@given(uint64s, uint64s, st.booleans(), st.booleans())
def test_sends_with_other_fields_are_left_to_protobuf(
    producer_id: int, sequence_id: int, is_chunk: bool, marker: bool
) -> None:
    send = pb.CommandSend(producer_id=producer_id, sequence_id=sequence_id, num_messages=1)
    send.is_chunk = is_chunk
    send.marker = marker
    raw = T(type=T.SEND, send=send).SerializeToString()
    assert decode_send(raw) is None
    assert _via_protobuf(raw) is not None


_SEND_HEAD = b"\x08\x06\x32"


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=40))
@example(b"\x02\x08\x01")  # sequence_id missing: a required field
@example(b"\x04\x08\x01\x10")  # truncated varint
@example(b"\x04\x08\x01\x10\x02\x08\x07")  # a field after the body
@example(b"\x06\x08\x01\x10\x02\x08\x03")  # producer_id twice: the last one wins
@example(b"\x04\x08\x01\x10\x02")
@example(b"\x0d\x08\x01\x10\x02\x18\xff\xff\xff\xff\x0f")  # num_messages wraps to -1
def test_arbitrary_send_bodies_match_protobuf_or_are_declined(tail: bytes) -> None:
    raw = _SEND_HEAD + tail
    decoded = decode_send(raw)
    assert decode_send_by_walk(raw) == decode_send_by_regex(raw) == decoded
    if decoded is not None:
        assert decoded == _via_protobuf(raw)


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=48))
@example(b"\x08\x06\x32\x04\x08\x01\x10\x02")  # the shortest plain SEND
@example(b"\x08\x06\x32\x84\x08\x01\x10\x02")  # a body length with its high bit
def test_the_walk_and_the_regex_give_the_same_answer_for_any_bytes(raw: bytes) -> None:
    # decode_send is the walk when compiled and the regex from source (_payload.COMPILED).
    assert decode_send_by_walk(raw) == decode_send_by_regex(raw)


def _frame_of(command_bytes: bytes) -> bytes:
    payload = struct.pack(">HI", MAGIC_CRC32C, crc32c(ENTRY)) + ENTRY
    return struct.pack(">II", 4 + len(command_bytes) + len(payload), len(command_bytes)) + (
        command_bytes + payload
    )


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=40), st.integers(0, 3))
def test_frame_decoder_gives_the_same_frames_and_errors_either_way(
    tail: bytes, repeat: int
) -> None:
    data = _frame_of(_SEND_HEAD + tail) * (repeat + 1)
    assert _decode(data) == _decode_with_protobuf(data)


@settings(max_examples=200, deadline=None)
@given(uint64s, uint64s, st.integers(1, 1000), st.none() | uint64s)
def test_decoded_send_frames_equal_their_protobuf_frames(
    producer_id: int, sequence_id: int, num_messages: int, highest: int | None
) -> None:
    header, entry = encode_send(producer_id, sequence_id, num_messages, ENTRY, highest)
    [frame] = FrameDecoder(1 << 20).feed(header + entry)
    send = pb.CommandSend(
        producer_id=producer_id, sequence_id=sequence_id, num_messages=num_messages
    )
    if highest is not None:
        send.highest_sequence_id = highest
    command = T(type=T.SEND, send=send)
    expected_payload = struct.pack(">HI", MAGIC_CRC32C, crc32c(ENTRY)) + ENTRY
    assert frame == Frame(command, expected_payload)
    assert frame.type == T.SEND
    assert frame.send == Frame(command, expected_payload).send
    assert frame.command == command  # the lazily built protobuf object


def test_a_send_with_a_missing_sequence_id_is_refused_as_before() -> None:
    raw = T(type=T.SEND, send=pb.CommandSend(producer_id=1, sequence_id=2)).SerializeToString()
    broken = _SEND_HEAD + bytes([2]) + b"\x08\x01"  # producer_id only
    assert decode_send(raw) == (1, 2, 1, None)
    assert decode_send(broken) is None
    result = _decode(_frame_of(broken))
    assert result == "error: SEND command is missing required fields: send.sequence_id"


def test_a_send_frame_without_a_checksum_still_decodes() -> None:
    command = T(type=T.SEND, send=pb.CommandSend(producer_id=3, sequence_id=4))
    [frame] = FrameDecoder(1 << 20).feed(encode_payload_command(command, ENTRY, None))
    assert frame.send == (3, 4, 1, None)
    assert frame.payload == ENTRY


@settings(max_examples=500, deadline=None)
@given(
    st.one_of(
        st.just(struct.pack(">HI", MAGIC_CRC32C, crc32c(ENTRY)) + ENTRY),
        st.just(struct.pack(">HI", MAGIC_CRC32C, crc32c(ENTRY) ^ 1) + ENTRY),  # corrupted
        st.binary(max_size=30).map(lambda tail: struct.pack(">H", MAGIC_CRC32C) + tail),
        st.binary(max_size=30),
    )
)
def test_a_send_frames_early_split_section_is_what_decode_payload_makes_of_it(
    section: bytes,
) -> None:
    # The frame decoder splits a checksummed section while the frame is in its buffer, to
    # copy the entry once; what it splits, and the payload rebuilt from that, must be exact.
    command = T(type=T.SEND, send=pb.CommandSend(producer_id=1, sequence_id=2))
    [frame] = FrameDecoder(1 << 20).feed(encode_payload_command(command, section, None))
    assert frame.payload == section
    try:
        expected = decode_payload(section)
    except ProtocolError:
        assert frame.section is None  # left to the connection, which closes on it
        return
    assert frame.section is None or frame.section == expected
    if section[:2] == struct.pack(">H", MAGIC_CRC32C) and section[6:] == ENTRY:
        assert frame.section == expected  # the layout every producer sends is split early
