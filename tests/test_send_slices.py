"""A chunk of many SENDs is appended in bounded slices (issue 19): receipts stay complete
and in order per producer; the reader takes turns after full receives, not after waits."""

from __future__ import annotations

import uuid

import pytest

from brokerlet import Broker
from brokerlet.actors._loop import take_turn
from brokerlet.actors.connection import SEND_SLICE
from brokerlet.testing.rawclient import RawClient
from brokerlet.transport import server
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


class _Turns:
    """Counts the reader's turns (server.take_turn) and takes them."""

    def __init__(self) -> None:
        self.taken = 0

    def __call__(self) -> None:
        self.taken += 1
        take_turn()


def test_a_reader_woken_by_a_lone_request_takes_no_turn(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Requests 3 ms apart, the low-rate shape: the reader waited for each, so each is the
    # start of a run. Its slice was once measured from its last turn and had always expired.
    turns = _Turns()
    monkeypatch.setattr(server, "take_turn", turns)
    with RawClient(broker.address) as client:
        client.handshake()
        for _ in range(20):
            # 3 ms with nothing from the broker: the reader waits in recv meanwhile.
            with pytest.raises(TimeoutError):
                client.recv_frame(timeout=0.003)
            client.ping()
    # The old rule took a turn for every one of them. The slice is wall time, so a thread the
    # OS preempts for a millisecond mid-request may still take one now and then.
    assert turns.taken <= 4


def test_a_reader_fed_full_buffers_takes_turns(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    turns = _Turns()
    monkeypatch.setattr(server, "take_turn", turns)
    count = 2000
    with RawClient(broker.address) as client:
        client.handshake()
        client.create_producer(_topic(), 1)
        client.send_raw(b"".join(client.send_frame(1, i, b"x" * 100) for i in range(count)))
        for _ in range(count):
            client.expect(T.SEND_RECEIPT)
    # About 250 KiB arrived, much of it in full 16 KiB receives, each followed by a turn.
    assert turns.taken >= 3
