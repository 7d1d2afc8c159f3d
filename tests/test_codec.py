"""Tests of the sans-IO Pulsar codec: framing, payload sections and encoders."""

from __future__ import annotations

import itertools
import struct
from typing import Any

import pytest
from google.protobuf.message import EncodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from brokerlet.dispatch.key_shared import protobuf_key_hash
from brokerlet.keyshared import plain_key_hash
from brokerlet.storage.ledger import Entry
from brokerlet.transport.protocol import (
    MAGIC_BROKER_ENTRY_METADATA,
    MAGIC_CRC32C,
    PROTOCOL_VERSION,
    Frame,
    FrameDecoder,
    ProtocolError,
    build_entry,
    command_name,
    crc32c,
    decode_payload,
    encode_ack,
    encode_batch,
    encode_command,
    encode_flow,
    encode_lookup_connect,
    encode_message,
    encode_messages,
    encode_payload_command,
    encode_producer_success,
    encode_send,
    encode_send_receipt,
    encode_send_receipts,
    encode_success,
    encode_topic_partitions,
    metadata_problem,
    parse_metadata,
    pb,
    split_batch,
)
from brokerlet.transport.protocol._fast import COPY_LIMIT
from brokerlet.transport.protocol._payload import (
    plain_key,
    plain_key_by_regex,
    plain_key_by_walk,
    read_u32,
    varint_field,
)

LIMIT = 5 * 1024 * 1024 + 10 * 1024
T = pb.BaseCommand
U64_MAX = (1 << 64) - 1


def _id(ledger: int, entry: int, **extra: int) -> pb.MessageIdData:
    return pb.MessageIdData(ledger_id=ledger, entry_id=entry, **extra)


def _entry(payload: bytes = b"hello", **fields: object) -> bytes:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=3, publish_time=1700)
    for name, value in fields.items():
        setattr(metadata, name, value)
    return build_entry(metadata, payload)


ENTRY = _entry(partition_key="k")

# One sample per command body the schema declares, with the fields brokerlet relies on.
SAMPLES: list[pb.BaseCommand] = [
    T(
        type=T.CONNECT,
        connect=pb.CommandConnect(
            client_version="Pulsar-CPP-v4.2.0",
            protocol_version=20,
            auth_method_name="none",
            feature_flags=pb.FeatureFlags(
                supports_auth_refresh=True, supports_broker_entry_metadata=True
            ),
        ),
    ),
    T(
        type=T.CONNECTED,
        connected=pb.CommandConnected(
            server_version="brokerlet", protocol_version=PROTOCOL_VERSION, max_message_size=5242880
        ),
    ),
    T(
        type=T.SUBSCRIBE,
        subscribe=pb.CommandSubscribe(
            topic="persistent://public/default/t",
            subscription="s",
            sub_type=pb.CommandSubscribe.Key_Shared,
            consumer_id=4,
            request_id=5,
            consumer_name="c",
            priority_level=1,
            durable=False,
            start_message_id=_id(U64_MAX, U64_MAX),
            metadata=[pb.KeyValue(key="a", value="b")],
            read_compacted=False,
            initial_position=pb.CommandSubscribe.Earliest,
            replicate_subscription_state=False,
            force_topic_creation=True,
            start_message_rollback_duration_sec=0,
            key_shared_meta=pb.KeySharedMeta(
                key_shared_mode=pb.STICKY,
                hash_ranges=[pb.IntRange(start=0, end=32767)],
                allow_out_of_order_delivery=True,
            ),
        ),
    ),
    T(
        type=T.PRODUCER,
        producer=pb.CommandProducer(
            topic="persistent://public/default/t",
            producer_id=0,
            request_id=0,
            epoch=1,
            user_provided_producer_name=False,
            producer_access_mode=pb.Shared,
        ),
    ),
    T(
        type=T.SEND,
        send=pb.CommandSend(producer_id=1, sequence_id=2, num_messages=3, highest_sequence_id=4),
    ),
    T(
        type=T.SEND_RECEIPT,
        send_receipt=pb.CommandSendReceipt(
            producer_id=1, sequence_id=2, message_id=_id(7, 0), highest_sequence_id=2
        ),
    ),
    T(
        type=T.SEND_ERROR,
        send_error=pb.CommandSendError(
            producer_id=1, sequence_id=2, error=pb.ChecksumError, message="bad crc"
        ),
    ),
    T(
        type=T.MESSAGE,
        message=pb.CommandMessage(
            consumer_id=1,
            message_id=_id(7, 1),
            redelivery_count=2,
            ack_set=[-1, 12],
            consumer_epoch=3,
        ),
    ),
    T(
        type=T.ACK,
        ack=pb.CommandAck(
            consumer_id=1,
            ack_type=pb.CommandAck.Individual,
            message_id=[_id(7, 0), _id(7, 1, batch_index=2, ack_set=[12])],
            validation_error=pb.CommandAck.ChecksumMismatch,
            properties=[pb.KeyLongValue(key="k", value=1)],
        ),
    ),
    T(type=T.FLOW, flow=pb.CommandFlow(consumer_id=1, message_permits=1000)),
    T(type=T.UNSUBSCRIBE, unsubscribe=pb.CommandUnsubscribe(consumer_id=1, request_id=2)),
    T(type=T.SUCCESS, success=pb.CommandSuccess(request_id=9)),
    T(
        type=T.ERROR,
        error=pb.CommandError(request_id=9, error=pb.ConsumerBusy, message="exclusive"),
    ),
    T(type=T.CLOSE_PRODUCER, close_producer=pb.CommandCloseProducer(producer_id=1, request_id=2)),
    T(type=T.CLOSE_CONSUMER, close_consumer=pb.CommandCloseConsumer(consumer_id=1, request_id=2)),
    T(
        type=T.PRODUCER_SUCCESS,
        producer_success=pb.CommandProducerSuccess(
            request_id=0, producer_name="standalone-0-1", last_sequence_id=-1
        ),
    ),
    T(type=T.PING, ping=pb.CommandPing()),
    T(type=T.PONG, pong=pb.CommandPong()),
    T(
        type=T.REDELIVER_UNACKNOWLEDGED_MESSAGES,
        redeliver_unacknowledged_messages=pb.CommandRedeliverUnacknowledgedMessages(
            consumer_id=1, message_ids=[_id(7, 3)]
        ),
    ),
    T(
        type=T.PARTITIONED_METADATA,
        partitioned_metadata=pb.CommandPartitionedTopicMetadata(topic="t", request_id=1),
    ),
    T(
        type=T.PARTITIONED_METADATA_RESPONSE,
        partitioned_metadata_response=pb.CommandPartitionedTopicMetadataResponse(
            partitions=0,
            request_id=1,
            response=pb.CommandPartitionedTopicMetadataResponse.Success,
        ),
    ),
    T(
        type=T.LOOKUP,
        lookup=pb.CommandLookupTopic(
            topic="t", request_id=2, authoritative=False, advertised_listener_name=""
        ),
    ),
    T(
        type=T.LOOKUP_RESPONSE,
        lookup_response=pb.CommandLookupTopicResponse(
            broker_service_url="pulsar://127.0.0.1:6650",
            response=pb.CommandLookupTopicResponse.Connect,
            request_id=2,
            authoritative=True,
        ),
    ),
    T(
        type=T.SEEK,
        seek=pb.CommandSeek(consumer_id=1, request_id=2, message_id=_id(U64_MAX, U64_MAX)),
    ),
    T(
        type=T.GET_LAST_MESSAGE_ID,
        get_last_message_id=pb.CommandGetLastMessageId(consumer_id=1, request_id=2),
    ),
    T(
        type=T.GET_LAST_MESSAGE_ID_RESPONSE,
        get_last_message_id_response=pb.CommandGetLastMessageIdResponse(
            last_message_id=_id(7, 9), request_id=2, consumer_mark_delete_position=_id(7, 8)
        ),
    ),
    T(
        type=T.ACTIVE_CONSUMER_CHANGE,
        active_consumer_change=pb.CommandActiveConsumerChange(consumer_id=1, is_active=True),
    ),
    T(
        type=T.GET_SCHEMA,
        get_schema=pb.CommandGetSchema(
            request_id=12, topic="persistent://public/default/t", schema_version=bytes(8)
        ),
    ),
    T(
        type=T.GET_SCHEMA_RESPONSE,
        get_schema_response=pb.CommandGetSchemaResponse(
            request_id=12,
            schema=pb.Schema(name="public/default/t", schema_data=b"", type=1),
            schema_version=bytes(8),
        ),
    ),
    T(
        type=T.GET_OR_CREATE_SCHEMA,
        get_or_create_schema=pb.CommandGetOrCreateSchema(
            request_id=13,
            topic="persistent://public/default/t",
            schema=pb.Schema(name="t", schema_data=b"", type=1),
        ),
    ),
    T(
        type=T.GET_OR_CREATE_SCHEMA_RESPONSE,
        get_or_create_schema_response=pb.CommandGetOrCreateSchemaResponse(
            request_id=13, error_code=pb.IncompatibleSchema, error_message="no"
        ),
    ),
    T(
        type=T.GET_TOPICS_OF_NAMESPACE,
        get_topics_of_namespace=pb.CommandGetTopicsOfNamespace(
            request_id=3,
            namespace="public/default",
            topics_pattern="persistent://public/default/a.*",
        ),
    ),
    T(
        type=T.GET_TOPICS_OF_NAMESPACE_RESPONSE,
        get_topics_of_namespace_response=pb.CommandGetTopicsOfNamespaceResponse(
            request_id=3, topics=["persistent://public/default/a"], filtered=True, topics_hash="ab"
        ),
    ),
    T(
        type=T.AUTH_CHALLENGE,
        auth_challenge=pb.CommandAuthChallenge(
            server_version="brokerlet",
            challenge=pb.AuthData(auth_method_name="token", auth_data=b"PulsarAuthRefresh"),
            protocol_version=20,
        ),
    ),
    T(
        type=T.AUTH_RESPONSE,
        auth_response=pb.CommandAuthResponse(
            client_version="Pulsar-CPP-v4.2.0",
            response=pb.AuthData(auth_method_name="token", auth_data=b"eyJ..."),
            protocol_version=20,
        ),
    ),
]

