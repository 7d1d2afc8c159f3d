"""PermitTotal on real threads: many FLOWs, dispatches and removals race on one total.

The design lets a FLOW reach the dispatcher's permit total from the connection actor that
received it, without going through the dispatcher's mailbox (see brokerlet/dispatch/consumer.py).
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any

import pykka

from brokerlet.dispatch.consumer import ConnectionHandle, Consumer
from brokerlet.dispatch.permits import PermitTotal

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

    def request(self) -> bool:
        return False  # as ConflatedTell answers when a request is queued already


@dataclass(frozen=True)
class Go:
    """Start the work (after the start line)."""


class Writer(pykka.ThreadingActor):
    """An actor on a thread of its own that, told Go, does ``work`` and answers its result."""

    def __init__(self, work: Callable[[], int], start: threading.Barrier) -> None:
        super().__init__()
        self.work = work
        self.start_line = start

    def on_receive(self, message: Any) -> Any:
        if not isinstance(message, Go):
            raise TypeError(f"unexpected message {message!r}")
        self.start_line.wait(10)
        return self.work()


def flows(consumers: list[Consumer], seed: int) -> Callable[[], int]:
    """A connection actor's part: FLOWs spread over its consumers."""

    def work() -> int:
        rng = random.Random(seed)
        for _ in range(FLOWS):
            rng.choice(consumers).flow(rng.randint(1, 5))
        return FLOWS

    return work


def dispatches(consumers: list[Consumer], total: PermitTotal, seed: int) -> Callable[[], int]:
    """The dispatcher's part: debits for dispatched messages, and removals and re-adds."""

    def work() -> int:
        rng = random.Random(seed)
        removals = 0
        for n in range(DISPATCHES):
            consumer = rng.choice(consumers)
            if consumer.accounted:
                consumer.debit(rng.randint(1, 3))  # may go negative, as real dispatch may
            if n % 10 == 0:
                removals += consumer.detach()  # RemoveConsumer
                consumer.attach(total, NoReadGate())  # type: ignore[arg-type]
        return removals

    return work


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
            Writer.start(flows(consumers[i::CONNECTIONS], seed + i), start)
            for i in range(CONNECTIONS)
        ]
        dispatcher = Writer.start(dispatches(consumers, total, seed), start)
    try:
        answers = [c.ask(Go(), block=False) for c in connections]
        churn = dispatcher.ask(Go(), block=False)
        assert [a.get(timeout=30) for a in answers] == [FLOWS] * CONNECTIONS
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
