"""How long a FLOW takes to reach the dispatcher's permit total while the dispatcher is busy.

Two paths, measured side by side in one run, while the dispatcher actor sits in a handler that
takes 50 ms (waiting on I/O, say):

* **direct** — brokerlet's path: the connection actor adds the permits to the consumer and the
  dispatcher's total under the consumer's lock (``Consumer.flow``);
* **mailbox** — the permits travel as a message to the dispatcher actor, which adds them when it
  gets to the message (what a plain actor design would do).

Run: ``python -m bench.sections.flow [--samples N]``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from typing import Any

import gevent
import gevent.event

from bench.plan import Plan, SectionResult
from bench.report import Row, judge
from brokerlet.actors._conflate import ConflatedTell
from brokerlet.actors._runtime import GeventActor
from brokerlet.dispatch.consumer import ConnectionHandle, Consumer
from brokerlet.dispatch.permits import PermitTotal
from brokerlet.testing import percentile

BUSY_SECONDS = 0.050


class Busy:
    pass


class AddPermits:
    def __init__(self, count: int) -> None:
        self.count = count


class Wake:
    pass


class FakeDispatcher(GeventActor):
    """Holds the permit total; is kept busy by ``Busy`` messages that take 50 ms."""

    def __init__(self, total: PermitTotal) -> None:
        super().__init__()
        self.total = total

    def on_receive(self, message: Any) -> None:
        if isinstance(message, Busy):
            gevent.sleep(BUSY_SECONDS)
        elif isinstance(message, AddPermits):
            self.total.add(message.count)


def measure(path: str, samples: int) -> list[float]:
    total = PermitTotal()
    dispatcher = FakeDispatcher.start(total)
    handle = ConnectionHandle(peer="bench", channel=None, event_loop=None)  # type: ignore[arg-type]
    consumer = Consumer(1, "c", "t", "s", 1, 0, handle)
    # A stand-in dispatcher: the consumer only ever requests a read through the gate.
    consumer.attach(total, ConflatedTell(dispatcher, Wake()))  # type: ignore[arg-type]
    latencies = []
    try:
        for _ in range(samples):
            dispatcher.tell(Busy())
            gevent.sleep(BUSY_SECONDS / 5)  # the flow arrives while the handler runs
            before = total.value
            start = time.perf_counter()
            if path == "direct":
                consumer.flow(1)
            else:
                dispatcher.tell(AddPermits(1))
            while total.value == before:
                gevent.sleep(0.0001)
            latencies.append(time.perf_counter() - start)
            dispatcher.ask(Wake(), timeout=5)  # drain before the next sample
    finally:
        dispatcher.stop()
    return latencies


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=40)
    args = parser.parse_args(argv)
    results = {}
    print(f"FLOW to permit total while the dispatcher is busy for {BUSY_SECONDS * 1000:.0f} ms")
    print(f"{'path':<10}{'p50 ms':>12}{'p99 ms':>12}{'samples':>10}")
    for path in ("direct", "mailbox"):
        values = measure(path, args.samples)
        p50, p99 = statistics.median(values) * 1000, percentile(values, 0.99) * 1000
        results[path] = {"p50_ms": p50, "p99_ms": p99}
        print(f"{path:<10}{p50:>12.4f}{p99:>12.4f}{len(values):>10}")
    target = "MET" if results["direct"]["p99_ms"] < 0.1 else "MISSED"
    print(f"target: direct p99 < 0.1 ms: {target}")
    return results


if __name__ == "__main__":
    main()


# The section: ``--only flow``.

FLOW_P99_TARGET_MS = 0.1


def run_flow(plan: Plan) -> SectionResult:
    """``bench/sections/flow.py``: FLOW to the permit total while the dispatcher is busy."""
    print(f"flow: bench/sections/flow.py, {plan.flow_samples} samples per path", flush=True)
    results = main(["--samples", str(plan.flow_samples)])
    direct, mailbox = results["direct"], results["mailbox"]
    section = SectionResult(
        data={"samples": plan.flow_samples, "busy_ms": BUSY_SECONDS * 1000, **results}
    )
    ratio = mailbox["p99_ms"] / direct["p99_ms"] if direct["p99_ms"] > 0 else math.nan
    section.rows = [
        Row(
            "FLOW to permit total p50 / p99, direct",
            f"{direct['p50_ms']:.4f} / {direct['p99_ms']:.4f} ms",
            f"dispatcher busy {BUSY_SECONDS * 1000:.0f} ms",
            f"p99 < {FLOW_P99_TARGET_MS} ms",
            judge(direct["p99_ms"], below=FLOW_P99_TARGET_MS),
        ),
        Row(
            "  FLOW to permit total p50 / p99, mailbox",
            f"{mailbox['p50_ms']:.3f} / {mailbox['p99_ms']:.3f} ms",
            f"p99 {ratio:,.0f}x the direct path's",
            "comparison",
        ),
    ]
    return section
