"""Message TTL (issue 14): Pulsar's PersistentMessageExpiryMonitor.

Every messageExpiryCheckIntervalInMinutes, messages older than the TTL by publish time are
acknowledged on every subscription and counted (totalMsgExpired, msgRateExpired).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pulsar
import pytest

from brokerlet import Broker
from brokerlet.storage import MemoryLedger, NewEntry, new_entry
from brokerlet.storage.expiry import newest_published_before
from brokerlet.testing.waiting import wait_until
from brokerlet.transport.protocol import pb
from tests.datarules import admin, await_passes, broker_factory, client_for, drain, stats

make_broker = pytest.fixture(params=["memory", "disk"])(broker_factory)

FAST_CHECK = 0.2 / 60  # minutes: a pass every 0.2 s


def entry_published_at(ms: int) -> NewEntry:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=ms)
    encoded = metadata.SerializeToString()
    data = len(encoded).to_bytes(4, "big") + encoded + b"payload"
    return new_entry(data, 0, 1)


def test_the_search_finds_the_newest_entry_published_before_the_cutoff() -> None:
    ledger = MemoryLedger(1)
    ledger.append([entry_published_at(1000 + 10 * i) for i in range(100)], lambda _: None)
    assert newest_published_before(ledger, 1000) == -1  # nothing strictly older
    assert newest_published_before(ledger, 1001) == 0
    assert newest_published_before(ledger, 1500) == 49
    assert newest_published_before(ledger, 1505) == 50
    assert newest_published_before(ledger, 10**9) == 99
    assert newest_published_before(ledger, 1505, low=60) == 59  # nothing after low


def sub_stats(broker: Broker, topic: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = stats(broker, topic)["subscriptions"][name]
    return result


def test_ttl_acknowledges_old_messages_on_every_subscription(
    make_broker: Callable[..., Broker],
) -> None:
    broker = make_broker(
        ttl_duration_default_in_seconds=1, message_expiry_check_interval_in_minutes=FAST_CHECK
    )
    topic = "persistent://public/default/ttl-every-sub"
    client = client_for(broker)
    try:
        connected = client.subscribe(
            topic,
            "connected",
            initial_position=pulsar.InitialPosition.Earliest,
            consumer_type=pulsar.ConsumerType.Shared,
        )
        idle = client.subscribe(topic, "idle", initial_position=pulsar.InitialPosition.Earliest)
        idle.close()  # a durable subscription with nobody attached
        producer = client.create_producer(topic, batching_enabled=False)
        for index in range(10):
            producer.send(f"old-{index}".encode())
        # Delivered to "connected" but never acknowledged.
        assert len(drain(connected, ack=False)) == 10

        def expired() -> bool:
            subs = stats(broker, topic)["subscriptions"]
            return all(subs[n]["msgBacklog"] == 0 for n in ("connected", "idle"))

        wait_until(expired, message="TTL expiry on both subscriptions", timeout=15)
        for name in ("connected", "idle"):
            sub = sub_stats(broker, topic, name)
            assert sub["totalMsgExpired"] == 10, sub
            assert sub["lastExpireTimestamp"] > 0
            assert "msgRateExpired" in sub
        # Newer messages are not expired: they arrive on a fresh consumer of "idle".
        producer.send(b"new")
        again = client.subscribe(topic, "idle")
        assert [m.data() for m in drain(again)] == [b"new"]
    finally:
        client.close()


def test_namespace_message_ttl_overrides_the_broker_default(
    make_broker: Callable[..., Broker],
) -> None:
    broker = make_broker(message_expiry_check_interval_in_minutes=FAST_CHECK)
    topic = "persistent://public/default/ttl-namespace"
    client = client_for(broker)
    try:
        sub = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic, batching_enabled=False)
        for index in range(5):
            producer.send(f"m{index}".encode())
        sent = time.monotonic()
        # Older than the TTL set next, with several expiry passes meanwhile under no TTL at all.
        await_passes(broker, "expiry", 3)
        wait_until(lambda: time.monotonic() - sent > 1.5, message="the messages to age past 1.5 s")
        assert sub_stats(broker, topic, "sub")["msgBacklog"] == 5  # broker default: no TTL
        assert admin(broker, "POST", "namespaces/public/default/messageTTL", 1).status_code == 204
        wait_until(
            lambda: sub_stats(broker, topic, "sub")["msgBacklog"],
            predicate=lambda value: value == 0,
            message="namespace TTL",
        )
        assert sub_stats(broker, topic, "sub")["totalMsgExpired"] == 5
        sub.close()
    finally:
        client.close()


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        (
            "retention",
            {"retentionTimeInMinutes": -2, "retentionSizeInMB": 0},
            "retentionTimeInMinutes",
        ),
        ("retention", {"retentionTimeInMinutes": 0, "retentionSizeInMB": -5}, "retentionSizeInMB"),
        (
            "retention",
            {"retentionTimeInMinutes": 2**40, "retentionSizeInMB": 0},
            "retentionTimeInMinutes",
        ),
        (
            "retention",
            {"retentionTimeInMinutes": 0, "retentionSizeInMB": 2**62},
            "retentionSizeInMB",
        ),
        ("retention", {"retentionTimeInMinutes": "ten"}, "retentionTimeInMinutes"),
        ("messageTTL", -1, "message TTL"),
        ("messageTTL", 2**40, "messageTTL"),
        ("messageTTL", "soon", "messageTTL"),
    ],
)
def test_bad_retention_or_ttl_is_refused_naming_the_field(
    path: str, body: object, field: str
) -> None:
    broker = Broker(port=0)
    broker.start()
    try:
        answer = admin(broker, "POST", f"namespaces/public/default/{path}", body)
        assert answer.status_code in (400, 412), answer.text
        assert field in answer.json()["reason"]
        # Nothing was stored.
        assert admin(broker, "GET", f"namespaces/public/default/{path}").json() is None
    finally:
        broker.stop()
