"""The hand-rolled ACK decoder against protobuf: what it accepts, protobuf reads to the same
fields; what it declines (a part of a batch, properties, transactions, malformed bytes) goes
the protobuf way, so the connection acts on the same acks and refuses the same frames."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError
from hypothesis import example, given, settings
from hypothesis import strategies as st

from brokerlet.transport.protocol import FrameDecoder, ProtocolError, encode_ack, pb
from brokerlet.transport.protocol._fast import AckFields, decode_ack
from brokerlet.transport.protocol._payload import COMPILED

T = pb.BaseCommand
U64_MAX = (1 << 64) - 1
EDGES = [0, 1, 127, 128, 16383, 16384, (1 << 32) - 1, (1 << 63) - 1, 1 << 63, U64_MAX]
uint64s = st.one_of(st.sampled_from(EDGES), st.integers(0, U64_MAX))
small = st.integers(0, (1 << 63) - 1)  # what a nine-byte varint holds: the walk's reach


def _via_protobuf(raw: bytes) -> AckFields | None:
    """What the connection's protobuf path acts on for these command bytes: the whole
    entries acked (ids without an ack set); None if protobuf refuses the bytes or they are
    not an ACK."""
    command = T()
    try:
        command.MergeFromString(raw)
    except DecodeError:
        return None
    if not command.IsInitialized() or command.type != T.ACK or not command.HasField("ack"):
        return None
    ack = command.ack
    positions = [(m.ledger_id, m.entry_id) for m in ack.message_id if not m.ack_set]
    request_id = ack.request_id if ack.HasField("request_id") else None
    return AckFields(
        ack.consumer_id, ack.ack_type == pb.CommandAck.Cumulative, positions, request_id
    )


message_ids = st.builds(
    lambda ledger, entry, partition, index, size: pb.MessageIdData(
        ledger_id=ledger, entry_id=entry, **partition, **index, **size
    ),
    small,
    small,
    st.just({}) | st.builds(lambda p: {"partition": p}, st.integers(0, 1 << 20)),
    st.just({}) | st.builds(lambda i: {"batch_index": i}, st.integers(0, 1000)),
    st.just({}) | st.builds(lambda s: {"batch_size": s}, st.integers(0, 1000)),
)


@settings(max_examples=300, deadline=None)
@given(small, st.booleans(), st.lists(message_ids, max_size=20), st.none() | small)
def test_acks_of_whole_entries_take_the_fast_path_with_protobufs_values(
    consumer_id: int,
    cumulative: bool,
    ids: list[pb.MessageIdData],
    request_id: int | None,
) -> None:
    ack = pb.CommandAck(
        consumer_id=consumer_id,
        ack_type=pb.CommandAck.Cumulative if cumulative else pb.CommandAck.Individual,
        message_id=ids,
    )
    if request_id is not None:
        ack.request_id = request_id
    raw = T(type=T.ACK, ack=ack).SerializeToString()
    fields = decode_ack(raw)
    assert fields is not None
    assert fields == _via_protobuf(raw)


@settings(max_examples=200, deadline=None)
@given(uint64s, uint64s, st.sampled_from(["ack_set", "properties", "txn", "negative", "error"]))
def test_acks_with_other_fields_are_left_to_protobuf(
    ledger_id: int, entry_id: int, extra: str
) -> None:
    message_id = pb.MessageIdData(ledger_id=ledger_id, entry_id=entry_id)
    ack = pb.CommandAck(consumer_id=1, ack_type=pb.CommandAck.Individual, message_id=[message_id])
    if extra == "ack_set":
        ack.message_id[0].ack_set.append(-2)
    elif extra == "properties":
        ack.properties.add(key="k", value=1)
    elif extra == "negative":
        ack.message_id[0].partition = -1  # ten bytes: protobuf's reading of an int32
    elif extra == "error":
        ack.validation_error = pb.CommandAck.ChecksumMismatch
    body = ack.SerializeToString()
    if extra == "txn":
        body += b"\x30\x01"  # txnid_least_bits: unknown to this broker's schema
    raw = b"\x08\x0a\x52" + bytes((len(body),)) + body
    assert decode_ack(raw) is None


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=48))
@example(b"\x08\x01\x10\x00")  # the shortest plain ACK: no message id
@example(b"\x08\x01\x10\x02")  # ack_type 2: no such enum value
@example(b"\x10\x00")  # consumer_id missing: a required field
@example(b"\x08\x01\x10\x00\x1a\x02\x08\x05")  # an id without its entry id
@example(b"\x08\x01\x10\x00\x1a\x04\x08\x05\x10\x06\x08\x02")  # consumer_id twice: the last wins
@example(b"\x08\x01\x10\x00\x1a\x04\x08\x05\x10")  # an id running past the body
@example(b"\x08\x01\x10\x00\x1a\x06\x08\x05\x10\x06\x08\x07")  # ledger id twice in an id
def test_arbitrary_ack_bodies_match_protobuf_or_are_declined(body: bytes) -> None:
    raw = b"\x08\x0a\x52" + bytes((len(body),)) + body
    fields = decode_ack(raw)
    if fields is not None:
        assert fields == _via_protobuf(raw)


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=48))
@example(b"\x08\x0a\x52\x84\x08\x01\x10\x00")  # a body length with its high bit
@example(b"\x08\x0a\x52\x04\x08\x01\x10\x00\x08\x0b")  # a field after the body
def test_arbitrary_commands_match_protobuf_or_are_declined(raw: bytes) -> None:
    fields = decode_ack(raw)
    if fields is not None:
        assert fields == _via_protobuf(raw)


def test_the_frame_decoder_takes_acks_the_fast_way_when_compiled() -> None:
    positions = [(5, entry_id) for entry_id in range(100_000, 101_000)]
    (frame,) = FrameDecoder(1 << 20).feed(encode_ack(7, positions, cumulative=False))
    assert frame.type == T.ACK
    if COMPILED:
        assert frame.ack == AckFields(7, False, positions, None)
    else:  # from source, protobuf and a loop over its objects are the faster way
        assert frame.ack is None
    # Either way the command is there for whoever asks (logs, the protobuf path).
    assert frame.command.ack.consumer_id == 7
    assert [(m.ledger_id, m.entry_id) for m in frame.command.ack.message_id] == positions


def test_an_ack_the_fast_way_declines_is_still_refused_by_protobuf() -> None:
    raw = b"\x08\x0a\x52\x02\x10\x00"  # no consumer_id
    frame = (len(raw) + 4).to_bytes(4, "big") + len(raw).to_bytes(4, "big") + raw
    with pytest.raises(ProtocolError, match="missing required fields"):
        FrameDecoder(1 << 20).feed(frame)