_PAYLOAD_TYPES = {T.SEND, T.MESSAGE}


def _frame_bytes(command: pb.BaseCommand) -> bytes:
    if command.type in _PAYLOAD_TYPES:
        return encode_payload_command(command, ENTRY, crc32c(ENTRY))
    return encode_command(command)


def _payload_of(command: pb.BaseCommand) -> bytes | None:
    if command.type in _PAYLOAD_TYPES:
        return struct.pack(">HI", MAGIC_CRC32C, crc32c(ENTRY)) + ENTRY
    return None


def _stream() -> bytes:
    return b"".join(_frame_bytes(command) for command in SAMPLES)


def _expected_frames() -> list[Frame]:
    return [Frame(command, _payload_of(command)) for command in SAMPLES]


def _raw_frame(command_bytes: bytes, trailer: bytes = b"") -> bytes:
    return struct.pack(">II", 4 + len(command_bytes) + len(trailer), len(command_bytes)) + (
        command_bytes + trailer
    )


# --- schema --------------------------------------------------------------------------


def test_samples_cover_every_command_body_in_the_schema() -> None:
    bodies = {f.name for f in T.DESCRIPTOR.fields if f.name != "type"}
    assert {_body_name(command) for command in SAMPLES} == bodies


def _body_name(command: pb.BaseCommand) -> str:
    return T.Type.Name(command.type).lower()


def test_body_fields_sit_at_their_type_number_and_are_named_after_it() -> None:
    for field in T.DESCRIPTOR.fields:
        if field.name == "type":
            continue
        assert T.Type.Name(field.number).lower() == field.name  # type: ignore[arg-type]


def test_type_enum_lists_every_pulsar_command_type() -> None:
    assert set(T.Type.values()) == set(range(2, 41)) | set(range(50, 69))


def test_server_error_enum_lists_every_pulsar_value() -> None:
    assert set(pb.ServerError.values()) == set(range(26))
    assert pb.ServerError.Value("ProducerFenced") == 25


@pytest.mark.parametrize(
    ("message", "field", "number"),
    [
        (pb.MessageMetadata, "num_messages_in_batch", 11),
        (pb.MessageMetadata, "ordering_key", 18),
        (pb.MessageMetadata, "chunk_id", 29),
        (pb.MessageMetadata, "null_partition_key", 30),
        (pb.SingleMessageMetadata, "sequence_id", 8),
        (pb.CommandSubscribe, "key_shared_meta", 17),
        (pb.CommandLookupTopic, "advertised_listener_name", 7),
        (pb.CommandLookupTopicResponse, "request_id", 4),
        (pb.CommandConnected, "max_message_size", 3),
        (pb.CommandAck, "request_id", 8),
        (pb.CommandSend, "highest_sequence_id", 6),
        (pb.BrokerEntryMetadata, "index", 2),
    ],
)
def test_wire_field_numbers(message: type, field: str, number: int) -> None:
    assert message.DESCRIPTOR.fields_by_name[field].number == number  # type: ignore[attr-defined]


