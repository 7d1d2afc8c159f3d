"""The wire-format sticky-key walk against the protobuf path: for any entry, well formed or
not, Key_Shared routes it by the same hash (or fails the same way) whichever path reads it,
and the walk itself answers for what the official client writes."""

from __future__ import annotations

import base64
import struct

from hypothesis import example, given, settings
from hypothesis import strategies as st

from brokerlet.config import Settings
from brokerlet.dispatch.key_shared import (
    NO_KEY_HASH,
    KeySharedRules,
    entry_key_hash,
    protobuf_key_hash,
)
from brokerlet.dispatch.replay import ReplaySet
from brokerlet.keyshared import KeySharedMeta, plain_key_hash
from brokerlet.storage.ledger import PLAIN_UNHASHED, Entry
from brokerlet.transport.protocol import ProtocolError, build_entry, pb, plain_key, sticky_key

U64_MAX = (1 << 64) - 1
EDGES = [0, 1, 127, 128, 16383, 16384, (1 << 32) - 1, (1 << 63) - 1, 1 << 63, U64_MAX]
uint64s = st.one_of(st.sampled_from(EDGES), st.integers(0, U64_MAX))
ascii_text = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)
any_text = st.one_of(ascii_text, st.text(max_size=20))
b64_keys = st.binary(max_size=30).map(lambda raw: base64.b64encode(raw).decode())
partition_keys = st.one_of(
    ascii_text, any_text, b64_keys, b64_keys.map(lambda k: k.rstrip("=")), st.just("")
)


def _outcome(read: object, data: bytes) -> object:
    """What a key-hash function makes of an entry: its hash, or the kind of failure."""
    entry = Entry(1, 0, data, 0, 1)
    try:
        return read(entry)  # type: ignore[operator]
    except ProtocolError:
        return "ProtocolError"
    except Exception as error:  # the protobuf path's own failures must be kept too
        return type(error).__name__


def _entry(metadata: bytes, payload: bytes = b"payload") -> bytes:
    return struct.pack(">I", len(metadata)) + metadata + payload


@st.composite
def metadatas(draw: st.DrawFn) -> pb.MessageMetadata:
    metadata = pb.MessageMetadata(
        producer_name=draw(any_text),
        sequence_id=draw(uint64s),
        publish_time=draw(uint64s),
    )
    for key, value in draw(st.lists(st.tuples(any_text, any_text), max_size=3)):
        metadata.properties.add(key=key, value=value)
    if draw(st.booleans()):
        metadata.partition_key = draw(partition_keys)
    if draw(st.booleans()):
        metadata.partition_key_b64_encoded = draw(st.booleans())
    if draw(st.integers(0, 3)) == 0:
        metadata.ordering_key = draw(st.binary(max_size=20))
    if draw(st.booleans()):
        metadata.event_time = draw(uint64s)
    if draw(st.integers(0, 3)) == 0:
        metadata.deliver_at_time = draw(st.integers(-(1 << 63), (1 << 63) - 1))
    if draw(st.integers(0, 3)) == 0:
        metadata.num_messages_in_batch = draw(st.integers(-(1 << 31), (1 << 31) - 1))
    if draw(st.integers(0, 3)) == 0:
        metadata.uuid = draw(any_text)
    if draw(st.integers(0, 7)) == 0:  # not initialised: the protobuf path refuses it
        metadata.ClearField(draw(st.sampled_from(["producer_name", "sequence_id", "publish_time"])))
    if draw(st.integers(0, 3)) == 0:
        metadata.compression = draw(st.sampled_from([0, 1, 2]))
        metadata.uncompressed_size = draw(st.integers(0, (1 << 32) - 1))
    return metadata


@settings(max_examples=400, deadline=None)
@given(metadatas(), st.binary(max_size=8))
def test_well_formed_metadata_hashes_alike_on_both_paths(
    metadata: pb.MessageMetadata, payload: bytes
) -> None:
    data = _entry(metadata.SerializePartialToString(), payload)
    assert _outcome(entry_key_hash, data) == _outcome(protobuf_key_hash, data)


@settings(max_examples=200, deadline=None)
@given(ascii_text, uint64s.filter(lambda n: n < 1 << 63), st.integers(0, (1 << 63) - 1))
@example("brokerlet-0", 5, 1796130223057)
def test_the_walk_answers_for_what_the_official_client_writes(
    name: str, sequence_id: int, publish_time: int
) -> None:
    # Layouts as pulsar-client 3.x serialises them (captured from a real producer): keyed,
    # keyless, and with properties, event time and an ordering key.
    plain = pb.MessageMetadata(
        producer_name=name, sequence_id=sequence_id, publish_time=publish_time
    )
    keyed = pb.MessageMetadata()
    keyed.CopyFrom(plain)
    keyed.partition_key = "key-17"
    rich = pb.MessageMetadata()
    rich.CopyFrom(keyed)
    rich.properties.add(key="a", value="b")
    rich.event_time = 5
    rich.ordering_key = b"ok"
    expected = [b"key-17", f"{name}-{sequence_id}".encode(), b"ok"]
    assert [sticky_key(build_entry(m, b"x" * 128)) for m in (keyed, plain, rich)] == expected


