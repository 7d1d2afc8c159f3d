"""Failover's ACTIVE_CONSUMER_CHANGE, ack receipts and CONSUMER_STATS (issue 13).

pulsar-client 3.13 (Python) exposes neither consumer event listeners, ack receipts nor
consumer stats (its ConsumerConfiguration has no event listener or ack-receipt option), so
these speak the protocol the C++ client underneath uses: ``ConsumerImpl::activeConsumerChanged``
fires the listener on ACTIVE_CONSUMER_CHANGE, ``AckGroupingTracker`` completes an
acknowledge with receipt on ACK_RESPONSE, ``getBrokerConsumerStatsAsync`` on
CONSUMER_STATS_RESPONSE.
"""

from __future__ import annotations

import struct
import threading
import time

import gevent.event
import pytest
from google.protobuf import unknown_fields

from brokerlet import Broker
from brokerlet.actors.dispatcher import Dispatcher
from brokerlet.actors.messages import RemoveConsumer
from brokerlet.testing.rawclient import RawClient
from brokerlet.transport.protocol import Frame, FrameDecoder, build_entry, encode_message, pb
from tests.dispatch_harness import failover_active

T = pb.BaseCommand


def _subscribe(raw: RawClient, topic: str, consumer_id: int, name: str, request_id: int) -> None:
    raw.send_command(
        T(
            type=T.SUBSCRIBE,
            subscribe=pb.CommandSubscribe(
                topic=topic,
                subscription="fo",
                sub_type=pb.CommandSubscribe.Failover,
                consumer_id=consumer_id,
                request_id=request_id,
                consumer_name=name,
            ),
        )
    )


def _frames_until(raw: RawClient, done: object, timeout: float = 5.0) -> list[Frame]:
    frames: list[Frame] = []
    deadline = time.monotonic() + timeout
    while not done(frames):  # type: ignore[operator]
        assert time.monotonic() < deadline, f"gave up waiting; got {[f.command for f in frames]}"
        frames.append(raw.recv_frame(timeout=max(0.01, deadline - time.monotonic())))
    return frames


def _changes(frames: list[Frame]) -> list[tuple[int, bool]]:
    return [
        (f.command.active_consumer_change.consumer_id, f.command.active_consumer_change.is_active)
        for f in frames
        if f.command.type == T.ACTIVE_CONSUMER_CHANGE
    ]


def test_failover_tells_every_consumer_when_the_active_one_changes(
    broker: Broker, topic: str
) -> None:
    # The one the ring picks (AbstractDispatcherSingleActiveConsumer) joins second.
    taker = failover_active(topic, ["one", "two"])
    first_name = "two" if taker == "one" else "one"
    with RawClient(broker.address, timeout=5) as a, RawClient(broker.address, timeout=5) as b:
        a.handshake()
        b.handshake()
        _subscribe(a, topic, 1, first_name, 10)
        frames = _frames_until(
            a, lambda fs: _changes(fs) and any(f.command.type == T.SUCCESS for f in fs)
        )
        assert _changes(frames) == [(1, True)]  # on subscribe: it is the active one
        # The ring's pick takes over, and both hear of it.
        _subscribe(b, topic, 2, taker, 11)
        frames_b = _frames_until(
            b, lambda fs: _changes(fs) and any(f.command.type == T.SUCCESS for f in fs)
        )
        assert _changes(frames_b) == [(2, True)]
        assert _changes(_frames_until(a, _changes)) == [(1, False)]
        b.close_consumer(2)
        assert _changes(_frames_until(a, _changes)) == [(1, True)]  # back to the first


