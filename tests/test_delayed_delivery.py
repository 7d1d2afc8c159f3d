"""Delayed delivery (issue 13): ``deliver_at_time`` holds messages on Shared and Key_Shared.

Pulsar's rule (``PersistentDispatcherMultipleConsumers`` with
``InMemoryDelayedDeliveryTracker``): only the multi-consumer dispatchers track delays;
Exclusive and Failover deliver at once. Every wait here is bounded; none is a sleep.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pulsar
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brokerlet import Broker
from brokerlet.config import Settings
from brokerlet.dispatch.delayed import DelayedDelivery, DelayTracker
from brokerlet.dispatch.replay import ReplaySet
from brokerlet.storage.cursor import Cursor
from brokerlet.storage.ledger import PLAIN_UNHASHED, Entry
from brokerlet.testing.process import BrokerletProcess
from brokerlet.transport.protocol import (
    build_entry,
    deliver_at_time,
    may_deliver_later,
    pb,
    publish_time,
)


def _entry(entry_id: int, deliver_at: int | None = None) -> Entry:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=entry_id, publish_time=1)
    if deliver_at is not None:
        metadata.deliver_at_time = deliver_at
    data = build_entry(metadata, b"x")
    return Entry(0, entry_id, data, 0, 1)


def test_codec_reads_deliver_at_and_publish_time_without_a_full_decode() -> None:
    metadata = pb.MessageMetadata(
        producer_name="p\x98\x01", sequence_id=1, publish_time=1_700_000_000_123
    )
    entry = build_entry(metadata, b"payload")
    assert deliver_at_time(entry) == 0  # the tag bytes inside a string are not the field
    assert publish_time(entry) == 1_700_000_000_123
    metadata.deliver_at_time = 1_800_000_000_000
    assert deliver_at_time(build_entry(metadata, b"p")) == 1_800_000_000_000
    metadata.deliver_at_time = -5  # bad input: deliver now
    assert deliver_at_time(build_entry(metadata, b"p")) == 0
    assert deliver_at_time(b"\x00\x00\x00\x09ab") == 0  # truncated metadata: no delay


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.none() | st.integers(-(1 << 63), (1 << 63) - 1),  # deliver_at_time
            st.binary(max_size=8).map(lambda name: name.decode("latin-1")),  # producer name
            st.integers(0, (1 << 64) - 1),  # publish_time, whose varint may hold the tag
        ),
        max_size=5,
    ),
    st.binary(max_size=6),  # a truncated or foreign entry after them
)
def test_the_read_screen_never_passes_a_read_with_a_delivery_time(
    specs: list[tuple[int | None, str, int]], odd: bytes
) -> None:
    # DelayedDelivery.admit skips its per-entry reading when the screen says no entry of a
    # read can be held: that must never be said of a read that holds one.
    entries = []
    for deliver_at, name, published in specs:
        metadata = pb.MessageMetadata(producer_name=name, sequence_id=1, publish_time=published)
        if deliver_at is not None:
            metadata.deliver_at_time = deliver_at
        entries.append(build_entry(metadata, b"\x98\x01"))  # the tag in a payload is no field
    for read in (entries, [*entries, odd]):
        if any(deliver_at_time(entry) for entry in read):
            assert may_deliver_later(read)


def test_a_read_without_delivery_times_passes_the_screen_whole() -> None:
    entries = [_entry(entry_id).data for entry_id in range(3)]
    assert not may_deliver_later(entries)
    assert may_deliver_later([*entries, _entry(3, 10).data])
    assert may_deliver_later([*entries, b"\x00"])  # too short to say: looked at one by one


def test_tracker_orders_by_time_and_releases_only_what_is_due() -> None:
    tracker = DelayTracker()
    for entry_id, at in [(5, 3000), (1, 1000), (9, 2000), (2, 1000)]:
        tracker.add(at, entry_id)
    assert tracker.next_time() == 1000
    assert tracker.pop_due(999) == []
    assert sorted(tracker.pop_due(1000)) == [1, 2]
    assert tracker.pop_due(10_000) == [9, 5]
    assert len(tracker) == 0


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def _filter(
    clock: _Clock, *, applies: bool = True
) -> tuple[DelayedDelivery, ReplaySet, Cursor, list[float]]:
    replay = ReplaySet()
    cursor = Cursor(-1)
    wakes: list[float] = []
    rule = DelayedDelivery(
        Settings(),
        applies=lambda: applies,
        replay=replay,
        cursor=cursor,
        wake_after=wakes.append,
        clock=clock,
    )
    return rule, replay, cursor, wakes


def test_filter_holds_future_entries_without_blocking_later_ones() -> None:
    clock = _Clock()
    rule, replay, cursor, wakes = _filter(clock)
    now_ms = 1_000_000
    entries = [
        _entry(0)._replace(key_hash=PLAIN_UNHASHED),  # marked plain on SEND: no delivery time
        _entry(1, now_ms + 5_000),
        _entry(2, now_ms - 86_400_000),  # in the past: at once
        _entry(3, now_ms + 500),  # within a tick: at once (Pulsar's non-strict cut-off)
        _entry(4, now_ms + 10 * 365 * 86_400_000),  # ten years ahead: held, counted
        _entry(5)._replace(key_hash=77),  # a keyed SEND's kept hash: plain too
    ]
    kept = rule.admit(entries, replay=False)
    assert [e.entry_id for e in kept] == [0, 2, 3, 5]
    assert rule.delayed == 2
    assert wakes == [5_000.0]
    assert rule.admit([entries[1]], replay=True) == [entries[1]]  # a replay is due already
    clock.now += 4.999
    rule.release_due()
    assert not replay
    cursor.ack(4)  # acked while held: never delivered
    clock.now += 0.001
    rule.release_due()
    assert list(replay) == [1]
    assert rule.delayed == 1
    assert wakes[-1] == 3_600_000.0  # the far one is looked at again in an hour, no sooner


def test_filter_does_nothing_on_exclusive_and_failover() -> None:
    rule, _replay, _cursor, wakes = _filter(_Clock(), applies=False)
    entries = [_entry(0, 10**13)]
    assert rule.admit(entries, replay=False) == entries
    assert rule.delayed == 0
    assert wakes == []


def test_disabled_by_setting() -> None:
    rule = DelayedDelivery(
        Settings(delayed_delivery_enabled=False),
        applies=lambda: True,
        replay=ReplaySet(),
        cursor=Cursor(-1),
        wake_after=lambda _ms: None,
    )
    entries = [_entry(0, 10**13)]
    assert rule.admit(entries, replay=False) == entries


# The official client.


def _receive(consumer: pulsar.Consumer, timeout_ms: int) -> pulsar.Message | None:
    try:
        return consumer.receive(timeout_ms)
    except pulsar.Timeout:
        return None


@pytest.mark.official
@pytest.mark.parametrize(
    "sub_type",
    [pulsar.ConsumerType.Shared, pulsar.ConsumerType.KeyShared],
    ids=["shared", "key_shared"],
)
def test_deliver_after_two_seconds_arrives_then_and_not_before(
    client: pulsar.Client, topic: str, sub_type: pulsar.ConsumerType
) -> None:
    consumer = client.subscribe(topic, "sub", consumer_type=sub_type)
    producer = client.create_producer(topic, batching_enabled=False)
    sent = time.time()
    producer.send(b"later", deliver_after=timedelta(seconds=2))
    producer.send(b"now")
    first = _receive(consumer, 5_000)
    assert first is not None
    assert first.data() == b"now", "a delayed entry blocked a later one"
    consumer.acknowledge(first)
    later = _receive(consumer, 6_000)
    arrived = time.time()
    assert later is not None, "the delayed message never came"
    assert later.data() == b"later"
    assert arrived - sent >= 2.0 - 0.01, f"delivered {arrived - sent:.3f} s after send"
    assert arrived - sent < 4.0
    consumer.acknowledge(later)


@pytest.mark.official
@pytest.mark.parametrize("sub_type", [pulsar.ConsumerType.Exclusive, pulsar.ConsumerType.Failover])
def test_exclusive_and_failover_deliver_at_once(
    client: pulsar.Client, topic: str, sub_type: pulsar.ConsumerType
) -> None:
    consumer = client.subscribe(topic, "sub", consumer_type=sub_type)
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"held elsewhere", deliver_after=timedelta(minutes=10))
    message = _receive(consumer, 3_000)
    assert message is not None
    assert message.data() == b"held elsewhere"


@pytest.mark.official
def test_acked_while_delayed_never_arrives_and_stats_count_it(
    broker: Broker, client: pulsar.Client, topic: str
) -> None:
    consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared)
    producer = client.create_producer(topic, batching_enabled=False)
    far = producer.send(b"years ahead", deliver_at=int(time.time() * 1000) + 5 * 365 * 86_400_000)
    soon = producer.send(b"soon", deliver_after=timedelta(milliseconds=1_500))
    producer.send(b"past", deliver_at=int(time.time() * 1000) - 3_600_000)
    message = _receive(consumer, 3_000)
    assert message is not None
    assert message.data() == b"past"
    consumer.acknowledge(message)
    stats = broker.topic_stats(topic)
    assert stats is not None
    sub = stats["subscriptions"]["sub"]
    assert sub["msgDelayed"] == 2
    assert sub["msgBacklogNoDelayed"] == sub["msgBacklog"] - 2
    consumer.acknowledge(soon)  # acks work on delayed messages
    assert _receive(consumer, 2_500) is None, "an acked delayed message was delivered"
    del far


@pytest.mark.official
def test_delayed_messages_survive_a_serve_restart_neither_lost_nor_early(tmp_path: Path) -> None:
    topic = "persistent://public/default/delayed-restart"
    with BrokerletProcess(data_dir=tmp_path) as broker:  # `brokerlet serve`
        broker.start()
        client = pulsar.Client(broker.service_url, operation_timeout_seconds=5)
        consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared)
        producer = client.create_producer(topic, batching_enabled=False)
        due = int(time.time() * 1000) + 4_000
        for i in range(3):
            producer.send(f"d{i}".encode(), deliver_at=due)
        producer.send(b"plain")
        message = _receive(consumer, 3_000)
        assert message is not None
        assert message.data() == b"plain"
        consumer.acknowledge(message)
        client.close()
    with BrokerletProcess(data_dir=tmp_path) as broker:
        broker.start()
        client = pulsar.Client(broker.service_url, operation_timeout_seconds=5)
        consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared)
        got = []
        end = time.monotonic() + 10
        while len(got) < 3 and time.monotonic() < end:
            message = _receive(consumer, 500)
            if message is not None:
                assert time.time() * 1000 >= due - 10, "delivered before its time"
                got.append(message.data())
                consumer.acknowledge(message)
        assert sorted(got) == [b"d0", b"d1", b"d2"]
        client.close()
