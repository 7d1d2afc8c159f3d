"""The actor runtime: GeventActor and GeventFuture, checked against ThreadingActor."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import gevent
import gevent.event
import pykka
import pytest

from brokerlet.actors._loop import TIME_SLICE, FairInbox, in_turns, take_turn
from brokerlet.actors._registry import RefTable, install
from brokerlet.actors._runtime import (
    GeventActor,
    GeventFuture,
    HandlerTimeout,
    timeout_after,
)

if TYPE_CHECKING:
    from types import TracebackType

    from tests.conftest import EventLike, Runtime

WAIT = 5.0  # seconds; a bound on waits that should end almost at once


class Recorder:
    """Mixin: records messages, answers asks, fails on request."""

    def __init__(self) -> None:
        super().__init__()
        self.received: list[Any] = []
        self.name = "recorder"

    def on_receive(self, message: Any) -> Any:
        if message == "received":
            return list(self.received)
        if message == "fail":
            raise ValueError("boom")
        if isinstance(message, tuple) and message[0] == "double":
            return message[1] * 2
        self.received.append(message)
        return None

    def add(self, a: int, b: int) -> int:
        return a + b


def start_recorder(runtime: Runtime) -> pykka.ActorRef[Any]:
    actor_class = type("RecorderActor", (Recorder, runtime.actor_class), {})
    return actor_class.start()


def start_blocker(
    actor_class: type[pykka.Actor], entered: EventLike, release: EventLike
) -> pykka.ActorRef[Any]:
    """An actor whose "block" message parks it until `release` is set."""

    class Blocker(actor_class):
        def on_receive(self, message: Any) -> Any:
            if message == "block":
                entered.set()
                assert release.wait(WAIT)
            return message

    ref: pykka.ActorRef[Any] = Blocker.start()
    return ref


def test_tell_is_fifo(runtime: Runtime) -> None:
    ref = start_recorder(runtime)
    for number in range(1000):
        ref.tell(number)
    assert ref.ask("received", timeout=WAIT) == list(range(1000))


def test_ask_returns_the_handler_result(runtime: Runtime) -> None:
    ref = start_recorder(runtime)
    assert ref.ask(("double", 21), timeout=WAIT) == 42
    future = ref.ask(("double", "ab"), block=False)
    assert isinstance(future, runtime.future_class)
    assert future.get(timeout=WAIT) == "abab"


def test_ask_raises_handler_exception_with_its_traceback_and_actor_lives(
    runtime: Runtime,
) -> None:
    ref = start_recorder(runtime)
    with pytest.raises(ValueError, match="boom") as caught:
        ref.ask("fail", timeout=WAIT)
    assert "on_receive" in [entry.name for entry in caught.traceback]
    assert ref.is_alive()
    assert ref.ask(("double", 1), timeout=WAIT) == 2


def test_tell_failure_stops_actor_and_calls_on_failure(runtime: Runtime) -> None:
    failed = runtime.event_class()
    failures: list[type[BaseException] | None] = []

    class Failing(runtime.actor_class):
        def on_receive(self, message: Any) -> None:
            raise KeyError(message)

        def on_failure(
            self,
            exception_type: type[BaseException] | None,
            exception_value: BaseException | None,
            traceback: TracebackType | None,
        ) -> None:
            failures.append(exception_type)
            failed.set()

    ref = Failing.start()
    ref.tell("anything")
    assert failed.wait(WAIT)
    assert failures == [KeyError]
    assert not ref.is_alive()
    with pytest.raises(pykka.ActorDeadError):
        ref.ask("anything", timeout=WAIT)


def test_stop_blocks_until_on_stop_has_run(runtime: Runtime) -> None:
    events: list[str] = []

    class Stoppable(runtime.actor_class):
        def on_receive(self, message: Any) -> None:
            events.append(message)

        def on_stop(self) -> None:
            events.append("on_stop")

    ref = Stoppable.start()
    ref.tell("before")
    assert ref.stop(block=True, timeout=WAIT) is True
    assert events == ["before", "on_stop"]
    assert not ref.is_alive()
    assert ref.stop(block=True, timeout=WAIT) is False


def test_what_is_queued_behind_a_stop_is_refused_asks_fail_and_tells_are_dropped(
    runtime: Runtime,
) -> None:
    # GeventActor puts a tell in its inbox bare and only an ask in pykka's Envelope; its
    # teardown must still answer every ask left behind as Pykka's does (ActorDeadError).
    entered, release = runtime.event_class(), runtime.event_class()
    ref = start_blocker(runtime.actor_class, entered, release)
    try:
        ref.tell("block")
        assert entered.wait(WAIT)
        stopped = ref.stop(block=False)
        ref.tell("a tell nobody waits for")
        late = ref.ask("late", block=False)
    finally:
        release.set()
    assert stopped.get(timeout=WAIT) is True
    with pytest.raises(pykka.ActorDeadError, match="stopped before handling"):
        late.get(timeout=WAIT)
    with pytest.raises(pykka.ActorDeadError):
        ref.tell("after the stop")


class Fatal(BaseException):
    """Not an Exception: Pykka's loop stops every actor for it."""