_FIELD_BYTES = st.sampled_from(
    [
        b"\x0a\x01q",  # another producer_name
        b"\x10\x07",  # another sequence_id
        b"\x32\x02k2",  # another partition_key
        b"\x32\x02\xff\xfe",  # a partition key that is not UTF-8
        b"\x30\x05",  # partition_key as a varint: an unknown field to protobuf
        b"\x88\x01\x01",  # partition_key_b64_encoded
        b"\x88\x01\x80\x80\x80\x80\x10",  # ... true by a long varint
        b"\x92\x01\x00",  # an empty ordering key
        b"\x92\x01\x03abc",
        b"\x22\x03\x0a\x01a",  # a property without its value
        b"\x22\x06\x0a\x01a\x12\x01b",
        b"\x22\x08\x0a\x01a\x12\x01b\x18\x01",  # a property with an unknown field
        b"\x0b",  # a group start
        b"\x07",  # field 0
        b"\x1f",  # wire type 7
        b"\xf8\xff\xff\x7f\x01",  # a field number needing a long tag
        b"\x49\x00\x00\x00\x00\x00\x00\x00\x00",  # fixed64 unknown
        b"\x4d\x00\x00\x00\x00",  # fixed32 unknown
        b"\x10\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f",  # ten bytes: protobuf keeps 64 bits
        b"\x32\x80\x01" + b"k" * 128,  # a two-byte length
        b"\x32\x05abc",  # runs past the end
    ]
)


@settings(max_examples=600, deadline=None)
@given(
    metadatas(),
    st.lists(st.tuples(st.integers(0, 200), _FIELD_BYTES | st.binary(max_size=6)), max_size=4),
    st.none() | st.integers(-8, 8),
)
@example(pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1), [], 0)
@example(  # a property without its value fails the required-field check
    pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1),
    [(200, b"\x22\x03\x0a\x01a")],
    None,
)
@example(  # a keyless entry whose sequence id needs ten bytes
    pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1),
    [(200, b"\x10\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f")],
    None,
)
@example(  # a base64 key flagged by a long varint: still true
    pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1, partition_key="a2V5"),
    [(200, b"\x88\x01\x80\x80\x80\x80\x10")],
    None,
)
@example(  # a key protobuf hands back as bytes, last in the common layout
    pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1),
    [(200, b"\x32\x02\xff\xfe")],
    None,
)
@example(  # ... and after a property, where the full walk reads it
    pb.MessageMetadata(
        producer_name="p",
        sequence_id=1,
        publish_time=1,
        properties=[pb.KeyValue(key="a", value="b")],
    ),
    [(200, b"\x32\x02\xff\xfe")],
    None,
)
def test_damaged_and_odd_metadata_routes_alike_on_both_paths(
    metadata: pb.MessageMetadata, edits: list[tuple[int, bytes]], size_error: int | None
) -> None:
    raw = metadata.SerializePartialToString()
    for position, inserted in edits:
        at = min(position, len(raw))
        raw = raw[:at] + inserted + raw[at:]
    data = _entry(raw)
    if size_error is not None:
        data = struct.pack(">I", max(0, len(raw) + size_error)) + data[4:]
    assert _outcome(entry_key_hash, data) == _outcome(protobuf_key_hash, data)


def test_short_and_oversized_entries_fall_back() -> None:
    for data in (b"", b"\x00\x00", b"\x00\x00\x00\x09\x0a", _entry(b"")):
        assert sticky_key(data) is None
        assert _outcome(protobuf_key_hash, data) == "ProtocolError"


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["k1", "k2", "k3", "", "ké"]) | st.none(), st.booleans()),
        max_size=20,
    ),
    st.sets(st.integers(0, 19)),
)
def test_a_read_batch_hashes_each_entry_as_alone(
    keys: list[tuple[str | None, bool]], replayed: set[int]
) -> None:
    # Some entries carry the hash their SEND's check kept (as read from memory or the tail
    # cache), some none (as read back from a segment), and a replay read may know some
    # from the replay set: every one routes as protobuf says.
    rules = KeySharedRules(KeySharedMeta(), Settings(), lambda: None)
    entries = []
    for entry_id, (key, sent_now) in enumerate(keys):
        if key is None:
            data = _entry(b"\x0a\xff")  # unreadable: routed as having no key
        else:
            metadata = pb.MessageMetadata(
                producer_name="p", sequence_id=entry_id, publish_time=1, partition_key=key
            )
            data = build_entry(metadata, b"x")
        key_read = plain_key(data)
        kept = 0  # as read back from a segment
        if sent_now and key_read is not None:  # as ConnectionActor._sends keeps it
            kept = (plain_key_hash(key_read) if key_read else 0) or PLAIN_UNHASHED
        entries.append(Entry(1, entry_id, data, 0, 1, kept))
    expected = [
        NO_KEY_HASH if key is None else protobuf_key_hash(entry)
        for (key, _), entry in zip(keys, entries, strict=True)
    ]
    assert rules.key_hashes(entries) == expected
    replay = ReplaySet()
    for entry_id in sorted(replayed & set(range(len(entries)))):
        replay.add(entry_id, expected[entry_id])
    assert rules.key_hashes(entries, replay) == expected