@pytest.mark.parametrize("consistent_hashing", [False, True])
def test_a_partitions_active_consumer_follows_its_index_unless_hashing_is_set(
    consistent_hashing: bool,
) -> None:
    # activeConsumerFailoverConsistentHashing (AbstractDispatcherSingleActiveConsumer): a
    # partition's pick is its index modulo the consumers, or the ring with the setting.
    names = ["a", "b"]
    topic = next(  # a partition whose ring pick is not its index's
        t
        for i in range(1, 100)
        if failover_active(t := f"persistent://public/default/fo-ring-partition-{i}", names)
        != names[i % 2]
    )
    index = int(topic.rsplit("-", 1)[1])
    expected = failover_active(topic, names) if consistent_hashing else names[index % 2]
    with (
        Broker(port=0, active_consumer_failover_consistent_hashing=consistent_hashing) as broker,
        RawClient(broker.address, timeout=5) as client,
    ):
        client.handshake()
        for consumer_id, name in enumerate(names, start=1):
            client.subscribe(
                topic, "fo", consumer_id, sub_type=pb.CommandSubscribe.Failover, consumer_name=name
            )
        stats = broker.topic_stats(topic)
        assert stats is not None
        active = [
            c["consumerName"] for c in stats["subscriptions"]["fo"]["consumers"] if c["isActive"]
        ]
        assert active == [expected]


HOLD_MS = 400


def test_failover_holds_a_new_active_consumer_so_the_old_ones_acks_land_first(
    topic: str,
) -> None:
    # PersistentDispatcherSingleActiveConsumer.scheduleReadOnActiveConsumer: after each
    # change (the first consumer's too) the read and the notices wait
    # activeConsumerFailoverDelayTimeMillis; an ack the old active consumer sends
    # meanwhile keeps its message from going out again (PR #807's duplicates).
    taker = failover_active(topic, ["one", "two"])
    first_name = "two" if taker == "one" else "one"
    with (
        Broker(port=0, active_consumer_failover_delay_time_millis=HOLD_MS) as broker,
        RawClient(broker.address, timeout=5) as producer,
        RawClient(broker.address, timeout=5) as a,
        RawClient(broker.address, timeout=5) as b,
    ):
        for client in (producer, a, b):
            client.handshake()
        producer.create_producer(topic, 1)
        producer.produce(1, 0, b"m0")
        subscribed = time.monotonic()
        a.subscribe(topic, "fo", 1, sub_type=pb.CommandSubscribe.Failover, consumer_name=first_name)
        a.flow(1, 10)
        [m0] = a.receive(1, 1)
        assert m0.payload == b"m0"
        assert time.monotonic() - subscribed >= HOLD_MS / 1000  # the first consumer waits too

        b.subscribe(topic, "fo", 2, sub_type=pb.CommandSubscribe.Failover, consumer_name=taker)
        joined = time.monotonic()
        b.flow(2, 10)
        a.ack(1, [m0.entry_id], m0.ledger_id)  # in flight as the other takes over
        producer.produce(1, 1, b"m1")
        [first_on_b] = b.receive(2, 1, timeout=5)
        waited = time.monotonic() - joined
        assert first_on_b.payload == b"m1", "m0 was acked during the hold: not to come again"
        assert waited >= HOLD_MS / 1000
        changes = _changes(_frames_until(a, _changes))
        assert changes == [(1, False)]


def _ack_with_receipt(consumer_id: int, entry_id: int, request_id: int, ledger_id: int) -> T:
    return T(
        type=T.ACK,
        ack=pb.CommandAck(
            consumer_id=consumer_id,
            ack_type=pb.CommandAck.Individual,
            message_id=[pb.MessageIdData(ledger_id=ledger_id, entry_id=entry_id)],
            request_id=request_id,
        ),
    )


def _body(frame: Frame) -> bytes:
    fields = list(unknown_fields.UnknownFieldSet(frame.command))
    assert len(fields) == 1
    data: bytes = fields[0].data
    return data


