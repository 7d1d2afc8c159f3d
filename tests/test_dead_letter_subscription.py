"""The dead-letter producer's ``initial_subscription_name`` (issue 13).

The C++ client creates its dead-letter producer with ``initialSubscriptionName`` from the
DeadLetterPolicy (``ConsumerImpl::processPossibleToDLQ``); Pulsar's ServerCnx then creates
that subscription on the DLQ topic, so dead letters are kept for a consumer that subscribes
later.
"""

from __future__ import annotations

import pulsar
import pytest

from brokerlet import Broker
from brokerlet.testing.waiting import wait_until


@pytest.mark.official
def test_dead_letters_wait_for_a_later_subscriber(
    broker: Broker, client: pulsar.Client, topic: str
) -> None:
    dlq = f"{topic}-DLQ"
    consumer = client.subscribe(
        topic,
        "sub",
        consumer_type=pulsar.ConsumerType.Shared,
        negative_ack_redelivery_delay_ms=100,
        dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(
            max_redeliver_count=1, dead_letter_topic=dlq, initial_subscription_name="dlq-sub"
        ),
    )
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"poison")

    def dead_lettered() -> bool:
        try:
            message = consumer.receive(500)
        except pulsar.Timeout:  # redeliveries are over: has the DLQ producer sent it?
            stats = broker.topic_stats(dlq)
            return stats is not None and stats["msgInCounter"] >= 1
        consumer.negative_acknowledge(message)
        return False

    wait_until(dead_lettered, message="the poison message on the dead-letter topic")
    stats = broker.topic_stats(dlq)
    assert stats is not None, "the dead-letter producer never came"
    assert "dlq-sub" in stats["subscriptions"], "initial_subscription_name was not created"
    later = client.subscribe(dlq, "dlq-sub", consumer_type=pulsar.ConsumerType.Shared)
    assert later.receive(5_000).data() == b"poison"