def test_a_base_exception_in_a_handler_stops_every_actor(runtime: Runtime) -> None:
    bystander_stopped = runtime.event_class()

    class Bystander(runtime.actor_class):
        def on_stop(self) -> None:
            bystander_stopped.set()

    class Doomed(runtime.actor_class):
        def on_receive(self, message: Any) -> None:
            raise Fatal(message)

    bystander = Bystander.start()
    doomed = Doomed.start()
    doomed.tell("now")
    assert bystander_stopped.wait(WAIT)
    assert not bystander.is_alive()
    assert not doomed.is_alive()


def test_ask_timeout_raises_pykka_timeout_within_bound(runtime: Runtime) -> None:
    entered, release = runtime.event_class(), runtime.event_class()
    ref = start_blocker(runtime.actor_class, entered, release)
    try:
        ref.tell("block")
        assert entered.wait(WAIT)
        started = time.monotonic()
        with pytest.raises(pykka.Timeout):
            ref.ask("late", timeout=0.05)
        assert time.monotonic() - started < 2.0
    finally:
        release.set()
    assert ref.ask("after", timeout=WAIT) == "after"


def test_proxy_calls_and_attributes(runtime: Runtime) -> None:
    ref = start_recorder(runtime)
    proxy = ref.proxy()
    assert proxy.add(2, 3).get(timeout=WAIT) == 5
    assert proxy.name.get(timeout=WAIT) == "recorder"
    proxy.name = "renamed"
    assert proxy.name.get(timeout=WAIT) == "renamed"


def test_join_map_filter_reduce_on_runtime_futures(runtime: Runtime) -> None:
    first, second = runtime.future_class(), runtime.future_class()
    joined = first.join(second)
    total = joined.map(sum)
    evens = runtime.future_class()
    evens_only = evens.filter(lambda number: number % 2 == 0)
    product = evens.reduce(lambda left, right: left * right)
    first.set(1)
    second.set(2)
    evens.set([2, 3, 4])
    assert joined.get(timeout=WAIT) == [1, 2]
    assert total.get(timeout=WAIT) == 3
    assert evens_only.get(timeout=WAIT) == [2, 4]
    assert product.get(timeout=WAIT) == 24


def test_join_of_asks_across_actors(runtime: Runtime) -> None:
    refs = [start_recorder(runtime) for _ in range(3)]
    futures = [ref.ask(("double", index), block=False) for index, ref in enumerate(refs)]
    assert futures[0].join(*futures[1:]).get(timeout=WAIT) == [0, 2, 4]


def test_future_get_timeout_on_unset_future(runtime: Runtime) -> None:
    future = runtime.future_class()
    with pytest.raises(pykka.Timeout):
        future.get(timeout=0.01)
    with pytest.raises(pykka.Timeout):
        future.get(timeout=0)
    future.set("late")
    assert future.get(timeout=0) == "late"