def _fields(body: bytes) -> dict[int, int | bytes]:
    """Decode a flat protobuf body (varints, fixed64 as raw bytes, strings)."""
    out: dict[int, int | bytes] = {}
    pos = 0
    while pos < len(body):
        tag, pos = _varint(body, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            out[number], pos = _varint(body, pos)
        elif wire == 1:
            out[number] = body[pos : pos + 8]
            pos += 8
        else:
            size, pos = _varint(body, pos)
            out[number] = body[pos : pos + size]
            pos += size
    return out


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def test_each_ack_with_a_request_id_gets_its_receipt(broker: Broker, topic: str) -> None:
    with RawClient(broker.address, timeout=5) as raw:
        raw.handshake()
        raw.create_producer(topic, 1)
        raw.subscribe(topic, "sub", 1)
        ids = [raw.produce(1, i, f"m{i}".encode()) for i in range(3)]
        raw.flow(1, 10)
        messages = raw.receive(1, 3)
        ledger = messages[0].ledger_id
        for request_id, entry_id in enumerate(ids, start=100):
            raw.send_command(_ack_with_receipt(1, entry_id, request_id, ledger))
            response = _fields(_body(raw.expect_frame(T.ACK_RESPONSE)))
            assert response[1] == 1
            assert response[6] == request_id
            assert 4 not in response  # no error
        # Acked already: acked again harmlessly, answered OK as Pulsar's cursor does.
        raw.send_command(_ack_with_receipt(1, ids[0], 200, ledger))
        assert 4 not in _fields(_body(raw.expect_frame(T.ACK_RESPONSE)))
        # An unknown consumer: an error in the receipt, not a disconnect.
        raw.send_command(_ack_with_receipt(99, ids[0], 201, ledger))
        error = _fields(_body(raw.expect_frame(T.ACK_RESPONSE)))
        assert (error[1], error[4], error[6]) == (99, pb.ConsumerNotFound, 201)
        raw.ping()
    stats = broker.topic_stats(topic)
    assert stats is not None
    assert stats["subscriptions"]["sub"]["msgBacklog"] == 0


def test_a_subscribe_for_a_consumer_id_in_use_is_answered_success(
    broker: Broker, topic: str
) -> None:
    # ServerCnx.handleSubscribe: a client whose SUBSCRIBE timed out sends it again; the
    # consumer made by the first is kept, and the second is answered SUCCESS.
    with RawClient(broker.address, timeout=5) as raw:
        raw.handshake()
        raw.create_producer(topic, 1)
        raw.subscribe(topic, "sub", 1)
        raw.subscribe(topic, "sub", 1)
        raw.subscribe(topic, "another", 1)  # not looked at, as in Pulsar
        raw.produce(1, 0, b"once")
        raw.flow(1, 10)
        assert [m.payload for m in raw.receive(1, 1)] == [b"once"]
        # Read while the connection is open: closing it removes the consumer.
        stats = broker.topic_stats(topic)
    assert stats is not None
    assert list(stats["subscriptions"]) == ["sub"]
    assert len(stats["subscriptions"]["sub"]["consumers"]) == 1


def _consumer_stats(request_id: int, consumer_id: int) -> bytes:
    body = bytes([0x08, request_id, 0x20, consumer_id])
    key = (T.CONSUMER_STATS << 3) | 2
    command = bytes([0x08, T.CONSUMER_STATS, key & 0x7F | 0x80, key >> 7, len(body)]) + body
    return struct.pack(">II", len(command) + 4, len(command)) + command


def test_consumer_stats_answers_the_consumers_real_figures(broker: Broker, topic: str) -> None:
    with RawClient(broker.address, timeout=5) as raw:
        raw.handshake()
        raw.create_producer(topic, 1)
        raw.send_command(
            T(
                type=T.SUBSCRIBE,
                subscribe=pb.CommandSubscribe(
                    topic=topic,
                    subscription="sub",
                    sub_type=pb.CommandSubscribe.Shared,
                    consumer_id=3,
                    request_id=5,
                    consumer_name="stats-me",
                    initial_position=pb.CommandSubscribe.Earliest,
                ),
            )
        )
        raw.expect(T.SUCCESS)
        for i in range(4):
            raw.produce(1, i, b"x")
        raw.flow(3, 10)
        raw.receive(3, 4)
        raw.send_raw(_consumer_stats(7, 3))
        stats = _fields(_body(raw.expect_frame(T.CONSUMER_STATS_RESPONSE)))
        assert stats[1] == 7
        assert 2 not in stats  # no error
        assert stats[7] == b"stats-me"
        assert stats[8] == 6  # permits left
        assert stats[9] == 4  # unacked
        assert stats[13] == b"Shared"
        assert stats[15] == 4  # backlog
        assert struct.unpack("<d", stats[4])[0] >= 0.0  # type: ignore[arg-type]
        raw.send_raw(_consumer_stats(8, 42))
        missing = _fields(_body(raw.expect_frame(T.CONSUMER_STATS_RESPONSE)))
        assert (missing[1], missing[2]) == (8, pb.ConsumerNotFound)
        raw.ping()


def test_encoded_message_carries_ack_set_and_epoch() -> None:
    entry = build_entry(pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=0), b"")
    header, data = encode_message(1, 2, 3, 0, entry, 0, [0b1010, -1], 7)
    (frame,) = FrameDecoder(1 << 20).feed(header + data)
    message = frame.command.message
    assert list(message.ack_set) == [0b1010, -1]
    assert message.consumer_epoch == 7