def test_required_fields_are_enforced_when_encoding() -> None:
    with pytest.raises(EncodeError):
        encode_command(T(type=T.ERROR, error=pb.CommandError(request_id=1)))


def test_zero_valued_enum_response_survives_the_wire() -> None:
    [frame] = FrameDecoder(LIMIT).feed(_frame_bytes(SAMPLES[20]))
    response = frame.command.partitioned_metadata_response
    assert response.HasField("response")
    assert response.response == pb.CommandPartitionedTopicMetadataResponse.Success


# --- framing: good input ---------------------------------------------------------------


@pytest.mark.parametrize("command", SAMPLES, ids=_body_name)
def test_round_trip(command: pb.BaseCommand) -> None:
    decoder = FrameDecoder(LIMIT)
    frames = decoder.feed(_frame_bytes(command))
    assert frames == [Frame(command, _payload_of(command))]
    assert decoder.buffered == 0
    decoder.eof()


def test_many_frames_in_one_feed() -> None:
    assert FrameDecoder(LIMIT).feed(_stream() * 3) == _expected_frames() * 3


def _feed_byte_by_byte(decoder: FrameDecoder, stream: bytes) -> list[Frame]:
    frames: list[Frame] = []
    for index in range(len(stream)):
        frames += decoder.feed(stream[index : index + 1])
    return frames


def test_byte_by_byte_feed_yields_the_same_frames() -> None:
    decoder = FrameDecoder(LIMIT)
    assert _feed_byte_by_byte(decoder, _stream()) == _expected_frames()
    assert decoder.buffered == 0


def test_a_read_that_finishes_a_cut_frame_decodes_what_follows_it() -> None:
    # FrameDecoder._after_cut joins a cut frame from the bytes it lacks and decodes the rest
    # of the read in place: every pair of cuts of three frames gives the same frames, and
    # buffered counts what is left of the last one.
    stream = _stream()
    ends = list(itertools.accumulate(_frame_sizes(stream)))
    for first in range(1, len(stream), 7):
        for second in range(first, len(stream) + 1, 11):
            decoder = FrameDecoder(LIMIT)
            frames = decoder.feed(stream[:first]) + decoder.feed(stream[first:second])
            assert frames == _expected_frames()[: sum(end <= second for end in ends)]
            assert decoder.buffered == second - max([0, *(e for e in ends if e <= second)])
            assert frames + decoder.feed(stream[second:]) == _expected_frames()


def test_buffered_counts_a_partial_frame_and_eof_rejects_it() -> None:
    decoder = FrameDecoder(LIMIT)
    frame = _frame_bytes(SAMPLES[0])
    assert decoder.feed(frame[:-3]) == []
    assert decoder.buffered == len(frame) - 3
    with pytest.raises(ProtocolError, match="closed inside a frame"):
        decoder.eof()
    assert len(decoder.feed(frame[-3:])) == 1
    assert decoder.buffered == 0


@pytest.mark.parametrize("chunk", [1_000, 65_536, 70_000])
def test_a_large_frame_cut_into_many_reads_is_collected_and_decoded_whole(chunk: int) -> None:
    # Frames over 64 KiB are kept read by read and joined once whole (FrameDecoder.feed),
    # rather than copied again at every read; what follows them is decoded as usual.
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1)
    header, body = encode_send(1, 7, 1, build_entry(metadata, b"x" * 300_000))
    stream = _stream() + header + body + _stream()
    ends = list(itertools.accumulate(_frame_sizes(stream)))
    decoder = FrameDecoder(LIMIT)
    frames: list[Frame] = []
    for start in range(0, len(stream), chunk):
        frames += decoder.feed(stream[start : start + chunk])
        fed = min(start + chunk, len(stream))
        consumed = ends[len(frames) - 1] if frames else 0
        assert decoder.buffered == fed - consumed
        assert consumed <= fed < (ends[len(frames)] if len(frames) < len(ends) else fed + 1)
    expected = [*_expected_frames(), *FrameDecoder(LIMIT).feed(header + body), *_expected_frames()]
    assert frames == expected
    decoder.eof()


def _frame_sizes(stream: bytes) -> list[int]:
    sizes = []
    offset = 0
    while offset < len(stream):
        (total_size,) = struct.unpack_from(">I", stream, offset)
        sizes.append(4 + total_size)
        offset += 4 + total_size
    return sizes


def test_accepts_bytearray_and_memoryview_without_keeping_them() -> None:
    stream = bytearray(_stream())
    decoder = FrameDecoder(LIMIT)
    frames = decoder.feed(memoryview(stream)[:100]) + decoder.feed(stream[100:])
    stream[:] = b"\0" * len(stream)  # the decoder must have copied what it kept
    assert frames == _expected_frames()


def test_send_with_empty_payload_section_decodes_to_empty_bytes() -> None:
    [frame] = FrameDecoder(LIMIT).feed(_raw_frame(SAMPLES[4].SerializeToString()))
    assert frame.payload == b""


def test_frame_exactly_at_the_limit_is_accepted() -> None:
    frame = _frame_bytes(SAMPLES[0])
    assert len(FrameDecoder(len(frame) - 4).feed(frame)) == 1


def test_known_type_without_a_declared_body_passes_through_intact() -> None:
    # CONSUMER_STATS (25) has no body in our schema: it must still decode, so the
    # connection can answer it, and its body must survive as unknown fields.
    raw = b"\x08\x19" + b"\xca\x01\x04\x08\x01\x20\x02"
    [frame] = FrameDecoder(LIMIT).feed(_raw_frame(raw))
    assert command_name(frame.command.type) == "CONSUMER_STATS"
    assert frame.command.SerializeToString() == raw


def test_command_name() -> None:
    assert command_name(6) == "SEND"
    assert command_name(68) == "TOPIC_MIGRATED"
    assert command_name(45) == "UNKNOWN(45)"


# --- framing: malformed input ----------------------------------------------------------

