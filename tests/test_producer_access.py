"""Producer access modes and the topic epoch, with the official client (pulsar-client 3.13
exposes every mode as ``access_mode=``). Behaviour from Pulsar's AbstractTopic
(``incrementTopicEpochIfNeeded``, ``handleProducerRemoved``) and ServerCnx.handleProducer."""

from __future__ import annotations

import threading
import time

import pulsar
import pytest

from brokerlet import Broker

pytestmark = pytest.mark.official

Mode = pulsar.ProducerAccessMode


def test_exclusive_refuses_a_second_producer_of_any_mode(client: pulsar.Client, topic: str) -> None:
    first = client.create_producer(topic, access_mode=Mode.Exclusive, batching_enabled=False)
    first.send(b"one")
    # Pulsar refuses a second exclusive producer with ProducerFenced, a shared one with
    # ProducerBusy (AbstractTopic.incrementTopicEpochIfNeeded).
    with pytest.raises(pulsar.ProducerFenced):
        client.create_producer(topic, access_mode=Mode.Exclusive)
    with pytest.raises(pulsar.ProducerBusy):
        client.create_producer(topic)
    first.close()
    again = client.create_producer(topic, access_mode=Mode.Exclusive)  # released on close
    again.close()


def test_exclusive_is_refused_while_shared_producers_exist(
    client: pulsar.Client, topic: str
) -> None:
    shared = client.create_producer(topic)
    with pytest.raises(pulsar.ProducerFenced):
        client.create_producer(topic, access_mode=Mode.Exclusive)
    shared.close()


def test_wait_for_exclusive_succeeds_after_the_first_closes_not_before(
    client: pulsar.Client, topic: str
) -> None:
    first = client.create_producer(topic, access_mode=Mode.Exclusive, batching_enabled=False)
    created = threading.Event()
    holder: list[pulsar.Producer] = []

    def wait() -> None:
        holder.append(
            client.create_producer(topic, access_mode=Mode.WaitForExclusive, batching_enabled=False)
        )
        created.set()

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    # Not before: while the first holds the topic the second stays waiting.
    assert not created.wait(1.0), "WaitForExclusive producer was created while the topic was held"
    first.send(b"from the first")
    first.close()
    assert created.wait(10), "WaitForExclusive producer not created after the first closed"
    holder[0].send(b"from the second")
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    got = [consumer.receive(5000).data() for _ in range(2)]
    assert got == [b"from the first", b"from the second"]
    holder[0].close()


def test_exclusive_with_fencing_fences_the_first_whose_next_send_fails(
    client: pulsar.Client, topic: str, broker: Broker
) -> None:
    first = client.create_producer(topic, access_mode=Mode.Exclusive, batching_enabled=False)
    first.send(b"before")
    second = client.create_producer(
        topic, access_mode=Mode.ExclusiveWithFencing, batching_enabled=False
    )
    second.send(b"taker")
    deadline = time.monotonic() + 10
    failure: Exception | None = None
    while time.monotonic() < deadline:
        try:
            first.send(b"after fencing")
        except pulsar.PulsarException as error:
            failure = error
            break
    assert isinstance(failure, pulsar.ProducerFenced), failure
    stats = broker.topic_stats(topic)
    assert stats is not None
    assert [p["accessMode"] for p in stats["publishers"]] == ["ExclusiveWithFencing"]
    assert stats["topicEpoch"] == 1  # 0 for the first exclusive producer, 1 for the taker
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    got = [consumer.receive(5000).data() for _ in range(2)]
    assert got == [b"before", b"taker"]
    second.close()


def test_a_dropped_connection_releases_exclusivity_at_once(broker: Broker, topic: str) -> None:
    first_client = pulsar.Client(broker.service_url, operation_timeout_seconds=10)
    first_client.create_producer(topic, access_mode=Mode.Exclusive)
    first_client.close()  # the connection goes; no CLOSE_PRODUCER needed
    other = pulsar.Client(broker.service_url, operation_timeout_seconds=10)
    try:
        start = time.monotonic()
        producer = other.create_producer(topic, access_mode=Mode.Exclusive)
        assert time.monotonic() - start < 5
        producer.close()
    finally:
        other.close()