def _subscribe_with_epoch(raw: RawClient, topic: str, sub_type: int, epoch: int) -> None:
    raw.send_command(
        T(
            type=T.SUBSCRIBE,
            subscribe=pb.CommandSubscribe(
                topic=topic,
                subscription=f"epoch-{sub_type}",
                sub_type=sub_type,  # type: ignore[arg-type]
                consumer_id=1,
                request_id=1,
                consumer_epoch=epoch,
                initial_position=pb.CommandSubscribe.Earliest,
            ),
        )
    )
    raw.expect(T.SUCCESS)


def test_exclusive_messages_carry_the_consumer_epoch_and_redeliver_raises_it(
    broker: Broker, topic: str
) -> None:
    """Pulsar's Consumer: SUBSCRIBE's consumer_epoch, raised by a REDELIVER with a newer one;
    MESSAGE frames carry it on Exclusive and Failover (not on Shared)."""
    with RawClient(broker.address, timeout=5) as raw:
        raw.handshake()
        raw.create_producer(topic, 1)
        raw.produce(1, 0, b"m0")
        _subscribe_with_epoch(raw, topic, pb.CommandSubscribe.Exclusive, 3)
        raw.flow(1, 10)
        assert raw.expect(T.MESSAGE).message.consumer_epoch == 3
        raw.send_command(
            T(
                type=T.REDELIVER_UNACKNOWLEDGED_MESSAGES,
                redeliver_unacknowledged_messages=pb.CommandRedeliverUnacknowledgedMessages(
                    consumer_id=1, consumer_epoch=4
                ),
            )
        )
        again = raw.expect(T.MESSAGE).message
        assert (again.consumer_epoch, again.redelivery_count) == (4, 1)
    with RawClient(broker.address, timeout=5) as raw:
        raw.handshake()
        _subscribe_with_epoch(raw, topic, pb.CommandSubscribe.Shared, 3)
        raw.flow(1, 10)
        assert not raw.expect(T.MESSAGE).message.HasField("consumer_epoch")


def test_close_consumer_is_answered_at_once_and_its_removal_comes_first(
    monkeypatch: pytest.MonkeyPatch, topic: str
) -> None:
    # The answer does not wait for the dispatcher, which held it for as long as it was busy:
    # the removal is queued there before the answer leaves, so the client's next request on
    # the subscription finds it done (an Exclusive subscription takes the next consumer).
    remove = Dispatcher.HANDLERS[RemoveConsumer]
    entered = threading.Event()
    held: list[gevent.event.Event] = []

    def held_remove(dispatcher: Dispatcher, message: RemoveConsumer) -> None:
        if not held:  # the first removal only
            held.append(gevent.event.Event())
            entered.set()
            held[0].wait(10)
        remove(dispatcher, message)

    monkeypatch.setitem(Dispatcher.HANDLERS, RemoveConsumer, held_remove)
    with Broker(port=0) as broker, RawClient(broker.address, timeout=5) as raw:
        raw.handshake()
        raw.subscribe(topic, "only", 1)
        raw.close_consumer(1)  # answered while the dispatcher is held in the removal
        assert entered.wait(5)
        raw.send_command(raw.subscribe_command(topic, "only", 2, request_id=900))
        broker._call(lambda _ref: held[0].set())
        assert raw.expect(T.SUCCESS).success.request_id == 900
