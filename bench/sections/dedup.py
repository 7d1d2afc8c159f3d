"""Deduplication's cost: produce msg/s with dedup on against off, unbatched, on one broker
in one run (target: on >= 90% of off).

The broker runs with ``brokerDeduplicationEnabled=false``; the "on" topics live in a
namespace whose ``deduplication`` policy is true (set over REST), so both kinds of run use
the same broker process, taking turns. Each run is :func:`bench.sections.throughput.run_once`
(producer and consumer processes of the official client) on a fresh topic.
"""

from __future__ import annotations

import uuid

import psutil
import requests

from bench.plan import Plan, SectionResult
from bench.report import Row, Summary, format_rate
from bench.sections.throughput import MODES, run_in_turns
from brokerlet.testing.process import BrokerletProcess

__all__ = ["run_dedup"]

TARGET = 0.90
DEDUP_NAMESPACE = "public/bench-dedup"


def run_dedup(plan: Plan, producers: int) -> SectionResult:
    section = SectionResult()
    mode = MODES["unbatched"]
    messages = plan.messages["unbatched"]
    with BrokerletProcess(web_service=True) as broker:
        url = broker.start().service_url
        process = psutil.Process(broker.pid)
        web = f"{broker.stats_url}/admin/v2"
        requests.put(f"{web}/namespaces/{DEDUP_NAMESPACE}", timeout=10).raise_for_status()
        requests.post(
            f"{web}/namespaces/{DEDUP_NAMESPACE}/deduplication", json=True, timeout=10
        ).raise_for_status()
        print(
            f"dedup: {mode.name}, {messages:,} messages per run, {producers} producer "
            "process(es), dedup off and on taking turns",
            flush=True,
        )
        runs = run_in_turns(
            {
                "dedup off": lambda: _topic("public/default"),
                "dedup on": lambda: _topic(DEDUP_NAMESPACE),
            },
            plan.repeats,
            url,
            mode,
            messages,
            process,
            producers,
        )
    off = Summary.of([r.produce_rate for r in runs["dedup off"]])
    on = Summary.of([r.produce_rate for r in runs["dedup on"]])
    ratio = on.median / off.median if off.median else float("nan")
    # Broker CPU per message: less at the mercy of other load on the machine than msg/s.
    cpu_off = Summary.of([r.broker_cpu_per_message_us for r in runs["dedup off"]])
    cpu_on = Summary.of([r.broker_cpu_per_message_us for r in runs["dedup on"]])
    section.data = {
        "produce_dedup_off": off.as_dict(),
        "produce_dedup_on": on.as_dict(),
        "ratio_on_to_off": ratio,
        "broker_cpu_per_message_us_off": cpu_off.as_dict(),
        "broker_cpu_per_message_us_on": cpu_on.as_dict(),
        "target": TARGET,
    }
    section.rows = [
        Row("produce, unbatched, dedup off", format_rate(off.median), _range(off)),
        Row("produce, unbatched, dedup on", format_rate(on.median), _range(on)),
        Row(
            "  dedup on / off",
            f"{ratio:.2f}x",
            f"target >= {TARGET:.2f}: {'met' if ratio >= TARGET else 'MISSED'}",
        ),
        Row(
            "broker CPU per message, dedup off / on",
            f"{cpu_off.median:.1f} / {cpu_on.median:.1f} us",
        ),
    ]
    section.failed = any(r.error is not None for rs in runs.values() for r in rs)
    return section


def _range(summary: Summary) -> str:
    return f"{summary.low:,.0f}-{summary.high:,.0f}"


def _topic(namespace: str) -> str:
    return f"persistent://{namespace}/bench-dedup-{uuid.uuid4().hex[:12]}"