_SEND_BODY_MISSING_SEQUENCE = b"\x08\x06\x32\x02\x08\x01"
MALFORMED: list[tuple[str, bytes, str]] = [
    ("over-limit", struct.pack(">I", 1000), "frame of 1000 bytes exceeds the limit of 500"),
    ("total-too-small", struct.pack(">II", 3, 0), "frame size 3 is too small"),
    (
        "command-overflows-frame",
        struct.pack(">II", 10, 7) + b"\x08\x12\x92\x01\x00\x00",
        "command of 7 bytes does not fit in a frame of 10 bytes",
    ),
    ("undecodable", _raw_frame(b"\x08\x06\x32\x05\x08"), "undecodable SEND command"),
    ("broken-varint", _raw_frame(b"\x08\xff"), "undecodable untyped command"),
    ("unknown-type", _raw_frame(b"\x08\x63"), "unknown command type 99"),
    ("unknown-type-in-gap", _raw_frame(b"\x08\x2d"), "unknown command type 45"),
    ("unknown-type-corrupt-body", _raw_frame(b"\x08\x63\x32\x09"), "unknown command type 99"),
    ("no-type", _raw_frame(b""), "command has no type"),
    ("missing-body", _raw_frame(b"\x08\x06"), "SEND without its body"),
    ("missing-ping-body", _raw_frame(b"\x08\x12"), "PING without its body"),
    (
        "missing-required",
        _raw_frame(_SEND_BODY_MISSING_SEQUENCE),
        "SEND command is missing required fields: send.sequence_id",
    ),
    (
        "trailing-bytes",
        _raw_frame(T(type=T.PING, ping=pb.CommandPing()).SerializeToString(), b"xyz"),
        "3 unexpected bytes after a PING command",
    ),
]


@pytest.mark.parametrize(
    ("data", "reason"), [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED]
)
def test_malformed_input_raises_with_a_reason(data: bytes, reason: str) -> None:
    decoder = FrameDecoder(500)
    with pytest.raises(ProtocolError, match=reason) as excinfo:
        decoder.feed(data)
    assert reason in excinfo.value.reason
    with pytest.raises(ProtocolError, match="decoder already failed"):
        decoder.feed(_frame_bytes(SAMPLES[16]))


@pytest.mark.parametrize(
    ("data", "reason"), [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED]
)
def test_malformed_input_fed_byte_by_byte_raises_the_same(data: bytes, reason: str) -> None:
    decoder = FrameDecoder(500)
    assert _feed_byte_by_byte(decoder, _frame_bytes(SAMPLES[16])) == [Frame(SAMPLES[16], None)]
    with pytest.raises(ProtocolError, match=reason):
        _feed_byte_by_byte(decoder, data)


def test_oversized_frame_is_rejected_from_its_first_four_bytes() -> None:
    decoder = FrameDecoder(100)
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        decoder.feed(struct.pack(">I", 101))


# --- payload section -------------------------------------------------------------------


def test_crc32c_check_value() -> None:
    assert crc32c(b"123456789") == 0xE3069283


def test_payload_with_checksum() -> None:
    payload = decode_payload(struct.pack(">HI", MAGIC_CRC32C, crc32c(ENTRY)) + ENTRY)
    assert payload.entry == ENTRY
    assert payload.checksum == crc32c(ENTRY)
    assert payload.checksum_ok


def test_payload_without_checksum_gets_one_computed() -> None:
    payload = decode_payload(ENTRY)
    assert (payload.entry, payload.checksum, payload.checksum_ok) == (ENTRY, crc32c(ENTRY), True)


def test_payload_with_broker_entry_metadata_is_skipped_and_excluded_from_the_crc() -> None:
    bem = pb.BrokerEntryMetadata(broker_timestamp=1700, index=5).SerializeToString()
    section = (
        struct.pack(">HI", MAGIC_BROKER_ENTRY_METADATA, len(bem))
        + bem
        + struct.pack(">HI", MAGIC_CRC32C, crc32c(ENTRY))
        + ENTRY
    )
    payload = decode_payload(section)
    assert (payload.entry, payload.checksum_ok) == (ENTRY, True)
    assert decode_payload(section[:6] + bem + ENTRY).entry == ENTRY


def test_payload_with_wrong_checksum_is_reported_not_raised() -> None:
    payload = decode_payload(struct.pack(">HI", MAGIC_CRC32C, crc32c(ENTRY) ^ 1) + ENTRY)
    assert payload.checksum_ok is False
    assert payload.checksum == crc32c(ENTRY) ^ 1
    assert payload.entry == ENTRY
    # A corrupted entry is a checksum failure, not a framing failure.
    garbage = b"\xff\xff\xff\xff"
    assert decode_payload(struct.pack(">HI", MAGIC_CRC32C, 0) + garbage).checksum_ok is False


BAD_SECTIONS: list[tuple[str, bytes, str]] = [
    ("empty", b"", "too short"),
    ("short", b"\x00\x00\x01", "too short"),
    ("metadata-past-end", struct.pack(">I", 50) + b"x" * 10, "metadata size 50 runs past"),
    ("bem-header-cut", b"\x0e\x02\x00\x00", "inside the broker entry metadata header"),
    ("bem-past-end", b"\x0e\x02\x00\x00\x00\x09abc", "broker entry metadata of 9 bytes"),
    ("checksum-cut", b"\x0e\x01\x00\x00", "inside the checksum"),
    ("only-checksum", struct.pack(">HI", MAGIC_CRC32C, crc32c(b"")), "too short"),
]


@pytest.mark.parametrize(
    ("section", "reason"), [c[1:] for c in BAD_SECTIONS], ids=[c[0] for c in BAD_SECTIONS]
)
def test_malformed_payload_section(section: bytes, reason: str) -> None:
    with pytest.raises(ProtocolError, match=reason):
        decode_payload(section)


def test_parse_metadata() -> None:
    metadata = parse_metadata(_entry(b"body", partition_key="k", num_messages_in_batch=4))
    assert (metadata.producer_name, metadata.sequence_id, metadata.partition_key) == ("p", 3, "k")
    assert metadata.HasField("num_messages_in_batch")
    assert not parse_metadata(ENTRY).HasField("num_messages_in_batch")


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        (b"\x00\x00", "too short"),
        (struct.pack(">I", 9) + b"\x0a\x01", "runs past"),
        (struct.pack(">I", 2) + b"\x0a\x05", "undecodable message metadata"),
        (struct.pack(">I", 3) + b"\x0a\x01p", "missing required fields: sequence_id, publish_time"),
    ],
)
def test_parse_metadata_rejects(entry: bytes, reason: str) -> None:
    with pytest.raises(ProtocolError, match=reason):
        parse_metadata(entry)


