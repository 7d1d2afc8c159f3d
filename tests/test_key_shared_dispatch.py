"""Key_Shared dispatch rules, driven message by message and over real sockets."""

from __future__ import annotations

import itertools
import logging
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from brokerlet import Broker
from brokerlet.actors._runtime import GeventActor
from brokerlet.actors.messages import Ack
from brokerlet.config import Settings, load_settings
from brokerlet.dispatch.consumer import ConnectionHandle, Consumer
from brokerlet.dispatch.key_shared import KeySharedRules, entry_key_hash
from brokerlet.dispatch.options import DispatchOptions
from brokerlet.dispatch.replay import ReplaySet
from brokerlet.keyshared import ConsistentHashingSelector, KeySharedMeta, sticky_key_hash
from brokerlet.testing.rawclient import RawClient
from brokerlet.transport.protocol import build_entry, encode_send, pb
from tests.dispatch_harness import LEDGER, Harness, make_keyed_entry

KEY_SHARED = pb.CommandSubscribe.Key_Shared


def keys_by_owner(
    h: Harness, consumers: list[Consumer], keys: list[str] | None = None
) -> dict[Any, list[str]]:
    """Sort candidate keys by the consumer the subscription's selector gives them to."""
    rules = h.proxy.key_shared.get()
    owned: dict[Any, list[str]] = {c.name: [] for c in consumers}
    for key in keys or [f"key-{i}" for i in range(200)]:
        owner = rules.selector.select(entry_key_hash(make_keyed_entry(0, key)))
        owned[owner.name].append(key)
    return owned


@pytest.fixture
def harness() -> Iterator[Harness]:
    h = Harness(GeventActor, sub_type=KEY_SHARED)
    yield h
    h.stop()


@pytest.mark.parametrize("barrier", [False, True], ids=["no barrier", "all-writes barrier"])
def test_one_completed_write_requests_the_next_read_without_waiting_for_the_other(
    barrier: bool,
) -> None:
    harness = Harness(
        GeventActor, sub_type=KEY_SHARED, options=DispatchOptions(completion_barrier=barrier)
    )
    try:
        _one_completed_write(harness, barrier)
    finally:
        harness.stop()


def _one_completed_write(harness: Harness, barrier: bool) -> None:
    harness.loop.proxy().auto_complete = False
    a = harness.consumer("a", 100)
    b = harness.consumer("b", 100)
    owned = keys_by_owner(harness, [a, b])
    harness.append_keyed(owned["a"][:3] + owned["b"][:3])
    harness.settle()
    first = {batch.consumer.name: batch for batch in harness.loop.proxy().batches.get()}
    assert set(first) == {"a", "b"}  # both writes in flight, neither completed

    first["b"].completion.request()  # b's write completes; a's never does
    harness.append_keyed(owned["b"][3:6])
    harness.settle()
    later = harness.sent_to(b)[3:]
    if barrier:
        assert later == [], "the barrier holds b back until a's write completes"
        first["a"].completion.request()
        harness.settle()
        assert len(harness.sent_to(b)) == 6
    else:
        assert later == [6, 7, 8]


@pytest.mark.parametrize("out_of_order", [False, True], ids=["ordered", "out of order"])
def test_a_moved_hash_waits_for_the_old_owner_to_ack(out_of_order: bool) -> None:
    settings = load_settings(env={}, overrides={"key_shared_unblocking_interval_ms": 0})
    h = Harness(GeventActor, sub_type=KEY_SHARED, settings=settings)
    meta = KeySharedMeta(allow_out_of_order=out_of_order)
    try:
        first = h.consumer("first", 100, key_shared=meta)
        keys = [f"k{i}" for i in range(40)]
        h.append_keyed(keys)
        h.settle()
        assert h.sent_to(first) == list(range(40))
        second = h.consumer("second", 100, key_shared=meta)  # takes ranges from "first"
        moved = keys_by_owner(h, [first, second], keys)["second"]
        assert moved
        h.append_keyed(moved)  # hashes that "first" still holds unacked entries of
        h.settle()
        if out_of_order:
            assert len(h.sent_to(second)) == len(moved)
            return
        assert h.sent_to(second) == [], "blocked while the old owner holds them"
        stats = h.proxy.stats().get()
        (first_stats,) = [c for c in stats["consumers"] if c["consumerName"] == "first"]
        assert first_stats["drainingHashesCount"] == len(moved)
        h.dispatcher.tell(Ack(first, [(LEDGER, i) for i in range(40)], cumulative=False))
        h.settle()
        assert h.sent_to(second) == list(range(40, 40 + len(moved)))
    finally:
        h.stop()