def test_future_reraises_set_exception_from_except_block(runtime: Runtime) -> None:
    future = runtime.future_class()
    error = RuntimeError("stored")
    try:
        raise error
    except RuntimeError:
        future.set_exception()
    for _ in range(2):  # every get raises, not only the first
        with pytest.raises(RuntimeError) as caught:
            future.get(timeout=WAIT)
        assert caught.value is error


def test_future_exc_info_without_instance_is_instantiated(runtime: Runtime) -> None:
    future = runtime.future_class()
    future.set_exception((pykka.ActorDeadError, None, None))
    with pytest.raises(pykka.ActorDeadError):
        future.get(timeout=WAIT)


def test_double_set_raises_queue_full(runtime: Runtime) -> None:
    future = runtime.future_class()
    future.set(1)
    with pytest.raises(queue.Full):
        future.set(2)
    with pytest.raises(queue.Full):
        future.set_exception((ValueError, ValueError("late"), None))
    with pytest.raises(queue.Full):
        future.set_get_hook(lambda timeout: 3)
    assert future.get(timeout=WAIT) == 1

    hooked = runtime.future_class()
    hooked.set_get_hook(lambda timeout: "hook")
    with pytest.raises(queue.Full):
        hooked.set("value")
    with pytest.raises(queue.Full):
        hooked.set_exception((ValueError, ValueError("late"), None))
    assert hooked.get(timeout=WAIT) == "hook"


# gevent only


def test_outer_gevent_timeout_is_not_relabelled() -> None:
    future: GeventFuture[int] = GeventFuture()
    for inner_timeout in (None, WAIT):
        with pytest.raises(gevent.Timeout) as caught, gevent.Timeout(0.02) as outer:
            future.get(timeout=inner_timeout)
        assert caught.value is outer
    future.set(7)
    assert future.get(timeout=0) == 7


def test_outer_gevent_timeout_around_ask_propagates() -> None:
    entered, release = gevent.event.Event(), gevent.event.Event()
    ref = start_blocker(GeventActor, entered, release)
    try:
        ref.tell("block")
        assert entered.wait(WAIT)
        with pytest.raises(gevent.Timeout) as caught, gevent.Timeout(0.02) as outer:
            ref.ask("late", timeout=WAIT)
        assert caught.value is outer
    finally:
        release.set()


def test_set_exception_without_an_exception_is_refused() -> None:
    future: GeventFuture[int] = GeventFuture()
    with pytest.raises(ValueError, match="needs an exception"):
        future.set_exception()
    future.set(1)  # the refused call left the future unset
    assert future.get() == 1


def test_gevent_actor_sets_every_attribute_pykkas_init_sets() -> None:
    # GeventActor.__init__ replaces pykka.Actor.__init__ rather than calling it; a Pykka
    # upgrade that adds an attribute there must show up here, not as a missing attribute.
    class Plain(pykka.ThreadingActor):
        pass

    class Ours(GeventActor):
        pass

    plain, ours = Plain(), Ours()
    assert set(vars(plain)) <= set(vars(ours))
    assert ours.actor_urn.startswith("urn:uuid:")
    assert ours.actor_urn != Ours().actor_urn
    assert ours.actor_ref.actor_stopped is ours.actor_stopped
    assert ours.actor_ref.actor_inbox is ours.actor_inbox
    assert isinstance(ours.actor_inbox, FairInbox)


def test_actor_stopped_refuses_a_wait_that_would_block_the_hub() -> None:
    class Idle(GeventActor):
        pass

    ref = Idle.start()
    assert ref.is_alive()
    with pytest.raises(RuntimeError, match="block its hub"):
        ref.actor_stopped.wait(0.01)
    ref.stop(block=True, timeout=WAIT)
    assert not ref.is_alive()
    assert ref.actor_stopped.wait() is True


def test_actor_runs_in_a_named_greenlet_that_ends_on_stop() -> None:
    class Named(GeventActor):
        def on_receive(self, message: Any) -> Any:
            return gevent.getcurrent()

    ref = Named.start()
    actor_greenlet = ref.proxy().actor_greenlet.get(timeout=WAIT)
    assert isinstance(actor_greenlet, gevent.Greenlet)
    assert actor_greenlet.name.startswith("Named-")
    assert ref.ask("where", timeout=WAIT) is actor_greenlet
    ref.stop(block=True, timeout=WAIT)
    actor_greenlet.join(timeout=WAIT)
    assert actor_greenlet.dead


