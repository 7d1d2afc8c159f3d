"""Conformance: the official ``pulsar-client`` against brokerlet on an ephemeral port.

The official client is a C++ extension that blocks gevent, so the broker runs on its own thread
(``Broker.start()``), as it would when embedded in a user's test suite.
"""

from __future__ import annotations

import time

import pulsar
import pytest

from brokerlet import Broker
from brokerlet.testing.waiting import wait_until
from tests.dispatch_harness import failover_active

pytestmark = pytest.mark.official


def receive_all(
    consumers: list[pulsar.Consumer], expected: int, *, deadline: float = 10.0, ack: bool = True
) -> list[list[pulsar.Message]]:
    """Poll every consumer in turn until ``expected`` messages arrived in all, or time runs out."""
    received: list[list[pulsar.Message]] = [[] for _ in consumers]
    end = time.monotonic() + deadline
    while sum(map(len, received)) < expected and time.monotonic() < end:
        for index, consumer in enumerate(consumers):
            try:
                message = consumer.receive(50)
            except pulsar.Timeout:
                continue
            received[index].append(message)
            if ack:
                consumer.acknowledge(message)
    return received


def nothing_more(consumer: pulsar.Consumer, wait_ms: int = 200) -> bool:
    try:
        consumer.receive(wait_ms)
    except pulsar.Timeout:
        return True
    return False


def test_produce_consume_keys_and_properties_round_trip(client: pulsar.Client, topic: str) -> None:
    producer = client.create_producer(topic, batching_enabled=False)
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    ids = [
        producer.send(
            f"m{i}".encode(),
            partition_key=f"key-{i}",
            properties={"n": str(i)},
            event_timestamp=1_000 + i,
        )
        for i in range(20)
    ]
    assert [(i.ledger_id(), i.entry_id()) for i in ids] == [
        (ids[0].ledger_id(), n) for n in range(20)
    ]
    for i in range(20):
        message = consumer.receive(5000)
        assert message.data() == f"m{i}".encode()
        assert message.partition_key() == f"key-{i}"
        assert message.properties() == {"n": str(i)}
        assert message.event_timestamp() == 1_000 + i
        assert message.redelivery_count() == 0
        consumer.acknowledge(message)
    assert nothing_more(consumer)


@pytest.mark.parametrize("batching", [False, True], ids=["unbatched", "batched"])
def test_shared_two_consumers_get_disjoint_sets_covering_everything(
    client: pulsar.Client, topic: str, batching: bool
) -> None:
    consumers = [
        client.subscribe(
            topic,
            "shared",
            consumer_type=pulsar.ConsumerType.Shared,
            receiver_queue_size=10,
            consumer_name=f"c{i}",
        )
        for i in range(2)
    ]
    producer = client.create_producer(
        topic, batching_enabled=batching, batching_max_messages=10, batching_max_publish_delay_ms=5
    )
    count = 300
    for i in range(count):
        producer.send_async(f"{i}".encode(), None)
    producer.flush()
    received = receive_all(consumers, count)
    bodies = [[int(m.data()) for m in got] for got in received]
    assert all(bodies), "both consumers must get a share"
    assert set(bodies[0]).isdisjoint(bodies[1])
    assert sorted(bodies[0] + bodies[1]) == list(range(count))
    assert all(nothing_more(c, 100) for c in consumers)


def wait_for_subscription(
    broker: Broker, topic: str, subscription: str, **expected: int
) -> dict[str, object]:
    """Poll the stats until ``subscription`` shows ``expected``; fail saying what it shows."""

    def current() -> dict[str, object] | None:
        stats = broker.topic_stats(topic)
        sub: dict[str, object] | None = (stats or {}).get("subscriptions", {}).get(subscription)
        return sub

    sub = wait_until(
        current,
        predicate=lambda sub: (
            sub is not None and all(sub.get(name) == value for name, value in expected.items())
        ),
        message=f"{subscription} to show {expected}",
    )
    assert sub is not None
    return dict(sub)


def test_batched_producer_entries_carry_batch_indexes(
    broker: Broker, client: pulsar.Client, topic: str
) -> None:
    consumer = client.subscribe(topic, "sub")
    producer = client.create_producer(
        topic, batching_enabled=True, batching_max_messages=5, batching_max_publish_delay_ms=1000
    )
    for i in range(10):
        producer.send_async(f"b{i}".encode(), None, properties={"i": str(i)})
    producer.flush()
    messages = [consumer.receive(5000) for _ in range(10)]
    assert [m.data() for m in messages] == [f"b{i}".encode() for i in range(10)]
    assert [m.properties()["i"] for m in messages] == [str(i) for i in range(10)]
    ids = [m.message_id() for m in messages]
    assert [i.batch_index() for i in ids] == [0, 1, 2, 3, 4] * 2
    assert len({i.entry_id() for i in ids}) == 2
    wait_for_subscription(broker, topic, "sub", msgBacklog=2)  # two entries, unacked
    for message in messages[:5]:
        consumer.acknowledge(message)
    # The client acks a batch's entry once all its messages are acked (grouped, so poll).
    wait_for_subscription(broker, topic, "sub", msgBacklog=1)
    for message in messages[5:]:
        consumer.acknowledge(message)
    wait_for_subscription(broker, topic, "sub", msgBacklog=0, unackedMessages=0)
    consumer.close()