class KeySharedChurn(RuleBasedStateMachine):
    """Random joins, leaves, publishes, acks and flows: keys stay exclusive and in order,
    and once every pending entry is acked nothing stays blocked."""

    def __init__(self) -> None:
        super().__init__()
        self.h = Harness(
            GeventActor,
            sub_type=KEY_SHARED,
            settings=load_settings(
                env={},
                overrides={
                    "dispatcher_max_read_batch_size": 7,
                    "key_shared_unblocking_interval_ms": 0,
                    "subscription_key_shared_consistent_hashing_replica_points": 5,
                },
            ),
        )
        self.live: list[Consumer] = []
        self.names = itertools.count()
        self.keys = [f"key{i}" for i in range(12)]
        self.key_of: list[str] = []  # entry id -> its key
        self.published = 0

    def teardown(self) -> None:
        self.h.stop()

    @rule(permits=st.integers(1, 15))
    def join(self, permits: int) -> None:
        if len(self.live) < 4:
            self.live.append(self.h.consumer(f"c{next(self.names)}", permits))

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 3))
    def leave(self, index: int) -> None:
        self.h.remove(self.live.pop(index % len(self.live)))

    @rule(keys=st.lists(st.integers(0, 11), min_size=1, max_size=8))
    def publish(self, keys: list[int]) -> None:
        self.h.append_keyed([self.keys[k] for k in keys])
        self.key_of.extend(self.keys[k] for k in keys)
        self.published += len(keys)

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 3), share=st.floats(0, 1))
    def ack(self, index: int, share: float) -> None:
        consumer = self.live[index % len(self.live)]
        mine = sorted(e for e, c in self.h.proxy.pending_owner.get().items() if c is consumer)
        chosen = mine[: round(len(mine) * share)]
        if chosen:
            self.h.dispatcher.tell(Ack(consumer, [(LEDGER, e) for e in chosen], cumulative=False))

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 3), permits=st.integers(1, 10))
    def flow(self, index: int, permits: int) -> None:
        self.live[index % len(self.live)].flow(permits)

    @rule()
    def drain(self) -> None:
        """Ack everything and give permits: every published entry must then go out."""
        if not self.live:
            self.join(10)
        for _ in range(self.published + 5):
            owners = self.h.proxy.pending_owner.get()
            by_consumer: dict[Any, list[int]] = defaultdict(list)
            for entry_id, consumer in owners.items():
                by_consumer[consumer].append(entry_id)
            for consumer, ids in by_consumer.items():
                self.h.dispatcher.tell(Ack(consumer, [(LEDGER, e) for e in ids], cumulative=False))
            for consumer in self.live:
                consumer.flow(max(0, 5 - consumer.permits))
            self.h.settle()
            done = not owners and self.h.proxy.cursor.get().mark_delete == self.published - 1
            if done:
                return
        raise AssertionError("entries still blocked after every pending entry was acked")

    @invariant()
    def keys_exclusive_and_in_order(self) -> None:
        h = self.h
        h.settle()
        owners = h.proxy.pending_owner.get()
        rules = h.proxy.key_shared.get()
        if rules is None:
            return
        holders: dict[int, set[int]] = defaultdict(set)
        for entry_id, consumer in owners.items():
            holders[rules.pending_hashes.get(entry_id, 0)].add(id(consumer))
        assert all(len(c) == 1 for h_, c in holders.items() if h_), "a key at two consumers"
        assert h.total == sum(c.permits for c in self.live)
        # In order: across every consumer, each key's entries first go out in entry order
        # (a redelivery after a consumer left may repeat an earlier one; it is not first).
        first_out: set[int] = set()
        latest: dict[str, int] = {}
        for batch in h.loop.proxy().batches.get():
            for entry in batch.entries:
                if entry.entry_id in first_out:
                    continue
                first_out.add(entry.entry_id)
                key = self.key_of[entry.entry_id]
                assert entry.entry_id > latest.get(key, -1), (
                    f"{key}: entry {entry.entry_id} first went out after {latest[key]}"
                )
                latest[key] = entry.entry_id


KeySharedChurn.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=25,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestKeySharedChurn = KeySharedChurn.TestCase


# Sockets: one consumer's socket paused; the other keeps receiving its keys.

HEALTHY = 1024
SLOW = 4096


def keys_in(low: int, high: int, count: int) -> list[bytes]:
    found = []
    for i in itertools.count():
        key = f"key-{i}".encode()
        if low <= sticky_key_hash(key) % 65536 <= high:
            found.append(key)
            if len(found) == count:
                return found
    raise AssertionError("unreachable")