def test_two_gevent_actors_ping_pong_1000_messages() -> None:
    done: GeventFuture[list[int]] = GeventFuture()

    class Player(GeventActor):
        def __init__(self) -> None:
            super().__init__()
            self.peer: pykka.ActorRef[Any] | None = None
            self.seen: list[int] = []

        def on_receive(self, message: Any) -> None:
            if isinstance(message, pykka.ActorRef):
                self.peer = message
                return
            self.seen.append(message)
            if message >= 1000:
                done.set(self.seen)
            else:
                assert self.peer is not None
                self.peer.tell(message + 1)

    ping, pong = Player.start(), Player.start()
    ping.tell(pong)
    pong.tell(ping)
    pong.tell(1)
    # pong handles the odd numbers, ping the even ones and stops at 1000.
    assert done.get(timeout=WAIT) == list(range(2, 1001, 2))
    assert pong.proxy().seen.get(timeout=WAIT) == list(range(1, 1000, 2))


def test_timeout_after_fails_one_message_not_every_actor() -> None:
    never = gevent.event.Event()

    class Waiter(GeventActor):
        def on_receive(self, message: Any) -> str:
            if message == "wait":
                with timeout_after(0.02):
                    never.wait()
            return "alive"

    waiter, bystander = Waiter.start(), Waiter.start()
    with pytest.raises(HandlerTimeout):
        waiter.ask("wait", timeout=WAIT)
    assert waiter.ask("ping", timeout=WAIT) == "alive"
    assert bystander.ask("ping", timeout=WAIT) == "alive"


def _spinners(busy: int, turn_s: float, stop: gevent.event.Event) -> tuple[list[Any], list[int]]:
    """``busy`` greenlets that each spin ``turn_s`` between take_turn() calls until ``stop``
    is set (or 1,000 turns in all); the list counts their turns."""
    turns = [0]

    def spin() -> None:
        while not stop.is_set() and turns[0] < 1000:
            until = time.perf_counter() + turn_s
            while time.perf_counter() < until:
                pass
            turns[0] += 1
            take_turn()

    return [gevent.spawn(spin) for _ in range(busy)], turns


def _wait_for_timer(seconds: float) -> None:
    """Wait on a loop timer of ``seconds``: the timer whose turn the tests below measure."""
    hub = gevent.get_hub()
    with hub.loop.timer(seconds) as timer:
        hub.wait(timer)


@pytest.mark.parametrize("busy", [1, 3])
def test_take_turn_lets_a_due_timer_run_after_one_round_of_turns(busy: int) -> None:
    """Greenlets that yield with take_turn() do not starve timers.

    With gevent.sleep(0) each yield is a loop callback, and gevent runs 50 callbacks before it
    looks at its timers again: the 1 ms timer below waited ~50 turns. take_turn() yields
    through a zero timer, so a due timer runs after at most a round or two of turns.
    """
    fired = gevent.event.Event()
    spinners, turns = _spinners(busy, 0.0003, fired)

    def timer() -> None:
        _wait_for_timer(0.001)
        fired.set()

    gevent.spawn(timer).join(timeout=WAIT)
    gevent.joinall(spinners, timeout=WAIT)
    assert fired.is_set()
    # 1 ms of 0.3 ms turns is about 4; a round of every spinner on either side of the expiry.
    assert turns[0] <= 4 + 2 * busy + 2, f"{turns[0]} turns of 0.3 ms before a 1 ms timer ran"