def test_negative_ack_comes_back_with_redelivery_count_one(
    client: pulsar.Client, topic: str
) -> None:
    consumer = client.subscribe(
        topic, "sub", consumer_type=pulsar.ConsumerType.Shared, negative_ack_redelivery_delay_ms=100
    )
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"again")
    first = consumer.receive(5000)
    assert first.redelivery_count() == 0
    consumer.negative_acknowledge(first)
    second = consumer.receive(5000)
    assert second.data() == b"again"
    assert second.message_id() == first.message_id()
    assert second.redelivery_count() == 1
    consumer.acknowledge(second)
    assert nothing_more(consumer, 400)


def test_unacked_messages_of_a_closed_consumer_go_to_the_other(
    client: pulsar.Client, topic: str
) -> None:
    def shared(name: str) -> pulsar.Consumer:
        return client.subscribe(
            topic,
            "shared",
            consumer_type=pulsar.ConsumerType.Shared,
            receiver_queue_size=5,
            consumer_name=name,
        )

    leaving = shared("leaving")
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(5):
        producer.send(f"{i}".encode())
    held = [leaving.receive(5000) for _ in range(5)]
    staying = shared("staying")
    leaving.close()
    redelivered = receive_all([staying], 5)[0]
    assert sorted(m.data() for m in redelivered) == sorted(m.data() for m in held)
    assert all(m.redelivery_count() == 1 for m in redelivered)
    assert nothing_more(staying)


def test_exclusive_rejects_a_second_consumer_with_consumer_busy(
    client: pulsar.Client, topic: str
) -> None:
    client.subscribe(topic, "only", consumer_type=pulsar.ConsumerType.Exclusive)
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic, "only", consumer_type=pulsar.ConsumerType.Exclusive)


def test_a_different_subscription_type_is_busy_while_consumers_are_connected(
    client: pulsar.Client, topic: str
) -> None:
    client.subscribe(topic, "typed", consumer_type=pulsar.ConsumerType.Shared)
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic, "typed", consumer_type=pulsar.ConsumerType.Failover)


def test_failover_cumulative_ack_survives_a_reconnect(client: pulsar.Client, topic: str) -> None:
    producer = client.create_producer(topic, batching_enabled=False)
    consumer = client.subscribe(
        topic,
        "fo",
        consumer_type=pulsar.ConsumerType.Failover,
        initial_position=pulsar.InitialPosition.Earliest,
    )
    for i in range(10):
        producer.send(f"{i}".encode())
    messages = [consumer.receive(5000) for _ in range(10)]
    assert [m.data() for m in messages] == [f"{i}".encode() for i in range(10)]
    consumer.acknowledge_cumulative(messages[5])
    consumer.close()
    again = client.subscribe(topic, "fo", consumer_type=pulsar.ConsumerType.Failover)
    rest = [again.receive(5000) for _ in range(4)]
    assert [m.data() for m in rest] == [b"6", b"7", b"8", b"9"]
    assert nothing_more(again)


def test_failover_standby_takes_over_when_the_active_consumer_leaves(
    client: pulsar.Client, topic: str
) -> None:
    producer = client.create_producer(topic, batching_enabled=False)
    active = failover_active(topic, ["a", "b"])  # the ring's pick on a plain topic
    consumers = {
        name: client.subscribe(
            topic, "fo", consumer_type=pulsar.ConsumerType.Failover, consumer_name=name
        )
        for name in ("a", "b")
    }
    first, second = consumers[active], consumers["b" if active == "a" else "a"]
    producer.send(b"to-a")
    assert first.receive(5000).data() == b"to-a"
    assert nothing_more(second)
    first.close()  # unacked "to-a" moves to the standby
    producer.send(b"to-b")
    got = receive_all([second], 2)[0]
    assert [m.data() for m in got] == [b"to-a", b"to-b"]


def test_latest_subscription_starts_after_existing_messages(
    client: pulsar.Client, topic: str
) -> None:
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"before")
    consumer = client.subscribe(topic, "late", initial_position=pulsar.InitialPosition.Latest)
    producer.send(b"after")
    assert consumer.receive(5000).data() == b"after"
    assert nothing_more(consumer)


def test_reader_from_earliest_and_has_message_available(client: pulsar.Client, topic: str) -> None:
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(3):
        producer.send(f"r{i}".encode())
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    seen = []
    while reader.has_message_available():
        seen.append(reader.read_next(5000).data())
    assert seen == [b"r0", b"r1", b"r2"]
    reader.close()


def test_unsubscribe_removes_the_subscription(
    broker: Broker, client: pulsar.Client, topic: str
) -> None:
    consumer = client.subscribe(topic, "gone")
    existed = wait_for_subscription(broker, topic, "gone")
    assert len(existed["consumers"]) == 1  # type: ignore[arg-type]
    consumer.unsubscribe()
    stats = broker.topic_stats(topic)
    assert stats is not None
    assert "gone" not in stats["subscriptions"]


def test_seek_to_earliest_replays_everything(client: pulsar.Client, topic: str) -> None:
    producer = client.create_producer(topic, batching_enabled=False)
    consumer = client.subscribe(topic, "seeker", receiver_queue_size=10)
    for i in range(25):
        producer.send(f"s{i}".encode())
    first = [consumer.receive(5000) for _ in range(25)]
    for message in first:
        consumer.acknowledge(message)
    consumer.seek(pulsar.MessageId.earliest)
    again = receive_all([consumer], 25)[0]
    assert [m.data() for m in again] == [f"s{i}".encode() for i in range(25)]
    assert nothing_more(consumer)


def test_seek_by_publish_time_on_an_empty_topic_succeeds(client: pulsar.Client, topic: str) -> None:
    consumer = client.subscribe(topic, "seeker")
    consumer.seek(int(time.time() * 1000))  # seek by time: tests/test_seek_by_time.py
    producer = client.create_producer(topic)
    producer.send(b"after")
    assert consumer.receive(5_000).data() == b"after"