def _some_metadata() -> st.SearchStrategy[bytes]:
    """Serialised metadata with any of the required fields left out, or random bytes."""
    fields = st.fixed_dictionaries(
        {},
        optional={
            "producer_name": st.text(max_size=5),
            "sequence_id": st.integers(0, U64_MAX),
            "publish_time": st.integers(0, U64_MAX),
            "partition_key": st.text(max_size=5),
            "num_messages_in_batch": st.integers(-(1 << 31), (1 << 31) - 1),
        },
    )
    built = fields.map(lambda f: pb.MessageMetadata(**f).SerializePartialToString())
    return st.one_of(built, st.binary(max_size=12), built.map(lambda b: b[:-1]))


@settings(max_examples=300, deadline=None)
@given(_some_metadata(), st.integers(-2, 10))
def test_metadata_problem_is_parse_metadatas_verdict(metadata: bytes, skew: int) -> None:
    # skew: a size field that cuts the metadata, takes in payload bytes or runs past the end.
    entry = struct.pack(">I", max(0, len(metadata) + skew)) + metadata + b"payload"
    reason = None
    try:
        parse_metadata(entry)
    except ProtocolError as error:
        reason = error.reason
    assert metadata_problem(entry) == reason


def _verdict(entry: bytes) -> str | None:
    try:
        parse_metadata(entry)
    except ProtocolError as error:
        return error.reason
    return None


def _varint_bytes(value: int) -> bytes:
    groups = []
    while value >= 0x80:
        groups.append((value & 0x7F) | 0x80)
        value >>= 7
    return bytes([*groups, value])


_VARINTS = st.one_of(
    st.integers(0, U64_MAX).map(_varint_bytes),  # a well-formed varint (listed twice: more often)
    st.integers(0, U64_MAX).map(_varint_bytes),
    st.integers(0, 7).map(lambda pad: b"\x80" * pad + b"\x00"),  # padded: still well-formed
    st.binary(min_size=1, max_size=11),  # overlong, unterminated, or not a varint at all
)


def _mostly(usual: object, *others: object, odds: int = 4) -> st.SearchStrategy[Any]:
    """``usual`` ``odds`` times to each time one of ``others``."""
    return st.sampled_from([usual] * odds * len(others) + list(others))


@st.composite
def _near_plain_metadata(draw: st.DrawFn) -> bytes:
    """Bytes shaped like the plain layout `plain_key` accepts, often slightly off."""
    name = draw(st.binary(max_size=3))
    pieces = [b"\x0a", bytes([(len(name) + draw(_mostly(0, -1, 1, 0x80))) % 256]), name]
    pieces += [draw(_mostly(b"\x10", b"\x18", b"\x11")), draw(_VARINTS)]
    pieces += [draw(_mostly(b"\x18", b"\x10", b"\x1a")), draw(_VARINTS)]
    for _ in range(draw(st.integers(0, 2))):  # properties: a KeyValue's key, then its value
        key, value = draw(st.binary(max_size=3)), draw(st.binary(max_size=3))
        pair = b"".join(
            (
                draw(_mostly(b"\x0a", b"\x12", b"\x08", odds=5)),
                bytes([(len(key) + draw(_mostly(0, -1, 1, odds=12))) % 256]),
                key,
                draw(_mostly(b"\x12", b"\x0a", b"\x1a", odds=12)),
                bytes([(len(value) + draw(_mostly(0, -1, 1, 0x80, odds=12))) % 256]),
                value,
                draw(_mostly(b"", b"\x00", b"\x18\x01", odds=12)),
            )
        )
        size = (len(pair) + draw(_mostly(0, -1, 1, 0x80, odds=12))) % 256
        pieces += [draw(_mostly(b"\x22", b"\x2a", b"\x20", odds=12)), bytes([size]), pair]
    if draw(st.booleans()):
        key = draw(st.binary(max_size=3))
        pieces += [draw(_mostly(b"\x32", b"\x30", b"\x3a")), bytes([len(key)]), key]
        pieces.append(draw(_mostly(b"", b"\x00", b"\x32")))
    return b"".join(piece for piece in pieces if draw(st.integers(0, 63)) or piece == name)


@settings(max_examples=1000, deadline=None)
@given(_near_plain_metadata(), st.integers(-1, 1))
def test_the_plain_metadata_shortcut_gives_protobufs_verdict(metadata: bytes, skew: int) -> None:
    entry = struct.pack(">I", max(0, len(metadata) + skew)) + metadata + b"payload"
    if plain_key(entry) is not None:
        assert _verdict(entry) is None
    assert metadata_problem(entry) == _verdict(entry)


@settings(max_examples=1000, deadline=None)
@given(_near_plain_metadata(), st.integers(-1, 1))
def test_a_hash_kept_on_send_is_the_one_dispatch_would_work_out(metadata: bytes, skew: int) -> None:
    # The SEND path keeps plain_key_hash(plain_key(entry)) with the entry, and Key_Shared
    # routes by it instead of reading the key again: it must be protobuf's answer.
    entry = struct.pack(">I", max(0, len(metadata) + skew)) + metadata + b"payload"
    key = plain_key(entry)
    if key is None:
        return
    parsed = parse_metadata(entry)
    if key:
        assert parsed.HasField("partition_key")
    else:  # none, or an empty one: no hash is kept, dispatch works it out
        assert not parsed.partition_key
    kept = plain_key_hash(key)
    if kept:
        assert kept == protobuf_key_hash(Entry(1, 2, entry, 0, 1))
    else:
        assert not key or not key.isascii()


def test_the_official_clients_plain_layouts_take_the_shortcut() -> None:
    # pulsar-client 3.x writes these for a message without and with a key: they are checked
    # without a protobuf parse (an accepted entry is accepted either way; this keeps it fast).
    plain = pb.MessageMetadata(producer_name="standalone-0-17", sequence_id=1 << 40)
    plain.publish_time = 1_796_130_223_052
    keyed = pb.MessageMetadata()
    keyed.CopyFrom(plain)
    keyed.partition_key = "key-17"
    assert plain_key(build_entry(plain, b"x" * 128)) is not None
    assert plain_key(build_entry(keyed, b"x" * 128)) is not None
    keyed.properties.add(key="trace-id", value="0af7651916cd43dd")
    keyed.properties.add(key="", value="")
    assert plain_key(build_entry(keyed, b"x" * 128)) is not None
    keyed.event_time = 5  # any other field: protobuf decides
    assert plain_key(build_entry(keyed, b"x")) is None
    # Nor is a delayed message plain: an entry marked plain on SEND has no delivery time.
    delayed = pb.MessageMetadata()
    delayed.CopyFrom(plain)
    delayed.deliver_at_time = 1_796_130_230_000
    assert plain_key(build_entry(delayed, b"x")) is None
    assert metadata_problem(build_entry(keyed, b"x")) is None


