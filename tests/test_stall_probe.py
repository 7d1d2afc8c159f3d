"""The stall probe's arithmetic: a gap split into the hub's work and its waits for a CPU."""

from __future__ import annotations

import sys

import pytest

from bench.stall_probe import Meter, run_queue_clock


def test_the_stall_without_run_queue_waits_takes_each_gaps_own_wait_out() -> None:
    meter = Meter()
    # Three 1 ms ticks: a quiet one, one the hub spent 1 ms of CPU in, and one 8 ms longer
    # than asked of which the thread waited 7 ms for a CPU.
    meter.gaps.extend([0.001, 0.002, 0.009])
    meter.gap_cpu.extend([0.0, 0.001, 0.001])
    meter.gap_gc.extend([0.0, 0.0, 0.0])
    meter.gap_queued.extend([0.0, 0.0005, 0.007])
    report = meter.report()
    assert report["max_stall_ms"] == pytest.approx(8.0)
    assert report["max_stall_run_queue_ms"] == pytest.approx(7.0)
    assert report["p999_gap_run_queue_ms"] == pytest.approx(7.0)
    # Without the waits the gaps are 1, 1.5 and 2 ms: the worst stall is 1 ms, not 8.
    assert report["p999_stall_off_run_queue_ms"] == pytest.approx(1.0)
    meter.reset()
    assert meter.report() == {"ticks": 0}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="schedstat is Linux's")
def test_the_run_queue_clock_reads_this_threads_waits() -> None:
    clock = run_queue_clock()
    first = clock()
    assert first >= 0.0
    assert clock() >= first
