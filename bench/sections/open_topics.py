"""The open-topics section (``--only topics``): :mod:`bench.micro.open_topics`'s figures.

A test suite leaves a topic open per test; what a connection and a test-suite cycle cost the
broker must not grow with them. Pykka's registry made every actor's stop scan all running
actors (fixed by `brokerlet.actors._registry`): a connection's connect and close cost 3.7x
with 8,000 open topics. The target, ours, is that the cost stays within 1.2x of none.
"""

from __future__ import annotations

from bench.micro import open_topics
from bench.plan import Plan, SectionResult
from bench.report import Row, judge

__all__ = ["GROWTH_TARGET", "run_open_topics"]

GROWTH_TARGET = 1.2


def run_open_topics(plan: Plan) -> SectionResult:
    """Bare connections and raw cycles, brokers with none and with many open topics in turns."""
    many, cycles = (2_000, 50) if plan.micro_quick else (8_000, 200)
    print(f"topics: bench/micro/open_topics.py --counts 0,{many} --cycles {cycles}", flush=True)
    results = open_topics.measure([0, many], cycles)
    none, loaded = results
    section = SectionResult(data={"results": results})
    for key, name in (("connection_us", "connect + close"), ("cycle_us", "raw test-suite cycle")):
        ratio = loaded[key] / none[key]
        print(f"  {name}: {none[key]:,.0f} µs with none open, {loaded[key]:,.0f} with {many:,}")
        section.rows.append(
            Row(
                f"broker CPU of a {name}, {many:,} open topics vs none",
                f"{ratio:.2f}x",
                f"{loaded[key]:,.0f} vs {none[key]:,.0f} µs",
                f"<= {GROWTH_TARGET}x",
                judge(ratio, at_most=GROWTH_TARGET),
            )
        )
    return section
