"""A chunk of many SENDs is appended in bounded slices (issue 19): receipts stay complete
and in order per producer."""

from __future__ import annotations

import uuid

from brokerlet import Broker
from brokerlet.actors.connection import SEND_SLICE
from brokerlet.testing.rawclient import RawClient
from brokerlet.transport.protocol import pb

T = pb.BaseCommand


def _topic() -> str:
    return f"persistent://public/default/slices-{uuid.uuid4().hex[:8]}"


def test_many_sends_in_one_write_are_all_receipted_in_order(broker: Broker) -> None:
    count = SEND_SLICE * 5 + 7
    with RawClient(broker.address) as client:
        client.handshake()
        client.create_producer(_topic(), 1)
        client.create_producer(_topic(), 2)
        # Two producers interleaved in runs, so slices cut through and between runs.
        frames = [
            client.send_frame(1 if (index // 50) % 2 == 0 else 2, index, b"m%d" % index)
            for index in range(count)
        ]
        client.send_raw(b"".join(frames))
        receipts = [client.expect(T.SEND_RECEIPT).send_receipt for _ in range(count)]
    for producer_id in (1, 2):
        mine = [r for r in receipts if r.producer_id == producer_id]
        sequences = [r.sequence_id for r in mine]
        assert sequences == sorted(sequences)
        entry_ids = [r.message_id.entry_id for r in mine]
        assert entry_ids == list(range(len(mine)))
    assert sorted(r.sequence_id for r in receipts) == list(range(count))
