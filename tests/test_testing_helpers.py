"""brokerlet.testing.waiting.wait_until: the one bounded wait every test and helper uses."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import gevent
import gevent.event
import pytest

from brokerlet.testing import helpers
from brokerlet.testing.waiting import wait_until


def test_returns_the_first_truthy_value() -> None:
    values = iter([0, None, "", 7, 8])
    assert wait_until(lambda: next(values), message="a value", interval=0) == 7


def test_a_predicate_decides_and_the_accepted_value_is_returned() -> None:
    values = iter([{"n": 1}, {"n": 2}, {"n": 3}])
    got = wait_until(
        lambda: next(values), predicate=lambda v: v["n"] >= 2, message="n >= 2", interval=0
    )
    assert got == {"n": 2}


def test_a_falsy_value_the_predicate_accepts_is_returned() -> None:
    assert wait_until(lambda: 0, predicate=lambda v: v == 0, message="zero") == 0


def test_failure_names_what_was_awaited_the_bound_and_the_last_value() -> None:
    count = [0]

    def backlog() -> int:
        count[0] += 1
        return 40 + count[0]

    started = time.monotonic()
    with pytest.raises(AssertionError) as failure:
        wait_until(backlog, predicate=lambda v: v == 0, message="an empty backlog", timeout=0.2)
    took = time.monotonic() - started
    last = 40 + count[0]
    assert str(failure.value) == (
        f"timed out after 0.2 s waiting for an empty backlog; last value: {last}"
    )
    assert count[0] >= 2, "polled more than once"
    assert 0.2 <= took < 2.0


def test_a_callable_message_is_asked_only_on_failure() -> None:
    asked: list[int] = []

    def describe() -> str:
        asked.append(1)
        return "the state now"

    assert wait_until(lambda: True, message=describe)
    assert asked == []
    with pytest.raises(AssertionError, match="waiting for the state now; last value: False"):
        wait_until(lambda: False, message=describe, timeout=0.05)
    assert asked == [1]


def test_a_long_last_value_is_cut() -> None:
    with pytest.raises(AssertionError) as failure:
        wait_until(lambda: "x" * 5000, predicate=lambda _: False, message="x", timeout=0)
    assert len(str(failure.value)) < 700
    assert str(failure.value).endswith("...")


def test_the_condition_is_checked_once_more_at_the_deadline() -> None:
    # One poll interval longer than the timeout: the wait sleeps only to the deadline and
    # looks again, rather than failing on a value read a whole timeout ago.
    ready_at = time.monotonic() + 0.15
    assert wait_until(lambda: time.monotonic() >= ready_at, message="t", timeout=0.3, interval=5)


def test_an_exception_from_the_condition_ends_the_wait_at_once() -> None:
    def broken() -> bool:
        raise KeyError("sub")

    started = time.monotonic()
    with pytest.raises(KeyError):
        wait_until(broken, message="a subscription", timeout=5)
    assert time.monotonic() - started < 1


def test_greenlets_on_the_callers_hub_run_while_it_waits() -> None:
    # brokerlet's client runs its greenlets on the test's hub: a wait that blocked the hub
    # (time.sleep) would starve them and time out here.
    done = gevent.event.Event()
    gevent.spawn_later(0.05, done.set)
    wait_until(done.is_set, message="the greenlet", timeout=2)


def test_state_set_on_another_thread_is_seen() -> None:
    flag = threading.Event()
    timer = threading.Timer(0.05, flag.set)
    timer.start()
    try:
        wait_until(flag.is_set, message="the other thread", timeout=2)
    finally:
        timer.cancel()


def test_it_works_in_a_monkey_patched_process() -> None:
    # The load generator and some harnesses run patched: time and threads are gevent's.
    script = textwrap.dedent(
        """
        from gevent import monkey
        monkey.patch_all()
        import threading
        from brokerlet.testing.waiting import wait_until

        flag = threading.Event()
        threading.Timer(0.05, flag.set).start()
        wait_until(flag.is_set, message="the patched thread", timeout=5)
        try:
            wait_until(lambda: None, message="nothing", timeout=0.05)
        except AssertionError as error:
            print(error)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "timed out after 0.05 s waiting for nothing; last value: None"


def test_the_helpers_module_exports_the_same_wait() -> None:
    assert helpers.wait_until is wait_until
