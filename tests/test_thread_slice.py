"""The event loop's thread asks Linux for a short scheduler slice (brokerlet._slice)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TypeVar

import pytest

from brokerlet import Broker
from brokerlet._slice import current_slice_us, requested_slice

WAIT = 10.0
T = TypeVar("T")

pytestmark = pytest.mark.skipif(
    current_slice_us() is None, reason="this kernel has no per-thread slice (Linux 6.12+)"
)


def on_a_thread(work: Callable[[], T]) -> T:
    """Run ``work`` on a thread of its own (scheduler settings are per thread), return its
    result or raise its error."""
    results: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(work())
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(WAIT)
    assert not thread.is_alive()
    if errors:
        raise errors[0]
    return results[0]


def broker_thread_slice(running: Broker) -> int | None:
    (thread,) = (t for t in threading.enumerate() if t.name == "brokerlet")
    assert thread.native_id is not None
    return current_slice_us(thread.native_id)


@pytest.mark.parametrize("slice_us", [100, 500])
def test_the_broker_thread_runs_with_the_configured_slice(slice_us: int) -> None:
    with Broker(port=0, web_service_enabled=False, event_loop_slice_us=slice_us) as running:
        assert broker_thread_slice(running) == slice_us


def test_a_zero_slice_leaves_the_kernels_default() -> None:
    default = current_slice_us()
    with Broker(port=0, web_service_enabled=False, event_loop_slice_us=0) as running:
        assert broker_thread_slice(running) == default


def test_the_slice_is_put_back_and_the_nice_value_kept() -> None:
    # serve_forever runs the broker on the caller's thread: the caller gets its slice back.
    def work() -> tuple[int | None, int, int | None, int]:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 5)
        before = current_slice_us()
        with requested_slice(200):
            inside = current_slice_us(), os.getpriority(os.PRIO_PROCESS, 0)
        assert current_slice_us() == before
        return (*inside, before, os.getpriority(os.PRIO_PROCESS, 0))

    inside_slice, inside_nice, before, after_nice = on_a_thread(work)
    assert (inside_slice, inside_nice, after_nice) == (200, 5, 5)
    assert before != 200