@pytest.mark.parametrize("busy", [2, 4])
def test_a_timer_that_fell_due_runs_before_the_next_round_of_turns(busy: int) -> None:
    """A timer due while greenlets take turns waits one round of turns, not two.

    libev runs expired timers in order of expiry. A zero timer started from an I/O or timer
    callback is due at the loop's cached time, taken when the iteration began: it sorted
    ahead of a timer that fell due during the iteration, so each round of turns ran twice
    before that timer (the stall probe's ticker waited 8 ms behind four 1 ms slices).
    """
    done = gevent.event.Event()
    # Each turn is longer than the timer's delay: after one turn, the timer is due.
    spinners, turns = _spinners(busy, 0.002, done)
    between: list[int] = []

    def tick() -> None:
        for _ in range(10):
            before = turns[0]
            _wait_for_timer(0.001)
            between.append(turns[0] - before)
        done.set()

    gevent.spawn(tick).join(timeout=WAIT)
    done.set()
    gevent.joinall(spinners, timeout=WAIT)
    assert len(between) == 10
    assert max(between) <= busy + 1, f"turns between ticks: {between}"


def test_the_inbox_hands_items_to_its_waiting_reader_in_order() -> None:
    inbox = FairInbox()
    got: list[int] = []
    reading = gevent.event.Event()

    def read() -> None:
        reading.set()  # then get() waits, before the waiting test greenlet runs again
        for _ in range(3):
            got.append(inbox.get())

    reader = gevent.spawn(read)
    assert reading.wait(WAIT)
    for item in (1, 2, 3):
        inbox.put(item)
    reader.join(timeout=WAIT)
    assert got == [1, 2, 3]
    assert inbox.empty()
    assert inbox.qsize() == 0


def test_the_inbox_refuses_what_it_cannot_do() -> None:
    inbox = FairInbox()
    with pytest.raises(queue.Empty):
        inbox.get(block=False)
    with pytest.raises(ValueError, match="no timeout"):
        inbox.get(timeout=1.0)
    inbox.put("x")
    assert inbox.get(block=False) == "x"


def test_a_reader_killed_while_waiting_leaves_the_inbox_working() -> None:
    """A put after its waiting reader was killed must not switch into the dead greenlet,
    and the item stays for the next reader."""
    inbox = FairInbox()
    reading = gevent.event.Event()

    def read() -> Any:
        reading.set()  # then get() waits, before the waiting test greenlet runs again
        return inbox.get()

    doomed = gevent.spawn(read)
    assert reading.wait(WAIT)
    doomed.kill(timeout=WAIT)
    assert doomed.dead
    inbox.put("kept")
    assert inbox.qsize() == 1
    assert gevent.spawn(inbox.get).get(timeout=WAIT) == "kept"


def test_brokerlet_serve_freezes_its_heap_and_sets_the_collectors_thresholds() -> None:
    # In a child: the collector's settings are process-wide.
    code = (
        "import gc; from brokerlet.cli import settle_heap, YOUNG_GC_THRESHOLD as Y, "
        "MIDDLE_GC_THRESHOLD as M, OLD_GC_THRESHOLD as O; "
        "settle_heap(); print(gc.get_threshold() == (Y, M, O), gc.get_freeze_count() > 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.split() == ["True", "True"]


@pytest.mark.parametrize(("environment", "tracked"), [(None, "False"), ("1", "True")])
def test_brokerlet_serve_stops_gevent_tracking_spawns_unless_told(
    environment: str | None, tracked: str
) -> None:
    # In a child: gevent's configuration is process-wide.
    code = (
        "import gevent; from brokerlet.cli import untrack_greenlet_tree; "
        "untrack_greenlet_tree(); print(gevent.config.track_greenlet_tree)"
    )
    env = {key: value for key, value in os.environ.items() if key != "GEVENT_TRACK_GREENLET_TREE"}
    if environment is not None:
        env["GEVENT_TRACK_GREENLET_TREE"] = environment
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=env,
    )
    assert result.stdout.split() == [tracked]


def test_pykkas_registry_keeps_its_refs_in_a_table() -> None:
    # brokerlet.actors._registry: Pykka 4.5 scans its list of every running actor twice to
    # unregister one. A Pykka that keeps its refs otherwise makes install() decline (the
    # broker still works, each stop scans again): this says so at the upgrade.
    assert isinstance(pykka.ActorRegistry._actor_refs, RefTable)
    assert install() is True


