"""The event loop's thread asks Linux for a short scheduler slice (brokerlet._slice)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
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
    """Run ``work`` on a thread of its own (scheduler settings are per thread)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(work).result(WAIT)


def serve_once(slice_us: int) -> tuple[int | None, int | None, int | None]:
    """On a thread of its own: the thread's slice before ``serve_forever``, while the broker
    runs on it (read by ``on_ready``, on the broker's thread), and after it returns."""

    def work() -> tuple[int | None, int | None, int | None]:
        before = current_slice_us()
        seen: list[int | None] = []

        def ready(broker: Broker) -> None:
            seen.append(current_slice_us())
            broker.stop()

        Broker(port=0, web_service_enabled=False, event_loop_slice_us=slice_us).serve_forever(
            on_ready=ready
        )
        return before, seen[0], current_slice_us()

    return on_a_thread(work)


@pytest.mark.parametrize("slice_us", [100, 500])
def test_the_broker_runs_with_the_configured_slice_and_gives_it_back(slice_us: int) -> None:
    before, serving, after = serve_once(slice_us)
    assert serving == slice_us
    assert after == before != slice_us


def test_a_zero_slice_leaves_the_kernels_default() -> None:
    before, serving, after = serve_once(0)
    assert serving == before == after


def test_only_the_slice_changes_the_nice_value_is_kept() -> None:
    def work() -> tuple[int | None, int, int | None, int]:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 5)
        before = current_slice_us()
        with requested_slice(200):
            inside = current_slice_us(), os.getpriority(os.PRIO_PROCESS, 0)
        return (*inside, before, os.getpriority(os.PRIO_PROCESS, 0))

    inside_slice, inside_nice, before, after_nice = on_a_thread(work)
    assert (inside_slice, inside_nice, after_nice) == (200, 5, 5)
    assert before != 200
