"""Conformance: partitioned topics, namespaces and lookups with the official client.

Partitioned topics are created over the admin API (or auto-created); their partitions are
ordinary topics ``<name>-partition-<i>``. The client's partitioned producers, consumers over
every partition, readers and Failover per partition must work unchanged.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Iterator

import _pulsar
import pulsar
import pytest
import requests

from brokerlet import Broker
from brokerlet.config import SettingsError

pytestmark = pytest.mark.official

_names = itertools.count()


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    with Broker(port=0) as running:
        yield running


@pytest.fixture
def web(broker: Broker) -> str:
    assert broker.web_service_url is not None
    return broker.web_service_url


@pytest.fixture
def client(broker: Broker) -> Iterator[pulsar.Client]:
    client = pulsar.Client(broker.service_url, operation_timeout_seconds=5)
    yield client
    client.close()


def create_partitioned(web: str, topic: str, partitions: int) -> None:
    local = topic.removeprefix("persistent://")
    reply = requests.put(
        f"{web}/admin/v2/persistent/{local}/partitions", json=partitions, timeout=10
    )
    assert reply.status_code == 204, reply.text


def new_topic() -> str:
    return f"persistent://public/default/parts-{next(_names)}"


def receive_all(
    consumer: pulsar.Consumer, expected: int, deadline: float = 10.0
) -> list[pulsar.Message]:
    messages: list[pulsar.Message] = []
    end = time.monotonic() + deadline
    while len(messages) < expected and time.monotonic() < end:
        try:
            message = consumer.receive(100)
        except pulsar.Timeout:
            continue
        messages.append(message)
        consumer.acknowledge(message)
    return messages


def test_round_robin_producer_spreads_and_a_consumer_gets_each_message_once(
    client: pulsar.Client, web: str
) -> None:
    topic = new_topic()
    create_partitioned(web, topic, 4)
    consumer = client.subscribe(topic, "all", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(
        topic,
        batching_enabled=False,
        message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution,
    )

    for i in range(40):
        producer.send(f"m{i}".encode())
    messages = receive_all(consumer, 40)

    assert sorted(m.data() for m in messages) == sorted(f"m{i}".encode() for i in range(40))
    assert {m.topic_name() for m in messages} == {f"{topic}-partition-{i}" for i in range(4)}
    assert client.get_topic_partitions(topic) == [f"{topic}-partition-{i}" for i in range(4)]


def test_single_partition_and_custom_routers(client: pulsar.Client, web: str) -> None:
    topic = new_topic()
    create_partitioned(web, topic, 3)
    consumer = client.subscribe(topic, "all", initial_position=pulsar.InitialPosition.Earliest)
    single = client.create_producer(
        topic,
        batching_enabled=False,
        message_routing_mode=pulsar.PartitionsRoutingMode.UseSinglePartition,
    )
    custom = client.create_producer(
        topic, batching_enabled=False, message_router=lambda _message, _n: 2
    )

    for i in range(5):
        single.send(f"s{i}".encode())
        custom.send(f"c{i}".encode())
    messages = receive_all(consumer, 10)

    by_partition: dict[str, set[bytes]] = {}
    for message in messages:
        by_partition.setdefault(message.topic_name(), set()).add(message.data()[:1])
    assert len(messages) == 10
    assert by_partition[f"{topic}-partition-2"] >= {b"c"}
    single_partitions = [p for p, kinds in by_partition.items() if b"s" in kinds]
    assert len(single_partitions) == 1


def test_keyed_messages_stay_on_one_partition(client: pulsar.Client, web: str) -> None:
    topic = new_topic()
    create_partitioned(web, topic, 4)
    consumer = client.subscribe(topic, "all", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)

    for i in range(12):
        producer.send(f"k{i}".encode(), partition_key="same")
    messages = receive_all(consumer, 12)

    assert len({m.topic_name() for m in messages}) == 1
    assert [m.data() for m in messages] == [f"k{i}".encode() for i in range(12)]


def test_a_reader_reads_one_partition(client: pulsar.Client, web: str) -> None:
    topic = new_topic()
    create_partitioned(web, topic, 2)
    producer = client.create_producer(topic, batching_enabled=False, message_router=lambda m, n: 1)
    for i in range(3):
        producer.send(f"r{i}".encode())

    reader = client.create_reader(f"{topic}-partition-1", pulsar.MessageId.earliest)
    got = [reader.read_next(5000).data() for _ in range(3)]
    empty = client.create_reader(f"{topic}-partition-0", pulsar.MessageId.earliest)

    assert got == [b"r0", b"r1", b"r2"]
    assert not empty.has_message_available()


def test_failover_picks_one_active_consumer_per_partition(client: pulsar.Client, web: str) -> None:
    topic = new_topic()
    create_partitioned(web, topic, 2)
    first = client.subscribe(
        topic,
        "fo",
        consumer_type=pulsar.ConsumerType.Failover,
        consumer_name="a",
        initial_position=pulsar.InitialPosition.Earliest,
    )
    second = client.subscribe(
        topic,
        "fo",
        consumer_type=pulsar.ConsumerType.Failover,
        consumer_name="b",
        initial_position=pulsar.InitialPosition.Earliest,
    )
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(20):
        producer.send(f"f{i}".encode(), partition_key=f"key-{i}")

    received: dict[str, set[str]] = {"a": set(), "b": set()}
    count = 0
    end = time.monotonic() + 10
    while count < 20 and time.monotonic() < end:
        for name, consumer in (("a", first), ("b", second)):
            try:
                message = consumer.receive(50)
            except pulsar.Timeout:
                continue
            consumer.acknowledge(message)
            received[name].add(message.topic_name())
            count += 1

    assert count == 20
    # Each partition has one active consumer, and they spread as Pulsar spreads them
    # (AbstractDispatcherSingleActiveConsumer: consumers by name, partition index modulo
    # their count): partition 0 to "a", partition 1 to "b".
    assert received == {"a": {f"{topic}-partition-0"}, "b": {f"{topic}-partition-1"}}


def test_auto_created_partitioned_topics_follow_the_namespace_policy(
    client: pulsar.Client, web: str
) -> None:
    base = f"{web}/admin/v2/namespaces/public/default"
    requests.put(f"{web}/admin/v2/namespaces/public/auto", timeout=10)
    policy = {"allowAutoTopicCreation": True, "topicType": "partitioned", "defaultNumPartitions": 3}
    reply = requests.post(
        f"{base.replace('default', 'auto')}/autoTopicCreation", json=policy, timeout=10
    )
    assert reply.status_code == 204
    topic = f"persistent://public/auto/made-{next(_names)}"

    producer = client.create_producer(topic)
    producer.send(b"x")

    assert client.get_topic_partitions(topic) == [f"{topic}-partition-{i}" for i in range(3)]
    meta = requests.get(
        f"{web}/admin/v2/persistent/public/auto/{topic.rsplit('/', 1)[1]}/partitions", timeout=10
    )
    assert meta.json()["partitions"] == 3


def test_a_grown_partition_count_is_seen_by_later_lookups(client: pulsar.Client, web: str) -> None:
    # The official client re-reads partition counts every 60 s (not settable from Python);
    # a producer created after the update routes over every partition at once.
    topic = new_topic()
    create_partitioned(web, topic, 2)
    local = topic.removeprefix("persistent://")
    reply = requests.post(f"{web}/admin/v2/persistent/{local}/partitions", json=4, timeout=10)
    assert reply.status_code == 204

    consumer = client.subscribe(topic, "all", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(
        topic,
        batching_enabled=False,
        message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution,
    )
    for i in range(8):
        producer.send(f"g{i}".encode())
    messages = receive_all(consumer, 8)

    assert client.get_topic_partitions(topic) == [f"{topic}-partition-{i}" for i in range(4)]
    assert {m.topic_name() for m in messages} == {f"{topic}-partition-{i}" for i in range(4)}


def test_growing_copies_durable_subscriptions_to_the_new_partitions(
    client: pulsar.Client, web: str
) -> None:
    # PersistentTopicsBase#internalUpdatePartitionedTopicAsync copies partition 0's durable
    # subscriptions, so messages on a new partition wait for consumers that find it later.
    topic = new_topic()
    create_partitioned(web, topic, 2)
    client.subscribe(topic, "keep", consumer_type=pulsar.ConsumerType.Shared)
    local = topic.removeprefix("persistent://")
    assert requests.post(f"{web}/admin/v2/persistent/{local}/partitions", json=3, timeout=10).ok

    client.create_producer(f"{topic}-partition-2").send(b"early")
    stats = requests.get(f"{web}/admin/v2/persistent/{local}-partition-2/stats", timeout=10)

    assert stats.json()["subscriptions"]["keep"]["msgBacklog"] == 1


def test_partitions_are_ordinary_topics_to_the_admin_api(client: pulsar.Client, web: str) -> None:
    topic = new_topic()
    create_partitioned(web, topic, 2)
    producer = client.create_producer(topic, batching_enabled=False, message_router=lambda m, n: 0)
    producer.send(b"one")

    local = topic.removeprefix("persistent://")
    stats = requests.get(f"{web}/admin/v2/persistent/{local}-partition-0/stats", timeout=10)

    assert stats.status_code == 200
    assert stats.json()["msgInCounter"] == 1


# Refusals.


def test_a_topic_in_a_missing_namespace_is_refused(client: pulsar.Client) -> None:
    with pytest.raises(pulsar.TopicNotFound):
        client.create_producer("persistent://ghost/nowhere/t")
    with pytest.raises(pulsar.TopicNotFound):
        client.subscribe("persistent://public/nowhere/t", "sub")


def test_a_missing_topic_is_refused_when_auto_creation_is_off(broker: Broker, web: str) -> None:
    requests.put(f"{web}/admin/v2/namespaces/public/strict", timeout=10)
    reply = requests.post(
        f"{web}/admin/v2/namespaces/public/strict/autoTopicCreation",
        json={"allowAutoTopicCreation": False},
        timeout=10,
    )
    assert reply.status_code == 204
    client = pulsar.Client(broker.service_url, operation_timeout_seconds=5)
    try:
        with pytest.raises(pulsar.TopicNotFound):
            client.create_producer("persistent://public/strict/absent")
        with pytest.raises(pulsar.TopicNotFound):
            client.subscribe("persistent://public/strict/absent", "sub")
        requests.put(f"{web}/admin/v2/persistent/public/strict/present", timeout=10)
        client.create_producer("persistent://public/strict/present").send(b"ok")
    finally:
        client.close()


def test_broker_wide_auto_creation_off() -> None:
    with Broker(port=0, allowAutoTopicCreation=False) as strict:
        client = pulsar.Client(strict.service_url, operation_timeout_seconds=5)
        try:
            with pytest.raises(pulsar.TopicNotFound):
                client.create_producer("persistent://public/default/absent")
        finally:
            client.close()


# Regex subscriptions.


def test_a_regex_subscription_receives_from_topics_created_later(
    client: pulsar.Client, web: str
) -> None:
    # pulsar.Client.subscribe checks pattern_auto_discovery_period but never applies it (the
    # client then polls every 60 s), so the consumer is made through the same C++ binding
    # with the period set.
    prefix = f"rx{next(_names)}"
    first = f"persistent://public/default/{prefix}-a"
    client.create_producer(first).send(b"before")
    conf = _pulsar.ConsumerConfiguration()
    conf.pattern_auto_discovery_period(1)
    conf.subscription_initial_position(pulsar.InitialPosition.Earliest)
    consumer = client._client.subscribe_pattern(
        f"persistent://public/default/{prefix}-.*", "rx", conf
    )
    later = f"persistent://public/default/{prefix}-b"
    create_partitioned(web, later, 2)
    producer = client.create_producer(later, batching_enabled=False)

    got: set[bytes] = set()
    end = time.monotonic() + 20
    while got != {b"before", b"after"} and time.monotonic() < end:
        producer.send(b"after")
        try:
            message = consumer.receive(500)
        except pulsar.Timeout:
            continue
        consumer.acknowledge(message)
        got.add(message.data())
    consumer.close()

    assert got == {b"before", b"after"}, "the pattern consumer never found the later topic"


def test_the_python_regex_api_subscribes_to_existing_topics(client: pulsar.Client) -> None:
    prefix = f"rx{next(_names)}"
    for suffix in ("a", "b"):
        client.create_producer(f"persistent://public/default/{prefix}-{suffix}").send(
            suffix.encode()
        )
    client.create_producer(f"persistent://public/default/other{prefix}").send(b"no")

    consumer = client.subscribe(
        re.compile(f"persistent://public/default/{prefix}-.*"),
        "rx",
        initial_position=pulsar.InitialPosition.Earliest,
    )
    got = sorted(m.data() for m in receive_all(consumer, 2))

    assert got == [b"a", b"b"]
    assert nothing_more(consumer)


def nothing_more(consumer: pulsar.Consumer) -> bool:
    try:
        consumer.receive(300)
    except pulsar.Timeout:
        return True
    return False


# Lookups.


def test_a_client_with_an_http_service_url_produces_and_consumes(broker: Broker, web: str) -> None:
    client = pulsar.Client(web, operation_timeout_seconds=5)
    try:
        topic = new_topic()
        create_partitioned(web, topic, 2)
        consumer = client.subscribe(topic, "http", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(6):
            producer.send(f"h{i}".encode())
        messages = receive_all(consumer, 6)
        plain = client.create_producer(new_topic())
        plain.send(b"plain")
    finally:
        client.close()

    assert sorted(m.data() for m in messages) == [f"h{i}".encode() for i in range(6)]


def test_http_lookup_answers_pulsars_lookup_data(broker: Broker, web: str) -> None:
    reply = requests.get(f"{web}/lookup/v2/topic/persistent/public/default/anything", timeout=10)

    assert reply.status_code == 200
    data = reply.json()
    assert data["brokerUrl"] == broker.service_url
    assert data["httpUrl"] == web
    assert set(data) >= {"brokerUrlTls", "nativeUrl", "httpUrlTls"}


def test_http_lookup_of_a_missing_namespace_is_404(web: str) -> None:
    reply = requests.get(f"{web}/lookup/v2/topic/persistent/ghost/ns/t", timeout=10)

    assert reply.status_code == 404


def test_lookup_answers_the_named_listener() -> None:
    listeners = "internal:pulsar://127.0.0.1:1,external:pulsar://127.0.0.2:2"
    with Broker(port=0, advertisedListeners=listeners, internalListenerName="internal") as b:
        url = f"{b.web_service_url}/lookup/v2/topic/persistent/public/default/t"
        named = requests.get(url, params={"listenerName": "external"}, timeout=10).json()
        header = requests.get(url, headers={"X-Pulsar-ListenerName": "external"}, timeout=10)
        default = requests.get(url, timeout=10).json()
        unknown = requests.get(url, params={"listenerName": "nope"}, timeout=10)

    assert named["brokerUrl"] == "pulsar://127.0.0.2:2"
    assert header.json()["brokerUrl"] == "pulsar://127.0.0.2:2"
    assert default["brokerUrl"] == "pulsar://127.0.0.1:1"
    assert unknown.status_code == 500
    assert unknown.json()["reason"] == "the broker do not have nope listener"


def test_binary_lookup_with_a_listener_name(broker: Broker) -> None:
    # The client connects to what the named listener advertises: here the broker itself.
    host, port = broker.address
    listeners = f"mine:pulsar://{host}:{port}"
    with Broker(port=0, advertisedListeners=listeners) as other:
        client = pulsar.Client(other.service_url, listener_name="mine", operation_timeout_seconds=5)
        try:
            producer = client.create_producer(new_topic())
            producer.send(b"via listener")
        finally:
            client.close()
        bad = pulsar.Client(other.service_url, listener_name="absent", operation_timeout_seconds=2)
        try:
            with pytest.raises(pulsar.PulsarException):
                bad.create_producer(new_topic())
        finally:
            bad.close()


def test_a_bad_listener_setting_stops_start_up() -> None:
    with pytest.raises(SettingsError, match="advertised_listeners"):
        Broker(port=0, advertisedListeners="oops")
    with pytest.raises(SettingsError, match="internal_listener_name"):
        Broker(port=0, advertisedListeners="a:pulsar://h:1", internalListenerName="b")
