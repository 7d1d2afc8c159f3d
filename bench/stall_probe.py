"""A broker with a stall meter on its event loop, run as a process of its own by the bench.

Run: ``python -m bench.stall_probe --storage disk --data-dir DIR --sync-policy every_batch``
(or ``--storage memory``).

It starts :class:`brokerlet.Broker` on a port of its choosing, on the broker's own thread and
gevent hub, and spawns a ticker greenlet on that hub which sleeps 1 ms at a time and records
the gap between one wake-up and the next. Anything that holds the hub (a handler that runs
long, a blocking call made on the loop, another thread holding the GIL, a garbage
collection) shows as a long gap. It also times every garbage collection in the process.

It also traces greenlet switches on that hub and keeps, for each greenlet, the longest
time it ran without switching away: the largest of those is the longest stretch of work the
hub's thread did without yielding, with the greenlet's name to find it by. Runs are ranked
by the hub thread's CPU time in them: on a saturated machine a run's wall time also holds
the time the OS ran other processes, or another thread held the GIL. For the gaps in which
the hub's thread was busiest it keeps what ran, as runs and CPU per kind of greenlet: one
run of each busy greenlet in a gap is fair, two mean a turn went ahead of the ticker's due
timer. It also counts the runs (all but the ticker's) and how many of them ran longer than
2 ms: a slice that is too long shows in every busy run, a pause the machine charges to one run
as CPU time (interrupts, the host) shows once; and before the broker starts it times a fixed
piece of work (`charge_floor`), the floor under any run's CPU time. Tracing costs about a
microsecond per switch, which the figures include.

It prints ``stall probe ready on pulsar://HOST:PORT`` once the broker is up, then obeys one
command per line on stdin:

* ``reset`` forgets the gaps and collections so far (so the window starts under load);
* ``report`` prints one JSON line with the window's figures (see :meth:`Meter.report`);
* end of input stops the broker and exits.
"""

from __future__ import annotations

import argparse
import bisect
import gc
import heapq
import json
import os
import sys
import time
from array import array
from collections.abc import Callable, Sequence
from typing import Any

import gevent
import greenlet

from brokerlet import Broker
from brokerlet.cli import settle_heap

__all__ = [
    "READY_PREFIX",
    "RUN_LIMIT_MS",
    "TICK_S",
    "Meter",
    "charge_floor",
    "greenlet_kind",
    "main",
]

READY_PREFIX = "stall probe ready on "
TICK_S = 0.001
STALL_LIMIT_MS = 5.0  # the target: no stall longer than this
RUN_LIMIT_MS = 2.0  # the target: no run of one greenlet longer than this, CPU
BUSIEST_KEPT = 3  # gaps whose make-up the report gives
TICKER_NAME = "stall-ticker"