def test_the_registry_api_reads_the_table_as_it_read_pykkas_list(runtime: Runtime) -> None:
    first_class = type("First", (Recorder, runtime.actor_class), {})
    second_class = type("Second", (Recorder, runtime.actor_class), {})
    first, second, third = first_class.start(), second_class.start(), first_class.start()
    mine = [ref for ref in pykka.ActorRegistry.get_all() if ref in (first, second, third)]
    assert mine == [first, second, third]  # start order, which stop_all reverses
    assert pykka.ActorRegistry.get_by_class(first_class) == [first, third]
    assert pykka.ActorRegistry.get_by_class_name("Second") == [second]
    assert pykka.ActorRegistry.get_by_urn(second.actor_urn) is second
    pykka.ActorRegistry.broadcast("hello", target_class=first_class)
    assert first.ask("received", timeout=WAIT) == ["hello"]
    assert third.ask("received", timeout=WAIT) == ["hello"]
    assert second.ask("received", timeout=WAIT) == []
    second.stop(block=True, timeout=WAIT)
    assert second not in pykka.ActorRegistry.get_all()
    assert pykka.ActorRegistry.get_by_urn(second.actor_urn) is None
    pykka.ActorRegistry.unregister(second)  # again: Pykka logs it, as with its list


def test_a_ref_table_behaves_as_the_list_it_replaces(monkeypatch: pytest.MonkeyPatch) -> None:
    refs = [unstarted_ref() for _ in range(4)]
    monkeypatch.setattr(pykka.ActorRegistry, "_actor_refs", refs[:2])
    assert install() is True
    table = pykka.ActorRegistry._actor_refs
    assert isinstance(table, RefTable)
    assert table[:] == refs[:2]  # the refs registered before, in order
    table.append(refs[2])
    table.append(refs[3])
    assert len(table) == 4
    assert table[-1] is refs[3]
    for ref in table:  # the table changing while iterated, as a list allowed
        table.remove(ref)
    assert table[:] == []
    assert refs[0] not in table
    with pytest.raises(ValueError, match="not registered"):
        table.remove(refs[0])


def test_install_leaves_a_registry_it_does_not_know(monkeypatch: pytest.MonkeyPatch) -> None:
    kept: Any = (unstarted_ref(),)
    monkeypatch.setattr(pykka.ActorRegistry, "_actor_refs", kept)
    assert install() is False
    assert pykka.ActorRegistry._actor_refs is kept
    listed = [unstarted_ref()]
    monkeypatch.setattr(pykka.ActorRegistry, "_actor_refs", listed)
    monkeypatch.setattr(pykka.ActorRef, "__eq__", lambda self, other: self is other)
    assert install() is False  # refs that compare by more than identity: not dict keys
    assert pykka.ActorRegistry._actor_refs is listed


def unstarted_ref() -> pykka.ActorRef[Any]:
    """A ref of an actor that never starts: the table only keeps refs."""
    return GeventActor().actor_ref


def test_a_pass_in_turns_lets_others_run_between_its_items() -> None:
    # brokerlet.actors._loop.in_turns: the periodic passes over every open topic (quotas,
    # expiry, retention, compaction thresholds) took 150 ms of the hub with 8,000 topics.
    work = TIME_SLICE / 4  # of CPU per item: the pass needs several slices
    items = 40
    reached: list[int] = []
    done: list[int] = []
    started = gevent.event.Event()

    def busy(seconds: float) -> None:  # CPU, as a check of one topic is
        ends = time.perf_counter() + seconds
        while time.perf_counter() < ends:
            pass

    def sweep() -> None:
        for index in in_turns(range(items)):
            busy(work)
            done.append(index)
            started.set()

    def other() -> None:
        reached.append(len(done))

    sweeper = gevent.spawn(sweep)
    assert started.wait(WAIT)  # resumed at the sweep's first turn
    gevent.spawn(other)
    sweeper.join(timeout=WAIT)
    assert done == list(range(items))
    assert reached
    assert reached[0] < items  # it ran while the pass still had items left
