"""Retention (issue 14): what Earliest sees and when data goes.

The rule is Pulsar's ``ManagedLedgerImpl#internalTrimLedgers`` applied to segments: whole
segments only, oldest first, never the open one, only once every durable subscription has
consumed the segment and the retention policy lets it go.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pulsar
import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from brokerlet import Broker
from brokerlet.storage import MemoryLedger, new_entry
from brokerlet.storage.marks import MarkDeletes
from brokerlet.storage.retention import (
    RetentionPolicy,
    RetentionService,
    SegmentInfo,
    segments_to_drop,
)
from brokerlet.testing.waiting import wait_until
from tests.datarules import MIB, admin, await_passes, broker_factory, client_for, drain, stats


def seg(first: int, last: int, size: int = 100, stored_ms: int = 0) -> SegmentInfo:
    return SegmentInfo(first, last, size, stored_ms)


# The rule on its own.


def test_default_policy_drops_consumed_sealed_segments_only() -> None:
    segments = [seg(0, 9), seg(10, 19), seg(20, 29)]
    zero = RetentionPolicy(0, 0)
    assert segments_to_drop(segments, 29, zero, 1) == 2  # never the open segment
    assert segments_to_drop(segments, 15, zero, 1) == 1  # 10..19 not wholly consumed
    assert segments_to_drop(segments, 8, zero, 1) == 0
    # No durable subscription: everything sealed counts as consumed (as on Pulsar).
    assert segments_to_drop(segments, None, zero, 1) == 2


def test_infinite_retention_keeps_everything() -> None:
    segments = [seg(0, 9), seg(10, 19), seg(20, 29)]
    assert segments_to_drop(segments, 29, RetentionPolicy(-1, -1), 10**12) == 0


def test_size_limit_keeps_the_newest_bytes() -> None:
    segments = [seg(i * 10, i * 10 + 9, MIB // 2) for i in range(6)]  # 3 MiB in all
    # Keep 1 MiB: drop while what is left exceeds it; time -1 never expires anything.
    assert segments_to_drop(segments, 59, RetentionPolicy(-1, 1), 0) == 4
    assert segments_to_drop(segments, 59, RetentionPolicy(-1, 3), 0) == 0
    # Consumption still bounds it.
    assert segments_to_drop(segments, 25, RetentionPolicy(-1, 1), 0) == 2


def test_time_limit_drops_segments_older_than_it() -> None:
    minute = 60_000
    segments = [seg(0, 9, stored_ms=0), seg(10, 19, stored_ms=5 * minute), seg(20, 29)]
    policy = RetentionPolicy(10, -1)
    assert segments_to_drop(segments, 29, policy, 10 * minute) == 0
    assert segments_to_drop(segments, 29, policy, 10 * minute + 1) == 1
    assert segments_to_drop(segments, 29, policy, 16 * minute) == 2
    # Either limit lets a segment go (Pulsar: over size OR expired).
    assert segments_to_drop(segments, 29, RetentionPolicy(10, 0), 1) == 2


def test_memory_ledger_trims_whole_chunks_on_the_service_pass() -> None:
    ledger = MemoryLedger(1, segment_bytes=1000)
    for index in range(30):
        ledger.append([new_entry(bytes([index]) * 200, 0, 1)], lambda _: None)
    segments = ledger.segments()
    assert [s.first_id for s in segments] == [0, 5, 10, 15, 20, 25]
    clock = [0]
    service = RetentionService(lambda _: RetentionPolicy(0, 0), 60, clock=lambda: clock[0])
    service.watch("t", ledger)
    ledger.consumed_up_to = 12  # the slowest durable cursor
    assert service.run_once() == 2  # 0..4 and 5..9; 10..14 is partly unconsumed
    assert ledger.first_entry_id == 10
    assert ledger.size_bytes == 20 * 200
    ledger.consumed_up_to = 29
    assert service.run_once() == 3  # never the open chunk
    assert ledger.first_entry_id == 25
    got: list[Any] = []
    ledger.read(0, 100, 0, got.append)
    assert [e.entry_id for e in got[0]] == [25, 26, 27, 28, 29]


def test_a_poke_asks_for_a_check_only_when_the_oldest_sealed_segment_is_consumed() -> None:
    # The topic pokes at every move of its slowest durable mark-delete position; a check
    # before that position passes the oldest sealed segment could drop nothing.
    ledger = MemoryLedger(1, segment_bytes=1000)
    service = RetentionService(lambda _: RetentionPolicy(0, 0), 60)
    service.watch("t", ledger)
    for index in range(3):
        ledger.append([new_entry(bytes([index]) * 200, 0, 1)], lambda _: None)
    ledger.consumed_up_to = 2
    service.poke("t")  # one chunk, the open one: nothing could go
    assert not service._due
    for index in range(3, 12):
        ledger.append([new_entry(bytes([index]) * 200, 0, 1)], lambda _: None)
    assert ledger.oldest_sealed_last_id == 4  # chunks 0..4, 5..9, 10..11 (open)
    ledger.consumed_up_to = 3
    service.poke("t")
    assert not service._due  # inside the oldest sealed chunk
    ledger.consumed_up_to = 4
    service.poke("t")
    assert service._due == {"t"}  # past it: check
    service._due.clear()
    for consumed in (None, 5, 9):
        ledger.consumed_up_to = consumed
        service.poke("t")
        assert not service._due  # checked for this chunk already: the periodic pass has it
    assert service.run_once(["t"]) == 2
    assert ledger.oldest_sealed_last_id is None
    for index in range(12, 16):
        ledger.append([new_entry(bytes([index]) * 200, 0, 1)], lambda _: None)
    assert ledger.oldest_sealed_last_id == 14
    ledger.consumed_up_to = 14
    service.poke("t")
    assert service._due == {"t"}  # a new oldest sealed chunk, consumed: a new check


# Through the broker with the official client.

make_broker = pytest.fixture(params=["memory", "disk"])(broker_factory)


def test_a_late_subscription_from_earliest_sees_what_another_acked(
    make_broker: Callable[..., Broker],
) -> None:
    # The bug issue 14 names: per-entry trimming hid acked entries from a late subscriber.
    broker = make_broker()
    topic = "persistent://public/default/late-earliest"
    client = client_for(broker)
    try:
        first = client.subscribe(topic, "first", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic, batching_enabled=False)
        for index in range(50):
            producer.send(f"m{index}".encode())
        assert len(drain(first)) == 50
        wait_until(
            lambda: stats(broker, topic)["subscriptions"]["first"]["msgBacklog"],
            predicate=lambda value: value == 0,
            message="acks",
        )
        late = client.subscribe(topic, "late", initial_position=pulsar.InitialPosition.Earliest)
        assert [m.data() for m in drain(late)] == [f"m{i}".encode() for i in range(50)]
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        seen = []
        while reader.has_message_available():
            seen.append(reader.read_next(2000).data())
        assert len(seen) == 50
    finally:
        client.close()


def test_consumed_segments_go_with_default_retention_but_the_open_one_stays(
    make_broker: Callable[..., Broker],
) -> None:
    broker = make_broker(segment_bytes=4096)
    topic = "persistent://public/default/default-retention"
    client = client_for(broker)
    try:
        sub = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
        # A reader at the start holds nothing back (readers do not hold data, as on Pulsar).
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        producer = client.create_producer(topic, batching_enabled=False)
        for index in range(60):
            producer.send(bytes([index]) * 500)
        before = stats(broker, topic)["storageSize"]
        assert len(drain(sub)) == 60
        wait_until(
            lambda: stats(broker, topic)["storageSize"],
            predicate=lambda value: value < before // 4,
            message="segments deleted",
        )
        current = stats(broker, topic)
        assert current["backlogSize"] == 0
        first = current["firstEntryId"]
        assert 0 < first <= 59
        late = client.subscribe(topic, "late", initial_position=pulsar.InitialPosition.Earliest)
        got = drain(late)
        # Exactly the stored entries, from a segment boundary to the end.
        assert [m.message_id().entry_id() for m in got] == list(range(first, 60))
        reader.close()
    finally:
        client.close()


def set_retention(broker: Broker, minutes: int, size_mb: int) -> requests.Response:
    body = {"retentionTimeInMinutes": minutes, "retentionSizeInMB": size_mb}
    return admin(broker, "POST", "namespaces/public/default/retention", body)


def test_namespace_infinite_retention_keeps_consumed_data(
    make_broker: Callable[..., Broker],
) -> None:
    broker = make_broker(segment_bytes=4096, retention_check_interval_in_seconds=0.05)
    assert set_retention(broker, -1, -1).status_code == 204
    topic = "persistent://public/default/infinite-retention"
    client = client_for(broker)
    try:
        sub = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic, batching_enabled=False)
        for index in range(60):
            producer.send(bytes([index]) * 500)
        assert len(drain(sub)) == 60
        size = stats(broker, topic)["storageSize"]
        await_passes(broker, "retention", 3)  # nothing may go
        assert stats(broker, topic)["storageSize"] == size
        late = client.subscribe(topic, "late", initial_position=pulsar.InitialPosition.Earliest)
        assert len(drain(late)) == 60
        # Back to "delete once consumed": the next pass frees the consumed segments.
        assert set_retention(broker, 0, 0).status_code == 204
        wait_until(
            lambda: stats(broker, topic)["storageSize"],
            predicate=lambda value: value < size // 4,
            message="retention pass",
        )
    finally:
        client.close()


def test_size_retention_keeps_about_the_limit(make_broker: Callable[..., Broker]) -> None:
    broker = make_broker(
        segment_bytes=64 * 1024,
        default_retention_time_in_minutes=-1,
        default_retention_size_in_mb=1,
        retention_check_interval_in_seconds=0.05,
    )
    topic = "persistent://public/default/size-retention"
    client = client_for(broker)
    try:
        sub = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic, batching_enabled=False)
        payload = b"x" * 8000
        for _ in range(400):  # about 3 MiB
            producer.send(payload)
        assert stats(broker, topic)["storageSize"] > 3 * MIB
        await_passes(broker, "retention", 3)
        # Unconsumed: nothing goes whatever the size.
        assert stats(broker, topic)["storageSize"] > 3 * MIB
        assert len(drain(sub, wait_ms=500)) == 400
        wait_until(
            lambda: stats(broker, topic)["storageSize"],
            predicate=lambda value: value <= MIB + 64 * 1024 + 8192,
            message="size trim",
        )
        # Pulsar drops a segment while the size *before* dropping it is over the limit, so
        # at most one segment's worth under it may remain.
        assert stats(broker, topic)["storageSize"] >= MIB - 64 * 1024 - 8192
    finally:
        client.close()


# --- the slowest mark that holds data (storage.marks) ------------------------------------

_mark_ops = st.lists(
    st.tuples(
        st.sampled_from(["set", "pop", "release", "slowest"]),
        st.sampled_from(["a", "b", "c", "d", "e"]),
        st.integers(-1, 6),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(_mark_ops)
def test_the_slowest_holding_mark_is_the_minimum_of_the_durable_marks(
    ops: list[tuple[str, str, int]],
) -> None:
    # The topic's retention point: min over durable subscriptions, readers excluded. Marks
    # move both ways (a reset cursor moves back) and many stand at the same entry.
    marks = MarkDeletes()
    model: dict[str, int] = {}
    released: set[str] = set()
    for op, name, mark in ops:
        if op == "set":
            marks[name] = mark
            model[name] = mark
        elif op == "pop":
            assert marks.pop(name, None) == model.pop(name, None)
            released.discard(name)
        elif op == "release":
            marks.release(name)
            released.add(name)
        if op == "slowest":  # asked only now and then: moves in between are kept, not walked
            holding = [m for n, m in model.items() if n not in released]
            assert marks.slowest() == (min(holding) if holding else None)
    holding = [m for n, m in model.items() if n not in released]
    assert marks.slowest() == (min(holding) if holding else None)
    assert all(marks.get(n, None) == m for n, m in model.items())
    assert len(marks) == len(model)
    # The one-holder shortcut in __setitem__ is only right while this count is exact.
    assert marks._holding == len(holding)
