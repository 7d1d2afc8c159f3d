"""ConflatedTell: Pulsar's read-request gate, under both actor runtimes."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import pykka

from brokerlet.actors._conflate import ConflatedTell

if TYPE_CHECKING:
    from types import TracebackType

    from tests.conftest import EventLike, Runtime

WAIT = 5.0  # seconds; a bound on waits that should end almost at once
PASS = object()  # the conflated message


def frame_depth() -> int:
    depth, frame = 0, sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back  # type: ignore[assignment]
    return depth


def start_worker(
    runtime: Runtime,
    entered: EventLike,
    release: EventLike,
    *,
    block_on_pass: int | None = None,
    chain_to: int = 0,
) -> pykka.ActorRef[Any]:
    """Start an actor that runs one pass per conflated `PASS` message.

    Args:
        runtime: the actor runtime.
        entered: set when the actor parks (on "block", or in pass `block_on_pass`).
        release: what a parked actor waits for.
        block_on_pass: the pass number that parks until `release`.
        chain_to: each pass below this number requests the next pass itself.
    """

    class Worker(runtime.actor_class):  # type: ignore[name-defined,misc]
        def __init__(self) -> None:
            super().__init__()
            self.gate = ConflatedTell(self.actor_ref, PASS)
            self.passes = 0
            self.depths: list[int] = []
            self.chain_requests: list[list[bool]] = []
            self.failed = runtime.event_class()

        def on_receive(self, message: Any) -> Any:
            if message is PASS:
                self.gate.taken()
                self.run_pass()
            elif message == "block" or message == "block then fail":
                entered.set()
                assert release.wait(WAIT)
                if message == "block then fail":
                    raise RuntimeError("fail after the block")
            return None

        def run_pass(self) -> None:
            self.passes += 1
            self.depths.append(frame_depth())
            if self.passes == block_on_pass:
                entered.set()
                assert release.wait(WAIT)
            if self.passes < chain_to:
                self.chain_requests.append([self.gate.request() for _ in range(3)])
            elif self.passes == chain_to:
                entered.set()

        def on_failure(
            self,
            exception_type: type[BaseException] | None,
            exception_value: BaseException | None,
            traceback: TracebackType | None,
        ) -> None:
            self.failed.set()

    ref: pykka.ActorRef[Any] = Worker.start()
    return ref


def hammer_concurrently(
    runtime: Runtime, gate: ConflatedTell, tasks: int, requests_each: int
) -> list[bool]:
    """Call `gate.request()` from `tasks` concurrent tasks released at once."""
    start = runtime.event_class()
    results: list[bool] = []

    def requester() -> None:
        assert start.wait(WAIT)
        for _ in range(requests_each):
            results.append(gate.request())

    running = [runtime.spawn(requester) for _ in range(tasks)]
    start.set()
    for task in running:
        task.join(WAIT)
    assert len(results) == tasks * requests_each, "a requester did not finish"
    return results


def test_concurrent_requests_while_blocked_queue_one_message(runtime: Runtime) -> None:
    entered, release = runtime.event_class(), runtime.event_class()
    ref = start_worker(runtime, entered, release)
    gate: ConflatedTell = ref.proxy().gate.get(timeout=WAIT)
    try:
        ref.tell("block")
        assert entered.wait(WAIT)
        results = hammer_concurrently(runtime, gate, tasks=16, requests_each=50)
        assert results.count(True) == 1
        assert gate.requested
        assert ref.actor_inbox.qsize() == 1
    finally:
        release.set()
    assert ref.proxy().passes.get(timeout=WAIT) == 1
    assert not gate.requested


def test_requests_during_a_pass_give_exactly_one_more_pass(runtime: Runtime) -> None:
    entered, release = runtime.event_class(), runtime.event_class()
    ref = start_worker(runtime, entered, release, block_on_pass=1)
    gate: ConflatedTell = ref.proxy().gate.get(timeout=WAIT)
    try:
        assert gate.request() is True
        assert entered.wait(WAIT)  # pass 1 has taken its message and is running
        assert not gate.requested
        results = hammer_concurrently(runtime, gate, tasks=4, requests_each=25)
        assert results.count(True) == 1
        assert ref.actor_inbox.qsize() == 1
    finally:
        release.set()
    proxy = ref.proxy()
    assert proxy.passes.get(timeout=WAIT) == 2
    assert proxy.passes.get(timeout=WAIT) == 2  # and no third pass trails behind
    assert not gate.requested


def test_a_pass_requesting_itself_runs_1000_passes_without_recursion(runtime: Runtime) -> None:
    finished, unused = runtime.event_class(), runtime.event_class()
    ref = start_worker(runtime, finished, unused, chain_to=1000)
    proxy = ref.proxy()
    gate: ConflatedTell = proxy.gate.get(timeout=WAIT)
    assert gate.request() is True
    assert finished.wait(WAIT)
    assert proxy.passes.get(timeout=WAIT) == 1000
    assert proxy.chain_requests.get(timeout=WAIT) == [[True, False, False]] * 999
    assert len(set(proxy.depths.get(timeout=WAIT))) == 1  # every pass at the same stack depth
    assert not gate.requested
    assert ref.actor_inbox.qsize() == 0


def test_request_to_a_stopped_actor_returns_false(runtime: Runtime) -> None:
    entered, release = runtime.event_class(), runtime.event_class()
    ref = start_worker(runtime, entered, release)
    gate: ConflatedTell = ref.proxy().gate.get(timeout=WAIT)
    assert ref.stop(block=True, timeout=WAIT)
    for _ in range(2):  # re-armed, so every call tries and fails quietly
        assert gate.request() is False
        assert not gate.requested


def test_request_rearms_when_the_actor_died_with_the_message_waiting(runtime: Runtime) -> None:
    entered, release = runtime.event_class(), runtime.event_class()
    ref = start_worker(runtime, entered, release)
    proxy = ref.proxy()
    gate: ConflatedTell = proxy.gate.get(timeout=WAIT)
    failed: EventLike = proxy.failed.get(timeout=WAIT)
    try:
        ref.tell("block then fail")
        assert entered.wait(WAIT)
        assert gate.request() is True  # queued behind the message that will fail
    finally:
        release.set()
    assert failed.wait(WAIT)
    assert not ref.is_alive()
    assert gate.requested  # stale: the message died with the actor
    assert gate.request() is False
    assert not gate.requested


def test_a_held_gate_drops_requests_and_release_tells_nothing(runtime: Runtime) -> None:
    entered, release = runtime.event_class(), runtime.event_class()
    ref = start_worker(runtime, entered, release)
    proxy = ref.proxy()
    gate: ConflatedTell = proxy.gate.get(timeout=WAIT)
    gate.hold()
    assert [gate.request() for _ in range(10)] == [False] * 10
    assert not gate.requested
    assert ref.actor_inbox.qsize() == 0
    gate.release()
    assert ref.actor_inbox.qsize() == 0  # the holder decides what runs next
    assert gate.request() is True
    assert proxy.passes.get(timeout=WAIT) == 1


def test_holding_keeps_a_message_already_waiting(runtime: Runtime) -> None:
    entered, release = runtime.event_class(), runtime.event_class()
    ref = start_worker(runtime, entered, release)
    proxy = ref.proxy()
    gate: ConflatedTell = proxy.gate.get(timeout=WAIT)
    try:
        ref.tell("block")
        assert entered.wait(WAIT)
        assert gate.request() is True
        gate.hold()
        assert gate.request() is False
    finally:
        release.set()
    assert proxy.passes.get(timeout=WAIT) == 1  # the waiting message still ran its pass
    assert not gate.requested