def test_build_entry_layout() -> None:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=2)
    encoded = metadata.SerializeToString()
    assert build_entry(metadata, b"xy") == struct.pack(">I", len(encoded)) + encoded + b"xy"


# --- batches ---------------------------------------------------------------------------


def test_batch_round_trip() -> None:
    messages = [
        (pb.SingleMessageMetadata(partition_key="a", sequence_id=0, payload_size=1), b"1"),
        (pb.SingleMessageMetadata(ordering_key=b"o", sequence_id=1), b""),
        (pb.SingleMessageMetadata(properties=[pb.KeyValue(key="k", value="v")]), b"three"),
    ]
    batch = encode_batch(messages)
    result = split_batch(batch, 3)
    assert [body for _, body in result] == [b"1", b"", b"three"]
    assert [single.payload_size for single, _ in result] == [1, 0, 5]
    assert result[0][0].partition_key == "a"
    assert result[1][0].ordering_key == b"o"
    assert result[2][0].properties[0].value == "v"
    assert not messages[1][0].HasField("payload_size")  # the caller's object is untouched


@pytest.mark.parametrize(
    ("count", "cut", "reason"),
    [
        (3, 0, "ends before message 2 of 3"),
        (1, 0, "bytes left over after 1 batch messages"),
        (2, 1, "batch message 1 claims 2 bytes; 1 are left"),
        (2, 3, "header of batch message 1 runs past the end"),
    ],
)
def test_split_batch_rejects(count: int, cut: int, reason: str) -> None:
    batch = encode_batch([(pb.SingleMessageMetadata(), b"ab"), (pb.SingleMessageMetadata(), b"cd")])
    with pytest.raises(ProtocolError, match=reason):
        split_batch(batch[: len(batch) - cut], count)


def test_split_batch_rejects_a_header_without_payload_size() -> None:
    with pytest.raises(ProtocolError, match="has no payload_size"):
        split_batch(struct.pack(">I", 2) + b"\x12\x00", 1)


# --- hand-rolled encoders --------------------------------------------------------------

EDGE_VALUES = [
    0, 1, 127, 128, 300, 16383, 16384, 100_000, (1 << 21) - 1, 1 << 21, (1 << 32) - 1, 1 << 32,
    1 << 63, U64_MAX,
]  # fmt: skip
uint64s = st.one_of(st.sampled_from(EDGE_VALUES), st.integers(0, U64_MAX))
uint32s = st.one_of(st.sampled_from([0, 1, 127, 128, (1 << 32) - 1]), st.integers(0, (1 << 32) - 1))


def _message_via_protobuf(
    consumer_id: int, ledger: int, entry: int, redelivery_count: int, data: bytes, crc: int
) -> bytes:
    command = T(
        type=T.MESSAGE,
        message=pb.CommandMessage(
            consumer_id=consumer_id,
            message_id=_id(ledger, entry),
            redelivery_count=redelivery_count,
        ),
    )
    return encode_payload_command(command, data, crc)


@settings(max_examples=200, deadline=None)
@given(uint64s, uint64s, uint64s, uint32s, st.binary(max_size=64))
def test_encode_message_matches_protobuf(
    consumer_id: int, ledger: int, entry: int, redelivery_count: int, data: bytes
) -> None:
    header, body = encode_message(consumer_id, ledger, entry, redelivery_count, data, crc32c(data))
    assert body is data
    expected = _message_via_protobuf(
        consumer_id, ledger, entry, redelivery_count, data, crc32c(data)
    )
    assert header + body == expected


