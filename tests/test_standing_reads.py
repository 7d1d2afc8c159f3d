"""Standing reads: a caught-up Shared dispatcher's read stays armed at the topic.

Pulsar's Shared dispatcher (``PersistentDispatcherMultipleConsumers``) reads again right after
a pass; brokerlet does so at the end of the topic only, by leaving the read armed while each
push goes out in full (``ReadEntries.standing``). These tests hold it to what a read loop
must keep: every entry once and in order, never past the permits, and a push that cannot go
out in full handing over to the ordinary loop.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from brokerlet import Broker
from brokerlet.testing.rawclient import RawClient
from brokerlet.transport.protocol import pb

SHARED = pb.CommandSubscribe.Shared
TIMEOUT = 10.0  # seconds; bounds every wait for a frame


@pytest.fixture(params=["memory", "disk"])
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Broker]:
    if request.param == "disk":
        running = Broker(port=0, storage="disk", data_dir=str(tmp_path / "data"))
    else:
        running = Broker(port=0)
    with running:
        yield running


def subscription_stats(broker: Broker, topic: str) -> dict[str, Any]:
    """The subscription's stats; asking goes through the dispatcher, so every push it had
    been told of before is handled by then."""
    stats = broker.topic_stats(topic)
    assert stats is not None
    sub: dict[str, Any] = stats["subscriptions"]["s"]
    return sub


def connected(broker: Broker, topic: str, permits: int) -> tuple[RawClient, RawClient]:
    producer = RawClient(broker.address, timeout=TIMEOUT)
    producer.handshake()
    producer.create_producer(topic, 1)
    consumer = RawClient(broker.address, timeout=TIMEOUT)
    consumer.handshake()
    consumer.subscribe(topic, "s", 1, sub_type=SHARED)
    if permits:
        consumer.flow(1, permits)
    return producer, consumer


def test_a_caught_up_consumer_gets_each_message_from_one_standing_read(broker: Broker) -> None:
    topic = "persistent://public/default/standing-one-by-one"
    producer, consumer = connected(broker, topic, 1000)
    with producer, consumer:
        for sequence_id in range(200):
            entry_id = producer.produce(1, sequence_id, b"m%d" % sequence_id)
            [message] = consumer.receive(1, 1)
            assert (message.entry_id, message.sequence_id) == (entry_id, sequence_id)
            assert message.payload == b"m%d" % sequence_id
        reads = subscription_stats(broker, topic)["readsIssued"]
    # Without standing reads every message takes a read of its own (200 and more).
    assert reads < 50, reads


def test_concurrent_producers_lose_and_repeat_nothing(broker: Broker) -> None:
    topic = "persistent://public/default/standing-concurrent"
    first, consumer = connected(broker, topic, 5000)
    second = RawClient(broker.address, timeout=TIMEOUT)
    second.handshake()
    second.create_producer(topic, 2)
    per_producer = 600

    def burst(client: RawClient, producer_id: int) -> None:
        for sequence_id in range(per_producer):  # pipelined: receipts read at the end
            client.send_raw(client.send_frame(producer_id, sequence_id, b"x" * 64))
        for _ in range(per_producer):
            client.expect(pb.BaseCommand.SEND_RECEIPT)

    with first, second, consumer:
        consumer.receive(1, 0)
        threads = [
            threading.Thread(target=burst, args=(client, pid))
            for client, pid in ((first, 1), (second, 2))
        ]
        for thread in threads:
            thread.start()
        received = consumer.receive(1, 2 * per_producer, TIMEOUT)
        for thread in threads:
            thread.join(TIMEOUT)
            assert not thread.is_alive()
    entry_ids = [message.entry_id for message in received]
    assert entry_ids == list(range(2 * per_producer)), "one consumer gets every entry in order"


def test_a_standing_read_never_delivers_past_the_permits(broker: Broker) -> None:
    topic = "persistent://public/default/standing-permits"
    producer, consumer = connected(broker, topic, 5)
    with producer, consumer:
        producer.produce(1, 0, b"first")
        assert [m.entry_id for m in consumer.receive(1, 1)] == [0]  # caught up and standing
        for sequence_id in range(1, 20):
            producer.produce(1, sequence_id, b"more")
        sub = subscription_stats(broker, topic)
        assert sub["msgOutCounter"] == 5
        assert sub["consumers"][0]["availablePermits"] == 0
        assert sub["consumers"][0]["avgMessagesPerEntry"] == 1
        consumer.flow(1, 15)
        rest = consumer.receive(1, 4 + 15)
        assert [m.entry_id for m in rest] == list(range(1, 20))
        assert subscription_stats(broker, topic)["msgOutCounter"] == 20


def test_a_new_consumer_after_the_last_one_closed_reads_from_the_mark_delete(
    broker: Broker,
) -> None:
    # Closing the last consumer rewinds the dispatcher, which cancels its standing read.
    topic = "persistent://public/default/standing-rewind"
    producer, consumer = connected(broker, topic, 100)
    with producer, consumer:
        producer.produce(1, 0, b"acked")
        [acked] = consumer.receive(1, 1)
        consumer.ack(1, [acked.entry_id], acked.ledger_id)
        producer.produce(1, 1, b"unacked")
        assert [m.entry_id for m in consumer.receive(1, 1)] == [1]
        consumer.close_consumer(1)
        for sequence_id in range(2, 6):
            producer.produce(1, sequence_id, b"while nobody listens")
        consumer.subscribe(topic, "s", 2, sub_type=SHARED)
        consumer.flow(2, 100)
        assert [m.entry_id for m in consumer.receive(2, 5)] == [1, 2, 3, 4, 5]
        producer.produce(1, 6, b"after")
        assert [m.entry_id for m in consumer.receive(2, 1)] == [6]


def test_a_paused_consumer_at_the_tail_stops_the_pushes_and_loses_nothing() -> None:
    # The consumer stops reading while caught up: pushes fill its socket until the channel
    # is unwritable, a push then cannot go out, the standing read is cancelled and the
    # ordinary loop waits for the writable event. Reading again delivers everything once.
    topic = "persistent://public/default/standing-paused"
    payload = b"p" * 4096
    count = 300  # 1.2 MB: far more than the 16 KiB socket buffers and the channel hold
    with Broker(port=0, so_sndbuf=16384) as broker:
        producer = RawClient(broker.address, timeout=TIMEOUT)
        consumer = RawClient(broker.address, timeout=TIMEOUT, rcvbuf=16384)
        with producer, consumer:
            producer.handshake()
            producer.create_producer(topic, 1)
            consumer.handshake()
            consumer.subscribe(topic, "s", 1, sub_type=SHARED)
            consumer.flow(1, 1000)
            producer.produce(1, 0, payload)
            assert [m.entry_id for m in consumer.receive(1, 1)] == [0]  # standing from here
            for sequence_id in range(1, count):
                producer.produce(1, sequence_id, payload)  # the consumer reads nothing
            sub = subscription_stats(broker, topic)
            assert sub["msgOutCounter"] < count, "the paused socket must stop the pushes"
            rest = consumer.receive(1, count - 1, TIMEOUT)
            assert [m.entry_id for m in rest] == list(range(1, count))
            producer.produce(1, count, b"after")
            assert [m.entry_id for m in consumer.receive(1, 1)] == [count]
