"""Key_Shared subscriptions with the official pulsar-client."""

from __future__ import annotations

import math
import random
import threading
import time
from collections import defaultdict
from dataclasses import dataclass

import pulsar
import pytest

from brokerlet import Broker
from brokerlet.keyshared import sticky_key_hash

pytestmark = pytest.mark.official


def key_shared(client: pulsar.Client, topic: str, name: str, **kwargs: object) -> pulsar.Consumer:
    return client.subscribe(
        topic,
        "ks",
        consumer_type=pulsar.ConsumerType.KeyShared,
        consumer_name=name,
        initial_position=pulsar.InitialPosition.Earliest,
        **kwargs,
    )


def sticky(client: pulsar.Client, topic: str, name: str, low: int, high: int) -> pulsar.Consumer:
    """A STICKY Key_Shared consumer claiming hash slots ``low..high``."""
    policy = pulsar.ConsumerKeySharedPolicy(
        key_shared_mode=pulsar.KeySharedMode.Sticky, sticky_ranges=[(low, high)]
    )
    return key_shared(client, topic, name, key_shared_policy=policy)


def drain(consumers: list[pulsar.Consumer], expected: int, deadline: float = 15.0) -> list[list]:
    got: list[list[pulsar.Message]] = [[] for _ in consumers]
    end = time.monotonic() + deadline
    while sum(map(len, got)) < expected and time.monotonic() < end:
        for index, consumer in enumerate(consumers):
            try:
                message = consumer.receive(20)
            except pulsar.Timeout:
                continue
            got[index].append(message)
            consumer.acknowledge(message)
    return got


@pytest.mark.parametrize("batching", ["none", "key-based"])
def test_auto_split_sends_each_key_to_one_consumer_in_order(
    client: pulsar.Client, topic: str, batching: str
) -> None:
    consumers = [key_shared(client, topic, f"c{i}") for i in range(2)]
    if batching == "none":
        producer = client.create_producer(topic, batching_enabled=False)
    else:
        producer = client.create_producer(
            topic,
            batching_enabled=True,
            batching_type=pulsar.BatchingType.KeyBased,
            batching_max_publish_delay_ms=5,
        )
    keys = [f"key-{i}" for i in range(20)]
    for n in range(20):
        for key in keys:
            producer.send_async(f"{key}:{n}".encode(), None, partition_key=key)
    producer.flush()
    got = drain(consumers, 400)
    assert sum(map(len, got)) == 400
    owners: dict[str, set[int]] = defaultdict(set)
    for index, messages in enumerate(got):
        per_key: dict[str, list[int]] = defaultdict(list)
        for message in messages:
            key, n = message.data().decode().split(":")
            owners[key].add(index)
            per_key[key].append(int(n))
        assert all(ns == sorted(ns) for ns in per_key.values()), "per-key order"
    assert all(len(o) == 1 for o in owners.values()), "each key at one consumer"
    assert len({next(iter(o)) for o in owners.values()}) == 2, "both consumers used"


def test_sticky_ranges_route_keys_by_their_slot(client: pulsar.Client, topic: str) -> None:
    low = sticky(client, topic, "low", 0, 30000)
    high = sticky(client, topic, "high", 30001, 65535)
    producer = client.create_producer(topic, batching_enabled=False)
    keys = [f"sticky-{i}" for i in range(40)]
    for key in keys:
        producer.send(key.encode(), partition_key=key)
    got = drain([low, high], len(keys))
    for index, messages in enumerate(got):
        for message in messages:
            slot = sticky_key_hash(message.data()) % 65536
            assert (slot > 30000) == (index == 1), (message.data(), slot)
    assert sum(map(len, got)) == len(keys)


def test_sticky_rejects_overlapping_ranges(client: pulsar.Client, topic: str) -> None:
    policy = pulsar.ConsumerKeySharedPolicy(
        key_shared_mode=pulsar.KeySharedMode.Sticky, sticky_ranges=[(0, 40000)]
    )
    key_shared(client, topic, "first", key_shared_policy=policy)
    with pytest.raises(pulsar.ConsumerAssignError):
        key_shared(client, topic, "second", key_shared_policy=policy)


def test_ordering_key_beats_partition_key(client: pulsar.Client, topic: str) -> None:
    def slot(key: bytes) -> int:
        return sticky_key_hash(key) % 65536

    # An ordering key in the low half with a partition key in the high half, and the reverse.
    lows = [k for k in (f"o{i}".encode() for i in range(200)) if slot(k) <= 30000][:5]
    highs = [k for k in (f"p{i}".encode() for i in range(200)) if slot(k) > 30000][:5]
    low = sticky(client, topic, "low", 0, 30000)
    high = sticky(client, topic, "high", 30001, 65535)
    producer = client.create_producer(topic, batching_enabled=False)
    for ordering, partition in zip(lows, highs, strict=True):
        producer.send(b"x", partition_key=partition.decode(), ordering_key=ordering.decode())
    got = drain([low, high], 5)
    assert len(got[0]) == 5
    assert got[1] == []


@dataclass
class Delivery:
    """One message as a consumer thread saw it; times are ``time.monotonic()``."""

    consumer: str
    key: str
    entry: tuple[int, int]  # (ledger, entry): the topic's order, which is each key's order
    received: float
    acked: float = math.inf


