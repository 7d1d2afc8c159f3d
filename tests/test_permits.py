"""Permit accounting: FLOW outside the dispatcher actor, exact totals, unacked limits.

Tests marked with the ``runtime`` fixture run on gevent and on real threads, because the
atomicity they claim must not depend on cooperative scheduling.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from brokerlet.actors._runtime import GeventActor
from brokerlet.actors.messages import Ack, ReadIds, RemoveConsumer
from brokerlet.config import load_settings
from brokerlet.storage.ledger import Entry
from brokerlet.transport.protocol import build_entry, pb
from tests.conftest import Runtime
from tests.dispatch_harness import LEDGER, Append, Block, Harness


def finished(task: Any, timeout: float = 5) -> bool:
    """Join a thread or greenlet from ``Runtime.spawn``; whether it really ended."""
    task.join(timeout)
    return not task.is_alive() if isinstance(task, threading.Thread) else bool(task.ready())


@pytest.fixture
def harness(runtime: Runtime) -> Iterator[Harness]:
    h = Harness(runtime.actor_class)
    yield h
    h.stop()


def hold_busy(runtime: Runtime, harness: Harness) -> tuple[Any, Any]:
    """Park the dispatcher actor inside a handler; returns (entered, release) events."""
    entered, release = runtime.event_class(), runtime.event_class()
    harness.dispatcher.tell(Block(entered, release))
    assert entered.wait(5)
    return entered, release


def test_flow_reaches_the_total_while_the_dispatcher_is_busy_then_removal_debits(
    runtime: Runtime, harness: Harness
) -> None:
    first = harness.consumer("a", 10)
    second = harness.consumer("b", 20)
    harness.settle()
    _, release = hold_busy(runtime, harness)
    try:
        # The FLOW lands on the connection actor's side: no dispatcher message is needed.
        flows = [runtime.spawn(first.flow, 400), runtime.spawn(second.flow, 600)]
        assert all(finished(task) for task in flows), "a FLOW did not return"
        assert first.permits == 410
        assert second.permits == 620
        assert first.accounted
        assert second.accounted
    finally:
        release.set()
    assert harness.total == 1030
    harness.remove(first)
    assert harness.total == second.permits == 620


def test_total_is_read_while_the_dispatcher_is_busy(runtime: Runtime, harness: Harness) -> None:
    consumer = harness.consumer("a", 5)
    harness.settle()
    _, release = hold_busy(runtime, harness)
    try:
        assert finished(runtime.spawn(consumer.flow, 95)), "the FLOW did not return"
        # Read the total object itself, not through the (busy) actor.
        assert consumer._total is not None
        assert consumer._total.value == 100
    finally:
        release.set()


def test_dispatch_to_a_consumer_then_its_removal_keeps_the_invariant(
    runtime: Runtime, harness: Harness
) -> None:
    a = harness.consumer("a", 10)
    b = harness.consumer("b", 15)
    c = harness.consumer("c", 20)
    harness.settle()
    c.debit(50)  # what dispatching 50 messages to c does to the accounts
    assert c.permits == -30
    assert harness.total == -5
    harness.remove(c)
    assert harness.total == 25 == a.permits + b.permits


def test_very_large_flows_do_not_overflow(harness: Harness) -> None:
    consumer = harness.consumer("big")
    for _ in range(3):
        consumer.flow(2**31 - 1)
    assert consumer.permits == 3 * (2**31 - 1)
    assert harness.total == 3 * (2**31 - 1)
    harness.remove(consumer)
    assert harness.total == 0


def test_flow_to_a_blocked_consumer_then_unblock_then_remove_loses_nothing(
    runtime: Runtime, harness: Harness
) -> None:
    stay = harness.consumer("stay", 7)
    blocked = harness.consumer("blocked", 3)
    harness.settle()
    _, release = hold_busy(runtime, harness)
    try:
        blocked.block()
        blocked.flow(100)
        assert blocked.permits == 3
        assert blocked.parked_permits == 100
        blocked.unblock()
        assert blocked.permits == 103
        assert blocked._total is not None
        assert blocked._total.value == 110
        harness.dispatcher.tell(RemoveConsumer(blocked))
    finally:
        release.set()
    harness.settle()
    assert harness.total == stay.permits == 7


def test_removing_a_consumer_twice_never_makes_unacked_negative(harness: Harness) -> None:
    consumer = harness.consumer("twice", 10)
    harness.append(4)
    harness.settle()
    assert harness.sent_to(consumer) == [0, 1, 2, 3]
    assert harness.proxy.unacked.get() == 4
    harness.remove(consumer)
    harness.remove(consumer)
    assert harness.proxy.unacked.get() == 0
    assert consumer.unacked == 0


def test_unacked_limit_blocks_parks_flows_and_unblocks_at_half() -> None:
    h = Harness(
        GeventActor,
        settings=load_settings(
            env={},
            overrides={
                "max_unacked_messages_per_consumer": 10,
            },
        ),
    )
    try:
        consumer = h.consumer("limited", 100)
        h.append(30)
        h.settle()
        assert h.sent_to(consumer) == list(range(10))
        assert consumer.blocked
        consumer.flow(50)
        assert consumer.parked_permits == 50
        assert consumer.permits == 90
        # Acking 4 leaves 6 unacked: still above half the limit.
        h.dispatcher.tell(Ack(consumer, [(LEDGER, i) for i in range(4)], cumulative=False))
        h.settle()
        assert consumer.blocked
        h.dispatcher.tell(Ack(consumer, [(LEDGER, 4)], cumulative=False))
        h.settle()
        # Unblocked at 5 unacked: the parked 50 joined the balance and dispatch went on.
        assert consumer.parked_permits == 0
        sent = h.sent_to(consumer)
        assert sent[:15] == list(range(15))
        assert consumer.permits == 90 + 50 - (len(sent) - 10)
        assert h.total == consumer.permits
    finally:
        h.stop()


def test_subscription_unacked_limit_blocks_normal_reads() -> None:
    h = Harness(
        GeventActor,
        settings=load_settings(
            env={},
            overrides={
                "max_unacked_messages_per_subscription": 6,
                "dispatcher_max_read_batch_size": 3,
            },
        ),
    )
    try:
        a = h.consumer("a", 100)
        h.append(20)
        h.settle()
        assert len(h.sent_to(a)) == 6
        assert h.proxy.blocked_on_unacked.get()
        h.dispatcher.tell(Ack(a, [(LEDGER, i) for i in range(3)], cumulative=False))
        h.settle()
        assert len(h.sent_to(a)) == 9
    finally:
        h.stop()


def _read_sizes(h: Harness) -> list[int]:
    """Entries each read asked for, in order (a replay read: its ids)."""
    return [
        len(read.entry_ids) if isinstance(read, ReadIds) else read.max_entries
        for read in h.topic.proxy().reads.get()
    ]


@pytest.mark.parametrize("precise", [True, False])
def test_batch_entries_read_as_many_as_the_permits_cover(precise: bool) -> None:
    # Pulsar's calculateToRead (PersistentDispatcherMultipleConsumers): with
    # preciseDispatcherFlowControl a read asks for ceil(permits / the consumer's average
    # messages per entry) entries; without it one entry per permit, and what the permits do
    # not cover goes to the replay set to be read again.
    settings = load_settings(env={}, overrides={"precise_dispatcher_flow_control": precise})
    h = Harness(GeventActor, settings=settings)
    try:
        consumer = h.consumer("c", 1000)
        h.append(300, num_messages=100)
        h.settle()
        assert h.sent_to(consumer) == list(range(10))  # the first read knew no average
        assert consumer.messages_per_entry == 100
        for _ in range(4):
            consumer.flow(500)
            h.settle()
        assert h.sent_to(consumer) == list(range(30)), "the same entries, in order"
        if precise:
            assert _read_sizes(h) == [100, 5, 5, 5, 5]
        else:
            assert _read_sizes(h) == [100, 90, 85, 80, 75]  # the held entries, again and again
    finally:
        h.stop()


class PermitMachine(RuleBasedStateMachine):
    """Random FLOWs, dispatches, acks, removals and replacements on a gevent dispatcher."""

    def __init__(self) -> None:
        super().__init__()
        self.h = Harness(
            GeventActor,
            settings=load_settings(
                env={},
                overrides={
                    "dispatcher_max_read_batch_size": 5,
                    "dispatcher_max_round_robin_batch_size": 2,
                    "max_unacked_messages_per_consumer": 8,
                },
            ),
        )
        self.live: list[Any] = []
        self.removed: list[Any] = []
        self.names = 0
        self.held: set[int] = set()  # delayed entries not due in this test

    def teardown(self) -> None:
        self.h.stop()

    @rule(permits=st.integers(0, 20))
    def add(self, permits: int) -> None:
        if len(self.live) < 4:
            self.names += 1
            self.live.append(self.h.consumer(f"c{self.names}", permits))

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 3), permits=st.integers(1, 30))
    def flow(self, index: int, permits: int) -> None:
        self.live[index % len(self.live)].flow(permits)

    @rule(count=st.integers(1, 12), batch=st.sampled_from([1, 1, 3]))
    def publish(self, count: int, batch: int) -> None:
        self.h.append(count, batch)

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 3), share=st.floats(0, 1))
    def ack(self, index: int, share: float) -> None:
        consumer = self.live[index % len(self.live)]
        pending = sorted(self.h.dispatcher.proxy().pending_owner.get())
        mine = [e for e in pending if self.h.proxy.pending_owner.get()[e] is consumer]
        chosen = mine[: int(len(mine) * share)]
        if chosen:
            self.h.dispatcher.tell(Ack(consumer, [(LEDGER, e) for e in chosen], cumulative=False))

    @rule(count=st.integers(1, 4), held=st.booleans())
    def publish_delayed(self, count: int, held: bool) -> None:
        """Entries with a deliver_at_time: a year ahead (held, never delivered here) or in
        the past (delivered at once)."""
        now = int(time.time() * 1000)
        at = now + 365 * 86_400_000 if held else now - 60_000
        start = len(self.h.topic.proxy().entries.get())
        entries = []
        for i in range(count):
            metadata = pb.MessageMetadata(
                producer_name="p", sequence_id=start + i, publish_time=now, deliver_at_time=at
            )
            entries.append(Entry(LEDGER, start + i, build_entry(metadata, b"x"), 0, 1))
        self.h.topic.tell(Append(entries))
        if held:
            self.held.update(range(start, start + count))

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 3), bits=st.integers(0, 0b110))
    def ack_batch_members(self, index: int, bits: int) -> None:
        """A batch-index ack of some members of one pending batch of 3 (bit set: not acked)."""
        consumer = self.live[index % len(self.live)]
        owners = self.h.proxy.pending_owner.get()
        batches = [e for e, c in owners.items() if c is consumer and consumer.pending[e] > 1]
        if batches:
            positions = {(LEDGER, min(batches)): [bits]}
            self.h.dispatcher.tell(Ack(consumer, [], cumulative=False, ack_sets=positions))

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 3), replace=st.booleans())
    def remove(self, index: int, replace: bool) -> None:
        consumer = self.live.pop(index % len(self.live))
        self.h.remove(consumer)
        self.removed.append(consumer)
        if replace:  # the same name comes back on a new connection with a clean balance
            self.live.append(self.h.consumer(consumer.name, 5))
        consumer.flow(1000)  # a late FLOW of the old consumer must not leak into the total

    @invariant()
    def total_equals_sum_of_accounted_balances_and_nothing_is_stranded(self) -> None:
        h = self.h
        h.settle()
        assert h.total == sum(c.permits for c in self.live)
        assert all(not c.accounted for c in self.removed)
        assert h.proxy.unacked.get() == sum(c.unacked for c in self.live) >= 0
        # A pending batch counts its unacked members only, never less than one.
        for consumer in self.live:
            assert consumer.unacked == sum(consumer.pending.values())
            assert all(count >= 1 for count in consumer.pending.values())
        # A delayed entry not due is never handed out, and the tracker holds nothing else.
        assert not self.held & set(h.proxy.pending_owner.get())
        assert h.proxy.delayed.get().delayed <= len(self.held)
        # A consumer stays blocked only while it still holds more than half the limit.
        assert all(c.unacked > 8 // 2 for c in self.live if c.blocked)
        backlog = len(h.topic.proxy().entries.get()) > h.proxy.read_position.get() or bool(
            h.proxy.replay.get()
        )
        can_take = any(c.permits > 0 and not c.blocked for c in self.live)
        if backlog and can_take:
            assert h.proxy.pending_read.get() is not None, "stranded: backlog, permits, no read"


PermitMachine.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestPermitMachine = PermitMachine.TestCase
