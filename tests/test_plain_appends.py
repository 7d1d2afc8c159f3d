"""brokerlet.producers.appends: the connection's per-SEND loop (compiled with the codec).

Every SEND is given a place in its producer's items, in order; the plain ones are filled,
the others are left (`UNFILLED`) with their frame for the connection. Checked against what
the codec itself says of each SEND, for any mix of producers and kinds.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from brokerlet.keyshared import plain_key_hash
from brokerlet.producers.appends import UNFILLED, plain_appends
from brokerlet.storage.ledger import PLAIN_UNHASHED
from brokerlet.transport.protocol import (
    Frame,
    FrameDecoder,
    build_entry,
    crc32c,
    encode_payload_command,
    pb,
)

T = pb.BaseCommand
MAX_SIZE = 1000
KINDS = ["plain", "keyed", "bad checksum", "no checksum", "too big", "other layout", "no messages"]


def _send_frame(producer_id: int, sequence_id: int, kind: str) -> Frame:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=sequence_id, publish_time=1)
    if kind == "keyed":
        metadata.partition_key = f"key-{sequence_id % 3}"
    if kind == "other layout":
        metadata.event_time = 5  # a field the plain layout has not
    entry = build_entry(metadata, b"x" * (2 * MAX_SIZE if kind == "too big" else 10))
    send = pb.CommandSend(producer_id=producer_id, sequence_id=sequence_id)
    if kind == "no messages":
        send.num_messages = 0
    checksum = None if kind == "no checksum" else crc32c(entry) ^ (kind == "bad checksum")
    raw = encode_payload_command(T(type=T.SEND, send=send), entry, checksum)
    [frame] = FrameDecoder(1 << 20).feed(raw)
    assert frame.send is not None
    return frame


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from(KINDS)), min_size=1, max_size=12))
def test_each_send_has_its_place_and_only_plain_ones_are_filled(
    sends: list[tuple[int, str]],
) -> None:
    frames = [_send_frame(producer, index, kind) for index, (producer, kind) in enumerate(sends)]
    by_producer, unusual = plain_appends(frames, MAX_SIZE)

    # Each producer's SENDs in their order, the producers in order of their first SEND.
    assert list(by_producer) == list(dict.fromkeys(producer for producer, _ in sends))
    for producer, items in by_producer.items():
        assert len(items) == sum(1 for p, _ in sends if p == producer)
    left = {id(frame) for _, _, frame in unusual}
    positions = dict.fromkeys(by_producer, 0)
    for frame, (producer, kind) in zip(frames, sends, strict=True):
        items = by_producer[producer]
        item = items[positions[producer]]
        positions[producer] += 1
        if kind in ("plain", "keyed"):
            assert id(frame) not in left
            sequence_id, highest, entry, refusal = item
            assert (sequence_id, highest, refusal) == (frame.send[1], frame.send[1], None)
            assert frame.section is not None
            data, checksum, _ = frame.section
            key = f"key-{sequence_id % 3}".encode() if kind == "keyed" else b""
            key_hash = plain_key_hash(key) if key else PLAIN_UNHASHED
            assert entry == (data, checksum, 1, key_hash)
        else:
            assert item == UNFILLED
            assert id(frame) in left
    for items, index, _ in unusual:
        assert items[index] == UNFILLED
        assert any(items is kept for kept in by_producer.values())
    assert [frame for _, _, frame in unusual] == [
        frame
        for frame, (_, kind) in zip(frames, sends, strict=True)
        if kind not in ("plain", "keyed")
    ]