# A batch entry: ledger, entry, redelivery count, size (around the copy limit too), ack set.
# A first delivery of a whole entry (count 0, no ack set) takes encode_messages' own path.
_batch_entries = st.lists(
    st.tuples(
        st.sampled_from([0, 7, 1 << 40]),
        st.one_of(uint64s, st.integers(0, 1 << 21)),
        st.one_of(st.just(0), uint32s),
        st.sampled_from([0, 1, 100, COPY_LIMIT, COPY_LIMIT + 1, 3 * COPY_LIMIT]),
        st.one_of(st.none(), st.lists(st.integers(-(1 << 63), (1 << 63) - 1), max_size=3)),
    ),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(uint64s, _batch_entries, st.one_of(st.none(), uint64s))
def test_encode_messages_is_encode_message_back_to_back(
    consumer_id: int,
    batch: list[tuple[int, int, int, int, list[int] | None]],
    epoch: int | None,
) -> None:
    entries = [
        Entry(ledger, entry, bytes([entry % 251]) * size, crc32c(bytes([entry % 251]) * size), 1)
        for ledger, entry, _, size, _ in batch
    ]
    counts = [redelivery for _, _, redelivery, _, _ in batch]
    ack_sets = {entry: words for _, entry, _, _, words in batch if words is not None} or None
    expected = b"".join(
        b"".join(
            encode_message(
                consumer_id,
                entry.ledger_id,
                entry.entry_id,
                count,
                entry.data,
                entry.checksum,
                ack_sets.get(entry.entry_id, ()) if ack_sets else (),
                epoch,
            )
        )
        for entry, count in zip(entries, counts, strict=True)
    )
    buffers = encode_messages(consumer_id, entries, counts, ack_sets, epoch)
    assert b"".join(buffers) == expected
    # Entries over the limit are passed through, not copied; everything else is joined:
    # one buffer before each large entry (its header at least) and one after the last.
    large = [entry.data for entry in entries if len(entry.data) > COPY_LIMIT]
    assert [buffer for buffer in buffers if any(buffer is data for data in large)] == large
    tail = bool(entries) and len(entries[-1].data) <= COPY_LIMIT
    assert len(buffers) == 2 * len(large) + tail


def test_encode_messages_joins_a_batch_of_small_entries_into_one_buffer() -> None:
    entries = [Entry(3, 1000 + i, ENTRY, crc32c(ENTRY), 1) for i in range(50)]
    [buffer] = encode_messages(9, entries, [0] * 50)
    frames = FrameDecoder(LIMIT).feed(buffer)
    assert [f.command.message.message_id.entry_id for f in frames] == list(range(1000, 1050))
    assert all(decode_payload(f.payload or b"").checksum_ok for f in frames)


@settings(max_examples=200, deadline=None)
@given(
    uint64s,
    uint64s,
    st.integers(0, U64_MAX - 20),
    st.lists(st.tuples(uint64s, st.one_of(st.none(), uint64s)), max_size=12),
)
def test_encode_send_receipts_is_encode_send_receipt_back_to_back(
    producer_id: int, ledger: int, first: int, sends: list[tuple[int, int | None]]
) -> None:
    # An unbatched SEND's highest sequence id is its sequence id (None here).
    pairs = [(sequence, sequence if highest is None else highest) for sequence, highest in sends]
    expected = b"".join(
        encode_send_receipt(producer_id, sequence, highest, ledger, first + index)
        for index, (sequence, highest) in enumerate(pairs)
    )
    assert encode_send_receipts(producer_id, ledger, first, pairs) == expected


def test_encode_message_writes_a_zero_redelivery_count() -> None:
    header, _ = encode_message(1, 7, 0, 0, ENTRY, crc32c(ENTRY))
    [frame] = FrameDecoder(LIMIT).feed(header + ENTRY)
    assert frame.command.message.HasField("redelivery_count")
    assert decode_payload(frame.payload or b"").checksum_ok


@settings(max_examples=200, deadline=None)
@given(uint64s, uint64s, uint64s, uint64s, uint64s)
def test_encode_send_receipt_matches_protobuf(
    producer_id: int, sequence_id: int, highest: int, ledger: int, entry: int
) -> None:
    expected = encode_command(
        T(
            type=T.SEND_RECEIPT,
            send_receipt=pb.CommandSendReceipt(
                producer_id=producer_id,
                sequence_id=sequence_id,
                message_id=_id(ledger, entry),
                highest_sequence_id=highest,
            ),
        )
    )
    assert encode_send_receipt(producer_id, sequence_id, highest, ledger, entry) == expected


@settings(max_examples=200, deadline=None)
@given(
    uint64s,
    uint64s,
    st.integers(-(1 << 31), (1 << 31) - 1),
    st.none() | uint64s,
    st.binary(max_size=64),
)
def test_encode_send_matches_protobuf(
    producer_id: int, sequence_id: int, num_messages: int, highest: int | None, data: bytes
) -> None:
    send = pb.CommandSend(
        producer_id=producer_id, sequence_id=sequence_id, num_messages=num_messages
    )
    if highest is not None:
        send.highest_sequence_id = highest
    expected = encode_payload_command(T(type=T.SEND, send=send), data, crc32c(data))
    header, body = encode_send(producer_id, sequence_id, num_messages, data, highest)
    assert header + body == expected


@settings(max_examples=200, deadline=None)
@given(uint64s, uint32s)
def test_encode_flow_matches_protobuf(consumer_id: int, permits: int) -> None:
    expected = encode_command(
        T(type=T.FLOW, flow=pb.CommandFlow(consumer_id=consumer_id, message_permits=permits))
    )
    assert encode_flow(consumer_id, permits) == expected


@settings(max_examples=200, deadline=None)
@given(uint64s)
def test_encode_success_matches_protobuf(request_id: int) -> None:
    expected = encode_command(T(type=T.SUCCESS, success=pb.CommandSuccess(request_id=request_id)))
    assert encode_success(request_id) == expected


@settings(max_examples=200, deadline=None)
@given(uint64s, uint32s)
def test_encode_topic_partitions_matches_protobuf(request_id: int, partitions: int) -> None:
    response = pb.CommandPartitionedTopicMetadataResponse(
        request_id=request_id,
        partitions=partitions,
        response=pb.CommandPartitionedTopicMetadataResponse.Success,
    )
    expected = encode_command(
        T(type=T.PARTITIONED_METADATA_RESPONSE, partitioned_metadata_response=response)
    )
    assert encode_topic_partitions(request_id, partitions) == expected


@settings(max_examples=200, deadline=None)
@given(uint64s, st.text(max_size=200), st.text(max_size=200))
def test_encode_lookup_connect_matches_protobuf(request_id: int, url: str, tls: str) -> None:
    response = pb.CommandLookupTopicResponse(
        request_id=request_id, response=pb.CommandLookupTopicResponse.Connect, authoritative=True
    )
    if url:  # an empty URL is left out, as the connection leaves out a listener's missing one
        response.broker_service_url = url
    if tls:
        response.broker_service_url_tls = tls
    expected = encode_command(T(type=T.LOOKUP_RESPONSE, lookup_response=response))
    assert encode_lookup_connect(request_id, url, tls) == expected


@settings(max_examples=300, deadline=None)
@given(
    uint64s,
    st.text(max_size=200),
    st.integers(-(1 << 63), (1 << 63) - 1),
    st.one_of(st.none(), st.binary(max_size=20)),
    st.one_of(st.none(), uint64s),
    st.booleans(),
)
def test_encode_producer_success_matches_protobuf(
    request_id: int,
    name: str,
    last_sequence_id: int,
    schema_version: bytes | None,
    topic_epoch: int | None,
    ready: bool,
) -> None:
    success = pb.CommandProducerSuccess(
        request_id=request_id, producer_name=name, last_sequence_id=last_sequence_id
    )
    if schema_version is not None:
        success.schema_version = schema_version
    if topic_epoch is not None:
        success.topic_epoch = topic_epoch
    if not ready:
        success.producer_ready = False
    expected = encode_command(T(type=T.PRODUCER_SUCCESS, producer_success=success))
    got = encode_producer_success(
        request_id, name, last_sequence_id, schema_version, topic_epoch, ready=ready
    )
    assert got == expected


def test_table_varints_match_protobuf_across_their_whole_range() -> None:
    # The encoders look varints of values below 2**21 up in tables: check every two-byte
    # value and a stride through the three-byte ones, against protobuf's own encoding.
    values = itertools.chain(range(0x4100), range(0x4000, (1 << 21) + 0x100, 61))
    for value in values:
        expected = encode_command(
            T(type=T.FLOW, flow=pb.CommandFlow(consumer_id=value, message_permits=value))
        )
        assert encode_flow(value, value) == expected, value


@settings(max_examples=200, deadline=None)
@given(uint64s, st.lists(st.tuples(uint64s, uint64s), max_size=5), st.booleans())
def test_encode_ack_matches_protobuf(
    consumer_id: int, positions: list[tuple[int, int]], cumulative: bool
) -> None:
    ack = pb.CommandAck(
        consumer_id=consumer_id,
        ack_type=pb.CommandAck.Cumulative if cumulative else pb.CommandAck.Individual,
        message_id=[_id(ledger, entry) for ledger, entry in positions],
    )
    assert encode_ack(consumer_id, positions, cumulative) == encode_command(T(type=T.ACK, ack=ack))


@pytest.mark.parametrize(
    "call",
    [
        lambda: encode_flow(-1, 1),
        lambda: encode_flow(1, 1 << 32),
        lambda: encode_message(1, 1 << 64, 0, 0, b"", 0),
        lambda: encode_send(1, 1, 1 << 31, b""),
    ],
    ids=["negative-id", "permits-over-uint32", "ledger-over-uint64", "num-messages-over-int32"],
)
def test_fast_encoders_reject_out_of_range_values(call: object) -> None:
    with pytest.raises(ValueError, match="out of range"):
        call()  # type: ignore[operator]


def test_encode_payload_command_rejects_commands_without_payload() -> None:
    with pytest.raises(ValueError, match="FLOW carries no payload"):
        encode_payload_command(SAMPLES[9], ENTRY, None)


def test_encode_payload_command_without_checksum() -> None:
    frame = encode_payload_command(SAMPLES[4], ENTRY, None)
    [decoded] = FrameDecoder(LIMIT).feed(frame)
    assert decoded.payload == ENTRY


# --- fuzzing ---------------------------------------------------------------------------


def _decode_in_chunks(data: bytes, cuts: list[int]) -> list[Frame] | str:
    decoder = FrameDecoder(4096)
    frames: list[Frame] = []
    bounds = sorted({0, len(data), *(cut % (len(data) + 1) for cut in cuts)})
    try:
        for start, end in itertools.pairwise(bounds):
            frames += decoder.feed(data[start:end])
    except ProtocolError as exc:
        return f"error: {exc.reason}"
    return frames


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.lists(st.integers(0, 400), max_size=8))
def test_arbitrary_bytes_decode_or_raise_protocol_error(data: bytes, cuts: list[int]) -> None:
    result = _decode_in_chunks(data, cuts)
    assert result == _decode_in_chunks(data, [])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(range(len(SAMPLES))), min_size=1, max_size=4),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4),
    st.lists(st.integers(0, 2000), max_size=8),
)
def test_corrupted_frames_decode_or_raise_protocol_error(
    picks: list[int], flips: list[tuple[int, int]], cuts: list[int]
) -> None:
    # Valid frames with a few bytes replaced reach deeper into decoding than random bytes.
    data = bytearray(b"".join(_frame_bytes(SAMPLES[index]) for index in picks))
    for position, value in flips:
        data[position % len(data)] = value
    result = _decode_in_chunks(bytes(data), cuts)
    assert result == _decode_in_chunks(bytes(data), [])
    if not flips:
        assert result == [Frame(SAMPLES[i], _payload_of(SAMPLES[i])) for i in picks]