class Meter:
    """The gaps between ticks on the broker's hub, and the process's garbage collections.

    For each gap it also records the CPU time the hub's thread used during it, the time
    garbage collections took during it (on any thread: a collection holds the GIL), and the
    time the hub's thread waited in the kernel's run queue for a CPU (Linux's per-thread
    ``schedstat``), so a long gap can be told apart: the hub busy with work of its own, a
    collection, the OS running something else on a loaded machine, or the rest (another
    thread holding the GIL).

    The ticker appends on the broker's thread; :meth:`reset` and :meth:`report` run on the
    main thread and only swap or read whole arrays, which the GIL keeps consistent.
    """

    def __init__(self) -> None:
        self.gaps = array("d")
        self.gap_cpu = array("d")
        self.gap_gc = array("d")
        self.gap_queued = array("d")
        self.gc_pauses: list[tuple[float, int]] = []
        self.running = True
        self._gc_began = 0.0
        self._gc_since_tick = 0.0
        # greenlet name -> (its longest run, that run's CPU time on the hub's thread), s
        self.longest_runs: dict[str, tuple[float, float]] = {}
        # The same over runs no garbage collection began in, and how many runs held one.
        self.longest_runs_without_gc: dict[str, tuple[float, float]] = {}
        self.runs_with_gc = 0
        # Every run's CPU time except the ticker's: how often a run is long tells a rule
        # (every slice runs long) from the machine (a rare run charged for its pauses).
        self.run_cpu = array("d")
        self._collections = 0
        self._collections_at_switch = 0
        self._switched_at = time.perf_counter()
        self._switched_cpu = 0.0
        self._runs_in_gap: list[tuple[str, float]] = []  # (kind, CPU s) since the last tick
        # The busiest gaps: (hub CPU ms, gap ms, tick, {kind: [runs, CPU ms]}), a min-heap.
        self.busiest_gaps: list[tuple[float, float, int, dict[str, list[float]]]] = []
        gc.callbacks.append(self._on_gc)

    def trace_switches(self, event: str, args: tuple[Any, Any]) -> None:
        """``greenlet.settrace`` callback: charge the time since the last switch to the
        greenlet that is switching away."""
        if event not in ("switch", "throw"):
            return
        now, cpu = time.perf_counter(), time.thread_time()
        ran, ran_cpu = now - self._switched_at, cpu - self._switched_cpu
        self._switched_at, self._switched_cpu = now, cpu
        name = greenlet_kind(args[0])
        self._runs_in_gap.append((name, ran_cpu))
        if name != TICKER_NAME:
            self.run_cpu.append(ran_cpu)
        if ran_cpu > self.longest_runs.get(name, (0.0, 0.0))[1]:
            self.longest_runs[name] = (ran, ran_cpu)
        if self._collections != self._collections_at_switch:
            self._collections_at_switch = self._collections
            self.runs_with_gc += 1
        elif ran_cpu > self.longest_runs_without_gc.get(name, (0.0, 0.0))[1]:
            self.longest_runs_without_gc[name] = (ran, ran_cpu)

    def ticker(self) -> None:
        """Sleep 1 ms at a time on the current hub, recording each gap between wake-ups."""
        clock = time.perf_counter
        thread_clock = time.thread_time
        queued_clock = run_queue_clock()
        last, last_cpu, last_queued = clock(), thread_clock(), queued_clock()
        while self.running:
            gevent.sleep(TICK_S)
            now, cpu, queued = clock(), thread_clock(), queued_clock()
            collecting, self._gc_since_tick = self._gc_since_tick, 0.0
            self.gaps.append(now - last)
            self.gap_cpu.append(cpu - last_cpu)
            self.gap_gc.append(collecting)
            self.gap_queued.append(queued - last_queued)
            self._keep_if_busiest((cpu - last_cpu) * 1000, (now - last) * 1000)
            last, last_cpu, last_queued = now, cpu, queued

    def _keep_if_busiest(self, cpu_ms: float, gap_ms: float) -> None:
        runs, self._runs_in_gap = self._runs_in_gap, []
        busiest = self.busiest_gaps
        if len(busiest) == BUSIEST_KEPT and cpu_ms <= busiest[0][0]:
            return
        kinds: dict[str, list[float]] = {}
        for name, ran_cpu in runs:
            figures = kinds.setdefault(name, [0, 0.0])
            figures[0] += 1
            figures[1] += ran_cpu * 1000
        entry = (cpu_ms, gap_ms, len(self.gaps), kinds)
        if len(busiest) < BUSIEST_KEPT:
            heapq.heappush(busiest, entry)
        else:
            heapq.heapreplace(busiest, entry)

    def reset(self) -> None:
        self.gaps, self.gap_cpu, self.gap_gc = array("d"), array("d"), array("d")
        self.gap_queued = array("d")
        self.gc_pauses = []
        self.longest_runs = {}
        self.longest_runs_without_gc = {}
        self.runs_with_gc = 0
        self.run_cpu = array("d")
        self.busiest_gaps = []

    def report(self) -> dict[str, Any]:
        """The window's figures, in milliseconds where timed.

        A stall is how much longer than the 1 ms sleep a gap took. For the largest one it
        gives the hub thread's CPU time and the garbage collection time within it; it also
        gives the largest stall once the collections inside each gap are taken out.
        """
        gaps, cpus, collections = list(self.gaps), list(self.gap_cpu), list(self.gap_gc)
        queued = list(self.gap_queued)
        count = min(len(gaps), len(cpus), len(collections), len(queued))
        if not count:
            return {"ticks": 0}
        tick_ms = TICK_S * 1000
        worst = max(range(count), key=gaps.__getitem__)
        ordered = sorted(gaps[:count])
        p999 = _p999(ordered)
        # What the hub itself did in a gap: the work queued ahead of the timer. The rest of a
        # gap is time the thread was not running (the OS ran other processes, or another
        # thread held the GIL), which a saturated 2-core machine adds to every figure.
        busy = sorted(cpus[:count])
        busy_p999 = _p999(busy)
        # The stall the broker answers for: each gap less the time its thread waited for a
        # CPU, which on a saturated machine is the scheduler's share among the processes.
        off_queue = sorted(
            gap - wait for gap, wait in zip(gaps[:count], queued[:count], strict=True)
        )
        without_gc = max(
            gap - collecting for gap, collecting in zip(gaps, collections, strict=False)
        )
        pause, generation = max(self.gc_pauses, default=(0.0, -1))
        run_cpu = sorted(self.run_cpu)
        long_runs = len(run_cpu) - bisect.bisect_right(run_cpu, RUN_LIMIT_MS / 1000)
        run_p999 = _p999(run_cpu) if run_cpu else 0.0
        runs = sorted(self.longest_runs.items(), key=lambda item: item[1][1], reverse=True)
        clean = max(
            self.longest_runs_without_gc.items(), key=lambda item: item[1][1], default=("", (0, 0))
        )
        return {
            "ticks": count,
            "max_gap_ms": gaps[worst] * 1000,
            "max_stall_ms": gaps[worst] * 1000 - tick_ms,
            "max_stall_hub_cpu_ms": cpus[worst] * 1000,
            "max_stall_gc_ms": collections[worst] * 1000,
            "max_stall_without_gc_ms": without_gc * 1000 - tick_ms,
            "p999_stall_ms": p999 * 1000 - tick_ms,
            "max_stall_run_queue_ms": queued[worst] * 1000,
            "p999_gap_run_queue_ms": _p999(sorted(queued[:count])) * 1000,
            "p999_stall_off_run_queue_ms": _p999(off_queue) * 1000 - tick_ms,
            "max_gap_hub_cpu_ms": busy[-1] * 1000,
            "p999_gap_hub_cpu_ms": busy_p999 * 1000,
            "stalls_over_limit": sum(1 for gap in ordered if gap * 1000 - tick_ms > STALL_LIMIT_MS),
            "gc_collections": len(self.gc_pauses),
            "max_gc_pause_ms": pause * 1000,
            "max_gc_pause_generation": generation,
            "max_run_cpu_ms": runs[0][1][1] * 1000 if runs else 0.0,
            "max_run_ms": runs[0][1][0] * 1000 if runs else 0.0,
            # A collection runs inside whichever greenlet allocated: the longest run without
            # one is the longest stretch of the broker's own work.
            "max_run_without_gc_cpu_ms": clean[1][1] * 1000,
            "max_run_without_gc_kind": clean[0],
            "runs_with_gc": self.runs_with_gc,
            "runs": len(run_cpu),
            "runs_over_limit": long_runs,
            "p999_run_cpu_ms": run_p999 * 1000,
            # The ticker's work per run takes microseconds: its longest run is what this
            # machine charges a run beyond its work (interrupts, the host's pauses).
            "ticker_run_cpu_ms": self.longest_runs.get(TICKER_NAME, (0.0, 0.0))[1] * 1000,
            "longest_runs_ms": {name: (ran * 1000, cpu * 1000) for name, (ran, cpu) in runs[:6]},
            "busiest_gaps": [
                {"hub_cpu_ms": cpu, "gap_ms": gap, "runs": kinds}
                for cpu, gap, _, kinds in sorted(self.busiest_gaps, reverse=True)
            ],
        }

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._collections += 1
            self._gc_began = time.perf_counter()
        else:
            took = time.perf_counter() - self._gc_began
            self._gc_since_tick += took
            self.gc_pauses.append((took, int(info.get("generation", -1))))


