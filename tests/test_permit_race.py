"""PermitTotal on real threads: many FLOWs, dispatches and removals race on one total.

The design lets a FLOW reach the dispatcher's permit total from the connection actor that
received it, without going through the dispatcher's mailbox (see brokerlet/actors/consumer.py).
That is only sound if every writer updates the total atomically. Here the writers are Pykka
``ThreadingActor``s, so they run on OS threads: connection actors send FLOWs, the dispatcher
actor debits dispatched messages and removes (then re-adds) consumers. At the end the total
must equal the sum of the accounted consumers' balances.

CPython 3.11 checks for a thread switch only at calls and backward jumps, so an unlocked
``self._value += delta`` would almost never be interrupted between its read and its write,
and a plain race would pass with or without the lock. The test therefore traces the total's
``add`` opcode by opcode on the actor threads and yields the GIL after each opcode: every
read-modify-write is then open to every other writer, as it would be on a free-threaded
build, and only the lock keeps it whole.

The same race against a total without the lock must come out wrong, which shows the test
can see a missing lock (checked by hand too: with the lock removed from PermitTotal.add the
main test fails).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any

import pykka

from brokerlet.actors.consumer import ConnectionHandle, Consumer, PermitTotal

CONNECTIONS = 6
CONSUMERS_PER_CONNECTION = 3
FLOWS = 300  # per connection actor
DISPATCHES = 600


class LocklessTotal(PermitTotal):
    """PermitTotal with its lock taken out: what the test must catch."""

    __slots__ = ()

    def add(self, delta: int) -> int:
        value = self._value
        self._value = value + delta
        return self._value


class NoReadGate:
    """Stands in for the dispatcher's conflated read request; FLOWs call it."""

    def request(self) -> None:
        pass


@dataclass(frozen=True)
class Burst:
    """Send ``count`` FLOWs, spread over the connection's consumers."""

    count: int
    seed: int


@dataclass(frozen=True)
class Churn:
    """Dispatch ``count`` times and now and then remove and re-add a consumer."""

    count: int
    seed: int


class ConnectionActor(pykka.ThreadingActor):
    def __init__(self, consumers: list[Consumer], start: threading.Barrier) -> None:
        super().__init__()
        self.consumers = consumers
        self.start_line = start

    def on_receive(self, message: Any) -> Any:
        if not isinstance(message, Burst):
            raise TypeError(f"unexpected message {message!r}")
        rng = random.Random(message.seed)
        self.start_line.wait(10)
        for _ in range(message.count):
            rng.choice(self.consumers).flow(rng.randint(1, 5))
        return message.count


class DispatcherActor(pykka.ThreadingActor):
    def __init__(
        self, consumers: list[Consumer], total: PermitTotal, start: threading.Barrier
    ) -> None:
        super().__init__()
        self.consumers = consumers
        self.total = total
        self.start_line = start

    def on_receive(self, message: Any) -> Any:
        if not isinstance(message, Churn):
            raise TypeError(f"unexpected message {message!r}")
        rng = random.Random(message.seed)
        removals = 0
        self.start_line.wait(10)
        for n in range(message.count):
            consumer = rng.choice(self.consumers)
            if consumer.accounted:
                consumer.debit(rng.randint(1, 3))  # may go negative, as real dispatch may
            if n % 10 == 0:
                if consumer.detach():  # RemoveConsumer
                    removals += 1
                consumer.attach(self.total, NoReadGate())  # type: ignore[arg-type]
        return removals


@contextmanager
def preempted(function: Any) -> Iterator[None]:
    """On threads started inside, yield the GIL after every opcode of ``function``."""
    code = function.__code__

    def each_opcode(frame: FrameType, event: str, arg: object) -> Any:
        if event == "opcode":
            time.sleep(0)  # a preemption point, not a wait: lets another writer run now
        return each_opcode

    def on_call(frame: FrameType, event: str, arg: object) -> Any:
        if event == "call" and frame.f_code is code:
            frame.f_trace_opcodes = True
            return each_opcode
        return None

    threading.settrace(on_call)
    try:
        yield
    finally:
        threading.settrace(None)  # type: ignore[arg-type]


def race(total: PermitTotal, seed: int) -> tuple[int, int]:
    """Run the race once; return (the total, the sum of the accounted balances)."""
    handle = ConnectionHandle(peer="race", channel=None, event_loop=None)  # type: ignore[arg-type]
    consumers = [
        Consumer(i, f"c{i}", "topic", "sub", 1, 0, handle)
        for i in range(CONNECTIONS * CONSUMERS_PER_CONNECTION)
    ]
    for consumer in consumers:
        consumer.attach(total, NoReadGate())  # type: ignore[arg-type]
    start = threading.Barrier(CONNECTIONS + 1)
    with preempted(type(total).add):
        connections = [
            ConnectionActor.start(consumers[i::CONNECTIONS], start) for i in range(CONNECTIONS)
        ]
        dispatcher = DispatcherActor.start(consumers, total, start)
    try:
        flows = [c.ask(Burst(FLOWS, seed + i), block=False) for i, c in enumerate(connections)]
        churn = dispatcher.ask(Churn(DISPATCHES, seed), block=False)
        assert [f.get(timeout=30) for f in flows] == [FLOWS] * CONNECTIONS
        assert churn.get(timeout=30) > 0, "the dispatcher never removed a consumer"
    finally:
        for ref in [*connections, dispatcher]:
            ref.stop()
    return total.value, sum(c.permits for c in consumers if c.accounted)


def test_the_total_holds_under_flows_dispatches_and_removals_on_real_threads() -> None:
    for seed in range(2):
        total, balances = race(PermitTotal(), seed * 100)
        assert total == balances, f"permit total {total} != accounted balances {balances}"


def test_the_race_catches_a_total_without_its_lock() -> None:
    outcomes = [race(LocklessTotal(), seed * 100) for seed in range(3)]
    assert any(total != balances for total, balances in outcomes), (
        f"three lockless races all came out exact ({outcomes}): the race is too gentle to "
        "show a missing lock"
    )