def subscribe_sticky(client: RawClient, topic: str, low: int, high: int) -> None:
    meta = pb.KeySharedMeta(key_shared_mode=pb.STICKY)
    meta.hash_ranges.add(start=low, end=high)
    client.send_command(
        pb.BaseCommand(
            type=pb.BaseCommand.SUBSCRIBE,
            subscribe=pb.CommandSubscribe(
                topic=topic,
                subscription="ks",
                sub_type=KEY_SHARED,
                consumer_id=1,
                request_id=1,
                initial_position=pb.CommandSubscribe.Earliest,
                key_shared_meta=meta,
            ),
        )
    )
    client.expect(pb.BaseCommand.SUCCESS)


def send_keyed(producer: RawClient, sequence_id: int, key: bytes, size: int) -> bytes:
    metadata = pb.MessageMetadata(
        producer_name="p", sequence_id=sequence_id, publish_time=0, partition_key=key.decode()
    )
    header, body = encode_send(1, sequence_id, 1, build_entry(metadata, b"v" * size))
    return header + body


@pytest.mark.parametrize(
    "barrier",
    [
        False,
        pytest.param(
            True,
            marks=pytest.mark.xfail(
                strict=True,
                raises=TimeoutError,  # the healthy consumer's receive: nothing reaches it
                reason="an all-writes barrier lets the paused socket stall everyone",
            ),
        ),
    ],
    ids=["no barrier", "all-writes barrier"],
)
def test_a_paused_consumer_does_not_stall_the_healthy_one(barrier: bool) -> None:
    topic = "persistent://public/default/ks-paused"
    healthy_keys = keys_in(0, 32767, 8)
    slow_keys = keys_in(32768, 65535, 8)
    # Pulsar 5.0's look-ahead defaults (4,000 per consumer, 40,000 per subscription): with
    # 4.x's 2,000 the 4,096 entries held for the paused consumer stopped normal reads and
    # held back the healthy consumer's last messages (issue 10).
    with (
        Broker(
            port=0,
            so_sndbuf=16384,
            dispatch_options=DispatchOptions(completion_barrier=barrier),
        ) as broker,
        RawClient(broker.address, timeout=10) as producer,
        RawClient(broker.address, timeout=10) as healthy,
        RawClient(broker.address, timeout=10, rcvbuf=16384) as slow,
    ):
        for client in (producer, healthy, slow):
            client.handshake()
        subscribe_sticky(healthy, topic, 0, 32767)
        subscribe_sticky(slow, topic, 32768, 65535)
        healthy.flow(1, HEALTHY)
        slow.flow(1, SLOW)  # then the slow socket is never read until resumed
        producer.create_producer(topic, 1)
        sequence = itertools.count()
        for n in range(HEALTHY):  # the healthy key range is spread through the slow stream
            for k in range(4):
                producer.send_raw(send_keyed(producer, next(sequence), slow_keys[k], 8192))
            producer.send_raw(send_keyed(producer, next(sequence), healthy_keys[n % 8], 128))
        for _ in range(HEALTHY + SLOW):
            producer.expect(pb.BaseCommand.SEND_RECEIPT)

        got = healthy.receive(1, HEALTHY, timeout=10)
        assert [m.sequence_id % 5 for m in got] == [4] * HEALTHY
        assert [m.sequence_id for m in got] == sorted(m.sequence_id for m in got)
        stats = broker.topic_stats(topic)
        assert stats is not None
        consumers = stats["subscriptions"]["ks"]["consumers"]
        paused = [c for c in consumers if c["sendBlocked"] or not c["writable"]]
        assert len(paused) == 1, "the slow socket really was full"

        rest = slow.receive(1, SLOW, timeout=30)  # resume: everything, in order
        assert [m.sequence_id for m in rest] == [n for n in range(HEALTHY * 5) if n % 5 != 4]


def test_a_consumer_whose_points_all_collide_is_logged_as_owning_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Pulsar's ConsistentHashingStickyKeyConsumerSelector logs a consumer that got no
    # range because every one of its points was taken; the check reads the snapshot's
    # distinct owners rather than working out every consumer's ranges.
    caplog.set_level(logging.WARNING, logger="brokerlet")
    rules = KeySharedRules(KeySharedMeta(), Settings(), lambda: None)
    rules.selector = ConsistentHashingSelector(replica_points=1, range_size=8)
    by_point: dict[int, list[str]] = {}
    for i in range(50):
        name = f"c{i}"
        by_point.setdefault(rules.selector.point_slots(_named(name), 0)[0], []).append(name)
    first, second = next(names for names in by_point.values() if len(names) >= 2)[:2]
    rules.add_consumer(_named(first), KeySharedMeta())
    assert not any("got no hash range" in m for m in caplog.messages)
    rules.add_consumer(_named(second), KeySharedMeta())
    assert sum("got no hash range" in m for m in caplog.messages) == 1
    assert second in caplog.messages[-1]