def _p999(ordered: Sequence[float]) -> float:
    return ordered[min(len(ordered) - 1, int(0.999 * len(ordered)))]


def run_queue_clock() -> Callable[[], float]:
    """A clock of the seconds the calling thread has waited in the kernel's run queue (the
    second field of Linux's ``/proc/thread-self/schedstat``); one that stays at 0 where that
    file cannot be read."""
    try:
        fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
    except OSError:
        return lambda: 0.0

    def waited() -> float:
        return int(os.pread(fd, 128, 0).split()[1]) / 1e9

    try:
        waited()
    except (OSError, IndexError, ValueError):
        os.close(fd)
        return lambda: 0.0
    return waited


def greenlet_kind(glet: Any) -> str:
    """A greenlet's name without its serial number, so one kind of greenlet is one row."""
    if isinstance(glet, gevent.hub.Hub):
        return "hub (watcher callbacks)"
    name = getattr(glet, "name", None)
    if not isinstance(name, str):
        run = getattr(glet, "run", None)
        name = getattr(run, "__qualname__", None) or type(glet).__name__
    return name.split(" ", 1)[0].rstrip("-0123456789") or name


def charge_floor(seconds: float = 0.5, chunk: int = 20_000) -> dict[str, float]:
    """What this machine charges a fixed piece of work in CPU time: ``sum(range(chunk))``
    (about 0.3 ms here) timed over and over for ``seconds``, before any load.

    On a VM a run is sometimes charged several times its work with nothing else running
    (interrupts, the host): the longest of these is the floor under a longest-run figure
    that the broker's own code cannot go below.
    """
    costs = array("d")
    thread_clock = time.thread_time
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        began = thread_clock()
        sum(range(chunk))
        costs.append(thread_clock() - began)
    ordered = sorted(costs)
    return {
        "floor_chunks": len(ordered),
        "floor_median_ms": ordered[len(ordered) // 2] * 1000,
        "floor_max_ms": ordered[-1] * 1000,
        "floor_over_limit": len(ordered) - bisect.bisect_right(ordered, RUN_LIMIT_MS / 1000),
    }


def _start_ticker(meter: Meter) -> None:
    ticker = gevent.Greenlet(meter.ticker)
    ticker.name = TICKER_NAME
    ticker.start()


def _install_tracer(meter: Meter) -> None:
    greenlet.settrace(meter.trace_switches)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the probe until stdin ends."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage", choices=("memory", "disk"), default="disk")
    parser.add_argument("--data-dir", default="./data")
    parser.add_argument(
        "--sync-policy", choices=("every_batch", "interval", "never"), default="every_batch"
    )
    args = parser.parse_args(argv)
    floor = charge_floor()

    # The memory back-end ignores the data directory and the sync policy.
    broker = Broker(
        port=0,
        storage=args.storage,
        data_dir=args.data_dir,
        sync_policy=args.sync_policy,
        web_service_enabled=False,
    ).start()
    settle_heap()  # as `brokerlet serve` does once it is ready
    meter = Meter()
    # _hub is the broker thread's hub: the ticker must run on the loop that serves clients.
    broker._hub.loop.run_callback_threadsafe(_start_ticker, meter)
    broker._hub.loop.run_callback_threadsafe(_install_tracer, meter)
    print(f"{READY_PREFIX}{broker.service_url}", flush=True)
    try:
        for line in sys.stdin:
            command = line.strip()
            if command == "reset":
                meter.reset()
            elif command == "report":
                print(json.dumps(meter.report() | floor), flush=True)
    finally:
        meter.running = False
        broker.stop()


if __name__ == "__main__":
    main()
