"""Dispatch rate limits through the settings, at subscription, topic and broker level.

Pulsar's ``dispatchThrottlingRate*`` settings (PersistentDispatcherMultipleConsumers with
its DispatchRateLimiter per subscription, per topic and per broker): a limit of R per second
banks at most one second of tokens, so a backlog of N messages drains in about (N - R) / R
seconds. Each test sends a backlog well above R, then times its delivery: without the limit
it would take milliseconds. A topic limit is shared by the topic's subscriptions and a broker
limit by every topic, so there two backlogs drain from one budget.

Tokens are charged after sending (as Pulsar acquires permits after dispatch), so dispatchers
sharing a bucket may each read the tokens left before either is charged: with two of them
the first second can deliver up to 2R. The shared bounds allow for that, and still lie above
what two separate buckets would take.
"""

from __future__ import annotations

import time

import pytest

from brokerlet import Broker
from brokerlet.testing.rawclient import RawClient
from brokerlet.transport.protocol import pb

SHARED = pb.CommandSubscribe.Shared
RATE = 100  # messages (or, for the byte limits, 1 KiB messages) per second
PAYLOAD = b"x" * 1000
# Lower bound on the delivery time as a share of the ideal one: tokens are charged after
# sending and the first read may catch a bucket refilled a little, never more than that.
SLACK = 0.75
# Two streams of 2 * RATE from one bucket: 4R deliveries, at most 2R of them in the first
# second, so at least 2 s. Separate buckets would finish both in 1 s: (2R - R) / R.
SHARED_IDEAL_S = (4 * RATE - 2 * RATE) / RATE


def drain_time(broker: Broker, streams: list[tuple[str, str]], messages: int) -> float:
    """Store ``messages`` on each stream's topic, then time delivering every stream's backlog.

    Args:
        streams: ``(topic, subscription)`` pairs; a topic may appear with two subscriptions.
    """
    with RawClient(broker.address, timeout=30) as producer:
        producer.handshake()
        for number, topic in enumerate(dict.fromkeys(topic for topic, _ in streams), 1):
            producer.create_producer(topic, number)
            for sequence in range(messages):
                producer.produce(number, sequence, PAYLOAD)
    consumers = []
    try:
        for consumer_id, (topic, subscription) in enumerate(streams, 1):
            consumer = RawClient(broker.address, timeout=30)
            consumers.append(consumer)
            consumer.handshake()
            consumer.subscribe(topic, subscription, consumer_id, sub_type=SHARED)
        started = time.monotonic()
        for consumer_id, consumer in enumerate(consumers, 1):
            consumer.flow(consumer_id, messages)
        for consumer_id, consumer in enumerate(consumers, 1):
            got = consumer.receive(consumer_id, messages, timeout=30)
            assert [m.payload for m in got] == [PAYLOAD] * messages
        return time.monotonic() - started
    finally:
        for consumer in consumers:
            consumer.close()


@pytest.mark.parametrize(
    ("unit", "setting"),
    [
        ("msg", "dispatchThrottlingRatePerSubscriptionInMsg"),
        ("byte", "dispatchThrottlingRatePerSubscriptionInByte"),
    ],
)
def test_a_subscription_limit_paces_its_backlog(unit: str, setting: str) -> None:
    rate = RATE if unit == "msg" else RATE * (len(PAYLOAD) + 100)  # ~100 B of metadata each
    with Broker(port=0, **{setting: rate}) as broker:
        topic = f"persistent://public/default/sub-limit-{unit}"
        elapsed = drain_time(broker, [(topic, "s")], 2 * RATE)
        ideal = (2 * RATE - RATE) / RATE
        assert elapsed >= ideal * SLACK, f"{2 * RATE} messages out in {elapsed:.2f} s"
        assert elapsed < ideal * 10, f"paced far below the limit: {elapsed:.2f} s"
        # A second subscription on the same topic has a bucket of its own: a full second
        # banked, so its first RATE messages go out at once.
        quick = drain_time(broker, [(topic, "other")], RATE // 2)
        assert quick < ideal * SLACK, f"a fresh subscription was held back: {quick:.2f} s"


@pytest.mark.parametrize(
    ("setting", "streams"),
    [
        ("dispatch_throttling_rate_per_topic_in_msg", [("topic-msg", "a"), ("topic-msg", "b")]),
        ("dispatch_throttling_rate_per_topic_in_byte", [("topic-b", "a"), ("topic-b", "b")]),
        ("dispatchThrottlingRateInMsg", [("broker-msg-1", "s"), ("broker-msg-2", "s")]),
        ("dispatchThrottlingRateInByte", [("broker-b-1", "s"), ("broker-b-2", "s")]),
    ],
    ids=["topic msg/s", "topic bytes/s", "broker msg/s", "broker bytes/s"],
)
def test_a_shared_limit_paces_every_stream_it_covers(
    setting: str, streams: list[tuple[str, str]]
) -> None:
    # A topic's limit covers its subscriptions; the broker's covers every topic.
    rate = RATE if setting.endswith(("Msg", "_msg")) else RATE * (len(PAYLOAD) + 100)
    named = [(f"persistent://public/default/{topic}", sub) for topic, sub in streams]
    with Broker(port=0, **{setting: rate}) as broker:
        # Two streams of 2 * RATE messages each: 4 * RATE deliveries from one bucket.
        elapsed = drain_time(broker, named, 2 * RATE)
    assert elapsed >= SHARED_IDEAL_S * SLACK, f"two streams drained in {elapsed:.2f} s"
    assert elapsed < SHARED_IDEAL_S * 10
