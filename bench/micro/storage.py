"""Storage benchmark: disk ledger appends under each sync policy against the in-memory ledger.

Run: ``python bench/micro/storage.py [--seconds 2] [--rounds 3] [--size 128] [--dir DIR]``

Producers are greenlets that keep up to ``--window`` appends of ``--batch`` entries of
``--size`` bytes in flight (like a Pulsar producer's pending-message queue) and yield to the
hub every 64 appends, as an actor does between messages. For each back-end the script prints
entries/s (and the ratio to the in-memory ledger measured in the same run), the p50/p99
latency from ``append`` to its callback, syncs per second, and how late a 1 ms ticker
greenlet woke: the largest stall of the hub, and its 99.9th percentile. Each figure is the
median over ``--rounds`` rounds, the back-ends interleaved, because a shared VM adds stalls
of its own.

The cyclic garbage collector is off while measuring (``--gc`` leaves it on): a full
collection over a million retained entries stalls the hub for 100 ms and more, which would
swamp what storage does; that pause belongs to the heap size, not to the back-end.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import gevent
import gevent.event

from brokerlet.storage import DiskStorage, FileOps, Ledger, MemoryLedger, new_entry
from brokerlet.testing import percentile
from brokerlet.transport.protocol import crc32c

TICK = 0.001
POLICIES = ("every_batch", "interval", "never")
FIELDS = ("rate", "p50_us", "p99_us", "stall_ms", "stall_p999_ms", "syncs_per_s")

Maker = Callable[[], tuple[Ledger, Callable[[], None], "CountingOps"]]
"""Makes a ledger to measure, with what closes it and the file calls it counts."""


class CountingOps(FileOps):
    """Counts data syncs (called on the writer thread; an int add is atomic enough here)."""

    def __init__(self) -> None:
        self.syncs = 0

    def sync(self, fd: int) -> None:
        self.syncs += 1
        super().sync(fd)


@dataclass
class Result:
    name: str
    rate: float
    p50_us: float
    p99_us: float
    stall_ms: float
    stall_p999_ms: float
    syncs_per_s: float


def run(
    ledger: Ledger, seconds: float, size: int, batch: int, producers: int, window: int
) -> tuple[float, list[float], list[float]]:
    """Drive ``ledger`` for ``seconds``; return (entries/s, latencies, ticker lateness) in s."""
    payload = os.urandom(size)
    entries = [new_entry(payload, crc32c(payload), 1)] * batch
    latencies: list[float] = []
    appended = 0
    running = True
    stalls: list[float] = []

    def ticker() -> None:
        expected = time.perf_counter() + TICK
        while running:
            gevent.sleep(TICK)
            now = time.perf_counter()
            stalls.append(now - expected)
            expected = now + TICK

    def producer() -> None:
        nonlocal appended
        outstanding = 0
        room = gevent.event.Event()
        room.set()
        count = 0
        while running:
            if outstanding >= window:
                room.clear()
                room.wait(1.0)
                continue
            started = time.perf_counter()

            def done(result: int | BaseException, started: float = started) -> None:
                nonlocal outstanding, appended
                if isinstance(result, BaseException):
                    raise result
                latencies.append(time.perf_counter() - started)
                appended += batch
                outstanding -= 1
                if outstanding < window:
                    room.set()

            outstanding += 1
            ledger.append(entries, done)
            count += 1
            if count % 64 == 0:
                # Yield through the loop (not just the callback queue) so timers and I/O
                # get their turn, as they do between an actor's messages in the broker.
                gevent.idle()

    workers = [gevent.spawn(producer) for _ in range(producers)]
    tick = gevent.spawn(ticker)
    gevent.sleep(0.2)  # warm-up, not measured
    latencies.clear()
    stalls.clear()
    begin_count = appended
    begin = time.perf_counter()
    gevent.sleep(seconds)
    elapsed = time.perf_counter() - begin
    total = appended - begin_count
    running = False
    gevent.joinall([*workers, tick], timeout=10)
    return total / elapsed, latencies, stalls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gc", action="store_true", help="leave the garbage collector on")
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1, help="entries per append call")
    parser.add_argument("--window", type=int, default=1000)
    parser.add_argument("--dir", default=None, help="parent directory for the data (default: tmp)")
    args = parser.parse_args()

    results: list[Result] = []

    def measure(name: str, make: Maker) -> None:
        ledger, close, ops = make()
        if not args.gc:
            gc.collect()
            gc.disable()
        try:
            rate, latencies, stalls = run(
                ledger, args.seconds, args.size, args.batch, args.producers, args.window
            )
        finally:
            gc.enable()
        syncs = ops.syncs / (args.seconds + 0.2)
        close()
        results.append(
            Result(
                name,
                rate,
                percentile(latencies, 0.50) * 1e6,
                percentile(latencies, 0.99) * 1e6,
                max(stalls) * 1e3,
                percentile(stalls, 0.999) * 1e3,
                syncs,
            )
        )

    def memory() -> tuple[Ledger, Callable[[], None], CountingOps]:
        ledger = MemoryLedger(1)
        return ledger, ledger.close, CountingOps()

    def disk(policy: str) -> Callable[[], tuple[Ledger, Callable[[], None], CountingOps]]:
        def make() -> tuple[Ledger, Callable[[], None], CountingOps]:
            root = tempfile.mkdtemp(prefix=f"storage-bench-{policy}-", dir=args.dir)
            ops = CountingOps()
            storage = DiskStorage(root, policy, file_ops=ops)
            ledger, _cursors = storage.open_topic("persistent://public/default/bench")
            ops.syncs = 0

            def close() -> None:
                storage.close()
                shutil.rmtree(root, ignore_errors=True)

            return ledger, close, ops

        return make

    backends: list[tuple[str, Maker]] = [("memory", memory)]
    backends += [(f"disk {policy}", disk(policy)) for policy in POLICIES]
    for _ in range(args.rounds):
        for name, make in backends:
            measure(name, make)
    medians = [
        Result(
            name,
            *(
                statistics.median(getattr(r, field) for r in results if r.name == name)
                for field in FIELDS
            ),
        )
        for name, _ in backends
    ]

    baseline = medians[0].rate
    print(
        f"{args.size}-byte entries, {args.batch} per append, "
        f"{args.producers} producers x {args.window} appends in flight, "
        f"median of {args.rounds} rounds of {args.seconds:g} s, "
        f"gc {'on' if args.gc else 'off'}"
    )
    print(
        f"{'back-end':<18}{'entries/s':>12}{'vs memory':>11}{'p50 µs':>10}{'p99 µs':>10}"
        f"{'syncs/s':>10}{'stall ms max':>14}{'p99.9':>7}"
    )
    for result in medians:
        print(
            f"{result.name:<18}{result.rate:>12,.0f}{result.rate / baseline:>10.0%} "
            f"{result.p50_us:>9,.0f}{result.p99_us:>10,.0f}{result.syncs_per_s:>10,.0f}"
            f"{result.stall_ms:>14.2f}{result.stall_p999_ms:>7.2f}"
        )


if __name__ == "__main__":
    main()