def _named(name: str) -> Consumer:
    # Nothing is written to it here: the channel and the event loop are never used.
    handle = ConnectionHandle(peer=f"peer-{name}", channel=None, event_loop=None)  # type: ignore[arg-type]
    return Consumer(
        consumer_id=0,
        name=name,
        topic="persistent://public/default/t",
        subscription="s",
        sub_type=pb.CommandSubscribe.Key_Shared,
        priority=0,
        connection=handle,
    )


@pytest.mark.parametrize("range_size", [64, 1 << 16])
def test_a_newcomer_drains_exactly_the_pending_hashes_it_takes(range_size: int) -> None:
    # PersistentStickyKeyDispatcherMultipleConsumers: when a consumer joins, the hashes it
    # takes that another consumer still has pending acks on wait until those are acked.
    rules = KeySharedRules(KeySharedMeta(), Settings(), lambda: None)
    rules.selector = ConsistentHashingSelector(replica_points=5, range_size=range_size)
    holders = [_named(f"holder-{i}") for i in range(3)]
    for holder in holders:
        rules.add_consumer(holder, KeySharedMeta())
    hashes = [*range(1, 2 * range_size), *(range_size * k - 1 for k in range(2, 40))]
    entry_ids = itertools.count()
    held_by: dict[int, Consumer | None] = {}
    for key_hash in hashes:
        holder = rules.selector.select(key_hash)
        assert holder is not None
        entry_id = next(entry_ids)
        holder.pending[entry_id] = 1
        rules.pending_hashes[entry_id] = key_hash
        held_by[key_hash] = holder
    newcomer = _named("newcomer")
    rules.add_consumer(newcomer, KeySharedMeta())
    taken = {h for h in hashes if rules.selector.select(h) is newcomer}
    assert taken, "the newcomer owns some of the hashes"
    assert {h for h in hashes if rules.draining.should_block(newcomer, h)} == taken
    for key_hash in taken:  # and the old holder is not held back on its own hashes
        assert not rules.draining.should_block(held_by[key_hash], key_hash)


class _CountingReplay(ReplaySet):
    """A replay set that counts the per-entry hash lookups a selection makes."""

    lookups = 0

    def key_hash(self, entry_id: int) -> int:
        self.lookups += 1
        return super().key_hash(entry_id)


def _replay_scene() -> tuple[KeySharedRules, Consumer, Consumer, list[int], list[int]]:
    """Two consumers and hashes of each: a slow one's and a ready one's."""
    rules = KeySharedRules(KeySharedMeta(), Settings(), lambda: None)
    slow, ready = _named("slow"), _named("ready")
    for consumer in (slow, ready):
        rules.add_consumer(consumer, KeySharedMeta())
    slow_hashes: list[int] = []
    ready_hashes: list[int] = []
    for key_hash in range(1, 1 << 31, 7_919_993):
        owner = rules.selector.select(key_hash)
        (slow_hashes if owner is slow else ready_hashes).append(key_hash)
    return rules, slow, ready, slow_hashes[:20], ready_hashes[:2]


def test_a_replay_set_of_blocked_hashes_is_answered_without_a_walk() -> None:
    # The replay set can hold a slow consumer's entries up to the look-ahead limit, and
    # select_replay runs at every pass (replay_ready too): with none of its hashes able to
    # go, the answer comes from the distinct hashes, not from every entry.
    rules, slow, ready, slow_hashes, _ = _replay_scene()
    replay = _CountingReplay()
    for entry_id in range(2_000):
        replay.add(entry_id, slow_hashes[entry_id % len(slow_hashes)])
    assert rules.select_replay(replay, {slow: 0, ready: 100}, 100) == []
    assert replay.lookups == 0
    # An entry without a hash can always go: then the entries are walked.
    replay.add(5_000, 0)
    assert rules.select_replay(replay, {slow: 0, ready: 100}, 100) == [5_000]


def test_replay_selection_with_one_open_hash_among_blocked_ones() -> None:
    rules, slow, ready, slow_hashes, ready_hashes = _replay_scene()
    replay = ReplaySet()
    for entry_id in range(200):
        replay.add(entry_id, slow_hashes[entry_id % len(slow_hashes)])
    for entry_id in (50, 120, 199):
        replay.discard(entry_id)
        replay.add(entry_id, ready_hashes[0])
    budgets = {slow: 0, ready: 2}
    assert rules.select_replay(replay, budgets, 100) == [50, 120]
    assert budgets[ready] == 0
    # With permits on the slow consumer too, everything goes in entry order.
    assert rules.select_replay(replay, {slow: 500, ready: 500}, 10) == list(range(10))