def exclusivity_violations(deliveries: list[Delivery], closed: dict[str, float]) -> list[str]:
    """Deliveries of a key to a consumer while another still had an earlier one of it.

    A key may move from A to B only once A has acked (or, by closing, given back) every
    message of that key it was sent. The check runs on the whole record after the fact,
    so it also sees messages the broker sent A that were still waiting in A's receiver
    queue when B received the key: A receives and acks those only later.
    """
    by_key: dict[str, list[Delivery]] = defaultdict(list)
    for delivery in deliveries:
        by_key[delivery.key].append(delivery)
    found = []
    for key, group in by_key.items():
        group.sort(key=lambda d: d.entry)
        for index, later in enumerate(group):
            for earlier in group[:index]:
                if earlier.consumer == later.consumer or earlier.entry == later.entry:
                    continue
                released = min(earlier.acked, closed.get(earlier.consumer, math.inf))
                if released > later.received:
                    found.append(
                        f"{key}: {later.entry} at {later.consumer} while {earlier.consumer} "
                        f"still held {earlier.entry}"
                    )
    return found


def test_the_exclusivity_check_sees_keys_waiting_in_a_receiver_queue() -> None:
    # A was sent k's entry 1 but received it (from its queue) only after B got entry 2.
    waiting = [
        Delivery("A", "k", (1, 1), received=5.0, acked=6.0),
        Delivery("B", "k", (1, 2), received=4.0, acked=4.5),
    ]
    assert exclusivity_violations(waiting, {}) != []
    handed_over = [
        Delivery("A", "k", (1, 1), received=1.0, acked=2.0),
        Delivery("B", "k", (1, 2), received=3.0, acked=4.0),
    ]
    assert exclusivity_violations(handed_over, {}) == []
    closed_first = [
        Delivery("A", "k", (1, 1), received=1.0),
        Delivery("B", "k", (1, 2), received=3.0, acked=4.0),
    ]
    assert exclusivity_violations(closed_first, {"A": 2.0}) == []


def test_churn_keeps_keys_exclusive_ordered_and_complete(
    broker: Broker, client: pulsar.Client, topic: str
) -> None:
    """Consumers join and leave while 20 producers send keyed messages."""
    producers = [client.create_producer(topic, batching_enabled=False) for _ in range(20)]
    keys = [f"k{i}" for i in range(50)]
    per_producer = 150
    total = len(producers) * per_producer
    lock = threading.Lock()
    progress = threading.Condition(lock)
    deliveries: list[Delivery] = []
    closed: dict[str, float] = {}  # consumer -> when it started closing
    order_violations: list[str] = []
    seen: dict[tuple[int, int], int] = defaultdict(int)  # (producer, n) -> deliveries
    last: dict[tuple[str, int], int] = {}  # (key, producer) -> last n seen first-time
    redeliveries = 0
    stop = threading.Event()

    def consume(consumer: pulsar.Consumer, name: str, quit_event: threading.Event) -> None:
        nonlocal redeliveries
        while not stop.is_set() and not quit_event.is_set():
            try:
                message = consumer.receive(20)
            except pulsar.Timeout:
                continue
            received = time.monotonic()
            key = message.partition_key()
            producer_index, n = map(int, message.data().split(b":"))
            message_id = message.message_id()
            entry = (message_id.ledger_id(), message_id.entry_id())
            delivery = Delivery(name, key, entry, received)
            with lock:
                deliveries.append(delivery)
                seen[(producer_index, n)] += 1
                if message.redelivery_count() > 0:
                    redeliveries += 1
                elif seen[(producer_index, n)] == 1:
                    previous = last.get((key, producer_index), -1)
                    if n < previous:
                        order_violations.append(
                            f"{key} from p{producer_index}: {n} after {previous}"
                        )
                    last[(key, producer_index)] = n
                progress.notify_all()
            time.sleep(0.001)  # slow consumers: receiver queues stay full, keys held a while
            delivery.acked = time.monotonic()  # before the ack leaves, so before any hand-over
            consumer.acknowledge(message)

    def run(name: str, quit_event: threading.Event) -> threading.Thread:
        consumer = key_shared(client, topic, name, receiver_queue_size=20)

        def body() -> None:
            try:
                consume(consumer, name, quit_event)
            finally:
                with lock:
                    closed[name] = time.monotonic()
                consumer.close()

        thread = threading.Thread(target=body, daemon=True)
        thread.start()
        return thread

    def wait_for_deliveries(count: int) -> None:
        with progress:
            reached = progress.wait_for(lambda: len(seen) >= count, timeout=20)
            assert reached, f"only {len(seen)} of {count} messages delivered"

    stable = [run(f"stable-{i}", threading.Event()) for i in range(2)]
    rng = random.Random(3)

    def send_all() -> None:
        for n in range(per_producer):
            for index, producer in enumerate(producers):
                key = keys[rng.randrange(len(keys))]
                producer.send_async(f"{index}:{n}".encode(), None, partition_key=key)
        for producer in producers:
            producer.flush()

    sender = threading.Thread(target=send_all, daemon=True)
    sender.start()
    churners = []
    for round_ in range(6):  # consumers join and leave while messages flow
        quit_event = threading.Event()
        churners.append((run(f"churn-{round_}", quit_event), quit_event))
        wait_for_deliveries(total * (round_ + 1) // 8)
        if round_ % 2:
            thread, event = churners.pop(0)
            event.set()
            thread.join(5)
            assert not thread.is_alive(), "a leaving consumer did not close"
    sender.join(30)
    assert not sender.is_alive(), "the producers did not finish sending"
    wait_for_deliveries(total)
    stats = broker.topic_stats(topic)
    stop.set()
    for thread in stable + [t for t, _ in churners]:
        thread.join(5)
        assert not thread.is_alive(), "a consumer thread did not end"
    assert order_violations == []
    assert exclusivity_violations(deliveries, closed) == []
    assert len(seen) == total, f"every message delivered; {stats}"
    duplicates = sum(count - 1 for count in seen.values())
    assert duplicates <= redeliveries, "duplicates only as redeliveries"