# plain_key is the walk when compiled and the regexes from source (_payload.COMPILED).
_uint64s = st.integers(0, (1 << 64) - 1)
_short_text = st.text(max_size=12)


@settings(max_examples=500, deadline=None)
@given(
    st.text(max_size=20),
    _uint64s,
    _uint64s,
    st.dictionaries(_short_text, _short_text, max_size=3),
    st.none() | st.text(max_size=20),
    st.none() | _uint64s,
)
def test_plain_key_by_walk_and_by_regex_agree_on_metadata_protobuf_wrote(
    name: str,
    sequence_id: int,
    publish_time: int,
    properties: dict[str, str],
    key: str | None,
    event_time: int | None,
) -> None:
    metadata = pb.MessageMetadata(
        producer_name=name, sequence_id=sequence_id, publish_time=publish_time
    )
    for property_key, value in properties.items():
        metadata.properties.add(key=property_key, value=value)
    if key is not None:
        metadata.partition_key = key
    if event_time is not None:
        metadata.event_time = event_time
    entry = build_entry(metadata, b"x")
    found = plain_key_by_walk(entry)
    assert found == plain_key_by_regex(entry)
    if found:
        assert found == metadata.partition_key.encode()


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=60), st.binary(max_size=4))
def test_plain_key_by_walk_and_by_regex_agree_on_any_bytes(tail: bytes, payload: bytes) -> None:
    metadata = b"\x0a\x01p" + tail
    entry = struct.pack(">I", len(metadata)) + metadata + payload
    assert plain_key_by_walk(entry) == plain_key_by_regex(entry)
    assert plain_key_by_walk(entry[:5]) == plain_key_by_regex(entry[:5])


@settings(max_examples=300, deadline=None)
@given(_uint64s, _uint64s, _uint64s, st.text(max_size=20))
def test_varint_field_reads_what_protobuf_wrote_first_or_last(
    first: int, second: int, sequence_id: int, name: str
) -> None:
    # One walker serves the command peeks (the last value, protobuf's rule) and the stored
    # entries' metadata reads (_scan: the first, within the metadata's bounds).
    one = pb.MessageMetadata(producer_name=name, sequence_id=sequence_id, publish_time=first)
    two = pb.MessageMetadata(producer_name=name, sequence_id=sequence_id, publish_time=second)
    both = one.SerializeToString() + two.SerializeToString()  # publish_time twice
    assert varint_field(both, 3) == pb.MessageMetadata.FromString(both).publish_time == second
    assert varint_field(both, 3, first=True) == first
    entry = build_entry(one, b"payload")
    end = 4 + struct.unpack_from(">I", entry)[0]
    assert varint_field(entry, 2, 4, end, first=True) == sequence_id
    assert varint_field(entry, 19, 4, end) is None


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=4, max_size=40), st.data())
def test_read_u32_reads_what_struct_reads(data: bytes, draw: st.DataObject) -> None:
    # The byte reads that replace struct calls on the compiled SEND path (frame header,
    # checksum and metadata sizes).
    at = draw.draw(st.integers(0, len(data) - 4))
    assert read_u32(data, at) == struct.unpack_from(">I", data, at)[0]
