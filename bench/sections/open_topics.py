"""The open-topics section (``--only topics``): :mod:`bench.micro.open_topics`'s figures.

A test suite leaves a topic open per test; what a connection and a test-suite cycle cost the
broker must not grow with them. Pykka's registry made every actor's stop scan all running
actors (fixed by `brokerlet.actors._registry`): a connection's connect and close cost 3.7x
with 8,000 open topics. The target, ours, is that the cost stays within 1.2x of none. The
periodic checks walk every open topic; how long a PING and a new topic's PRODUCER (topics
are made by the broker actor) wait meanwhile is shown with them running every second (they
held the hub for 147 ms a minute with 8,000 topics before they took turns). A full garbage
collection walks every open topic's tracked objects: the section shows how long one takes
with the many open (an embedded broker in a process of its own).
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
    ping_none, ping_many = none["ping_p999_ms"], loaded["ping_p999_ms"]
    print(f"  PING p99.9 while the periodic checks run: {ping_none:.1f} ms, {ping_many:.1f} ms")
    section.rows.append(
        Row(
            f"PING p99.9 while the periodic checks walk {many:,} open topics / none",
            f"{ping_many:.1f} / {ping_none:.1f} ms",
            f"slowest {loaded['slowest_ping_ms']:.1f} / {none['slowest_ping_ms']:.1f} ms; "
            "checks every second",
        )
    )
    print(
        f"  a new topic's PRODUCER while the checks run, p99: {none['creation_p99_ms']:.1f} ms, "
        f"{loaded['creation_p99_ms']:.1f} ms"
    )
    section.rows.append(
        Row(
            f"new topic's PRODUCER p99 while the checks walk {many:,} open topics / none",
            f"{loaded['creation_p99_ms']:.1f} / {none['creation_p99_ms']:.1f} ms",
            f"slowest {loaded['slowest_creation_ms']:.1f} / {none['slowest_creation_ms']:.1f} "
            "ms; checks every second",
        )
    )
    found = open_topics.heap(many)
    print(
        f"  full collection: {found['full_collection_ms_none']:.1f} ms with none open, "
        f"{found['full_collection_ms']:.1f} ms with {many:,}; "
        f"{found['tracked_per_topic']:.0f} tracked objects per open topic"
    )
    section.data["heap"] = found
    section.rows.append(
        Row(
            f"full garbage collection, {many:,} open topics / none",
            f"{found['full_collection_ms']:.0f} / {found['full_collection_ms_none']:.0f} ms",
            f"{found['tracked_per_topic']:.0f} tracked objects per open topic; embedded, memory",
        )
    )
    return section
