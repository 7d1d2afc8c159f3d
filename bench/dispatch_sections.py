"""The dispatch sections: Key_Shared end to end, backpressure, FLOW latency and selection.

``keyshared`` drives a ``brokerlet serve`` broker from client processes, like the throughput
section; ``backpressure`` runs a broker in this process (it flips a module global of the
dispatcher); ``flow`` and ``selector`` call :mod:`bench.flow_bench` and
:mod:`bench.selector_bench` and turn what they return into rows.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import psutil

from bench import flow_bench, selector_bench
from bench.backpressure import MESSAGES, BackpressureResult, run_diagnostic
from bench.broker_process import BrokerProcess
from bench.keyshared import KEY_SHARED_MODES, KeySharedResult, run_key_shared_once
from bench.report import Row, Summary, format_bytes, format_rate, judge
from bench.sections import Plan, SectionResult, run_timeout

__all__ = [
    "KEY_SHARED_CONSUMERS",
    "KEY_SHARED_CONSUMER_PROCESSES",
    "KEY_SHARED_KEYS",
    "run_backpressure",
    "run_flow",
    "run_keyshared",
    "run_selector",
]

KEY_SHARED_CONSUMERS = 20
KEY_SHARED_CONSUMER_PROCESSES = 2
KEY_SHARED_KEYS = 1_000
FLOW_P99_TARGET_MS = 0.1


# Key_Shared.


def run_keyshared(plan: Plan, producers: int) -> SectionResult:
    """Unbatched and key-based batching runs, each mode on a broker of its own."""
    section = SectionResult()
    messages = plan.keyshared_messages
    layout = (f"{producers} producer process{'es' if producers != 1 else ''}, "
              f"{KEY_SHARED_CONSUMERS} Key_Shared consumers in "
              f"{KEY_SHARED_CONSUMER_PROCESSES} processes, {KEY_SHARED_KEYS:,} random keys")
    section.data["layout"] = {"producers": producers, "consumers": KEY_SHARED_CONSUMERS,
                              "consumer_processes": KEY_SHARED_CONSUMER_PROCESSES,
                              "keys": KEY_SHARED_KEYS, "messages": messages}
    for name, mode in KEY_SHARED_MODES.items():
        runs: list[KeySharedResult] = []
        with BrokerProcess() as broker:
            url = broker.start().service_url
            process = psutil.Process(broker.pid)

            def once(count: int, url: str = url, process: psutil.Process = process,
                     mode: Any = mode) -> KeySharedResult:
                return run_key_shared_once(
                    url, mode, count, run_timeout(count), process, producers=producers,
                    consumer_processes=KEY_SHARED_CONSUMER_PROCESSES,
                    consumers=KEY_SHARED_CONSUMERS, keys=KEY_SHARED_KEYS)

            print(f"keyshared, {name}: {layout}; warm-up of {plan.keyshared_warmup:,} "
                  "messages", flush=True)
            warm = once(plan.keyshared_warmup)
            if warm.error is not None:
                print(f"  warm-up failed: {warm.error}", flush=True)
            for index in range(plan.repeats):
                result = once(messages)
                print(f"  run {index + 1}/{plan.repeats}, {messages:,} messages: "
                      f"{_describe_keyshared(result)}", flush=True)
                runs.append(result)
        load = os.getloadavg()[0]
        print(f"  load average (1 min) after the {name} runs: {load:.2f}", flush=True)
        section.data[name] = _summarise_keyshared(runs) | {"load_average_after": load}
        section.rows.extend(_keyshared_rows(name, runs))
        section.failed |= any(run.error is not None for run in runs)
    return section


def _describe_keyshared(result: KeySharedResult) -> str:
    text = (
        f"produce {format_rate(result.produce_rate)}, "
        f"end-to-end {format_rate(result.end_to_end_rate)}, "
        f"latency p50 {result.latency_p50_ms:.1f} ms p99 {result.latency_p99_ms:.1f} ms, "
        f"order violations {result.order_violations}, keys at several consumers "
        f"{result.keys_at_several_consumers}, busiest consumer "
        f"{result.busiest_consumer_share:.2f}x an even share, "
        f"CPU broker {result.broker_cpu:.0%} clients {result.client_cpu:.0%} "
        f"machine {result.machine_cpu:.0%}"
    )
    return text if result.error is None else f"{text}; FAILED: {result.error}"


_KEYSHARED_FIGURES = ("produce_rate", "end_to_end_rate", "latency_p50_ms", "latency_p99_ms",
                      "busiest_consumer_share", "broker_cpu", "client_cpu", "machine_cpu",
                      "broker_cpu_per_message_us")


def _summarise_keyshared(runs: list[KeySharedResult]) -> dict[str, Any]:
    good = [run for run in runs if run.error is None]
    summary: dict[str, Any] = {"runs": [dataclasses.asdict(run) for run in runs]}
    for figure in _KEYSHARED_FIGURES:
        summary[figure] = Summary.of([getattr(run, figure) for run in good]).as_dict()
    summary["order_violations"] = sum(run.order_violations for run in runs)
    summary["keys_at_several_consumers"] = sum(run.keys_at_several_consumers for run in runs)
    return summary


def _keyshared_rows(name: str, runs: list[KeySharedResult]) -> list[Row]:
    good = [run for run in runs if run.error is None]
    failures = len(runs) - len(good)
    note = f" ({failures} of {len(runs)} runs failed)" if failures else ""
    end_to_end = Summary.of([run.end_to_end_rate for run in good])
    produce = Summary.of([run.produce_rate for run in good])
    p50 = Summary.of([run.latency_p50_ms for run in good])
    p99 = Summary.of([run.latency_p99_ms for run in good])
    broker_cpu = Summary.of([run.broker_cpu for run in good]).median
    client_cpu = Summary.of([run.client_cpu for run in good]).median
    machine_cpu = Summary.of([run.machine_cpu for run in good]).median
    broker_us = Summary.of([run.broker_cpu_per_message_us for run in good]).median
    busiest = Summary.of([run.busiest_consumer_share for run in good]).median
    idle = max((run.idle_consumers for run in good), default=0)
    violations = sum(run.order_violations for run in runs)
    spread_keys = sum(run.keys_at_several_consumers for run in runs)
    checked = sum(run.received for run in runs)
    failed = "FAILED" if failures else ""
    return [
        Row(f"Key_Shared end-to-end, {name}", format_rate(end_to_end.median),
            _rate_range(end_to_end) + note, "", failed),
        Row(f"  produce, {name}", format_rate(produce.median), _rate_range(produce)),
        Row(f"  latency p50 / p99, {name}", f"{p50.median:.1f} / {p99.median:.1f} ms",
            f"p99 {p99.low:.1f}-{p99.high:.1f} ms" if good else ""),
        Row(f"  CPU broker / clients / machine, {name}",
            f"{broker_cpu:.0%} / {client_cpu:.0%} / {machine_cpu:.0%}",
            f"broker {broker_us:.1f} µs per message"),
        Row(f"  per-key order violations, {name}", f"{violations}",
            f"over {checked:,} messages in {len(runs)} runs", "0",
            failed or ("MET" if violations == 0 else "MISSED")),
        Row(f"  keys at more than one consumer, {name}", f"{spread_keys}",
            f"busiest consumer {busiest:.2f}x an even share; {idle} idle", "0",
            failed or ("MET" if spread_keys == 0 else "MISSED")),
    ]


def _rate_range(summary: Summary) -> str:
    if math.isnan(summary.median):
        return ""
    return f"{summary.low:,.0f}-{summary.high:,.0f}"


# Backpressure.


def run_backpressure(plan: Plan) -> SectionResult:
    """Pulsar's paused-consumer diagnostic, gated and ungated, on brokers in this process."""
    section = SectionResult()
    print(f"backpressure: {MESSAGES:,} unbatched 8 KiB messages, 8,192 permits, consumer "
          "socket paused, 16 KiB SO_SNDBUF / SO_RCVBUF; hold 1 s after the flip to "
          "unwritable", flush=True)
    results = {"gated": run_diagnostic(gated=True), "ungated": run_diagnostic(gated=False)}
    for label, result in results.items():
        print(f"  {label}: {_describe_backpressure(result)}", flush=True)
        section.data[label] = dataclasses.asdict(result) | {"bounded": result.bounded}
        section.rows.extend(_backpressure_rows(label, result))
        section.failed |= result.error is not None
    return section


def _describe_backpressure(result: BackpressureResult) -> str:
    if result.error is not None:
        return f"FAILED: {result.error}"
    return (f"{result.consumed_at_flip} dispatched at the flip; after the hold "
            f"{result.permits_consumed} permits consumed, "
            f"{result.pending_outbound_bytes:,} bytes pending "
            f"({'writable' if result.writable_after_hold else 'still unwritable'}); "
            f"resumed: {result.delivered} delivered, "
            f"{'in order' if result.in_order else 'NOT in order'}")


def _backpressure_rows(label: str, result: BackpressureResult) -> list[Row]:
    if result.error is not None:
        return [Row(f"backpressure, {label}", "n/a", result.error[:60], "", "FAILED")]
    if label == "gated":
        target = (f"<= {result.bound_consumed} / "
                  f"<= {format_bytes(result.bound_pending_bytes)}")
        status = "MET" if result.bounded else "MISSED"
    else:
        target, status = "comparison", ""
    return [
        Row(f"backpressure, {label}: permits consumed / pending out",
            f"{result.permits_consumed} / {format_bytes(result.pending_outbound_bytes)}",
            f"{result.consumed_at_flip} dispatched at the flip", target, status),
        Row(f"  resumed, {label}: delivered in order", f"{result.delivered:,}",
            "in order" if result.in_order else "NOT in order", f"all {MESSAGES:,} in order",
            "MET" if result.in_order and result.delivered == MESSAGES else "MISSED"),
    ]


# FLOW latency.


def run_flow(plan: Plan) -> SectionResult:
    """``bench/flow_bench.py``: FLOW to the permit total while the dispatcher is busy."""
    print(f"flow: bench/flow_bench.py, {plan.flow_samples} samples per path", flush=True)
    results = flow_bench.main(["--samples", str(plan.flow_samples)])
    direct, mailbox = results["direct"], results["mailbox"]
    section = SectionResult(data={"samples": plan.flow_samples, "busy_ms":
                                  flow_bench.BUSY_SECONDS * 1000, **results})
    ratio = mailbox["p99_ms"] / direct["p99_ms"] if direct["p99_ms"] > 0 else math.nan
    section.rows = [
        Row("FLOW to permit total p50 / p99, direct",
            f"{direct['p50_ms']:.4f} / {direct['p99_ms']:.4f} ms",
            f"dispatcher busy {flow_bench.BUSY_SECONDS * 1000:.0f} ms",
            f"p99 < {FLOW_P99_TARGET_MS} ms", judge(direct["p99_ms"], below=FLOW_P99_TARGET_MS)),
        Row("  FLOW to permit total p50 / p99, mailbox",
            f"{mailbox['p50_ms']:.3f} / {mailbox['p99_ms']:.3f} ms",
            f"p99 {ratio:,.0f}x the direct path's", "comparison"),
    ]
    return section


# Key_Shared selection.


def run_selector(plan: Plan) -> SectionResult:
    """``bench/selector_bench.py``: snapshot against SortedDict lookups, and batch selection."""
    print("selector: bench/selector_bench.py" + (" --quick" if plan.selector_quick else ""),
          flush=True)
    results = selector_bench.run(quick=plan.selector_quick)
    section = SectionResult(data={"quick": plan.selector_quick, "results": results})
    speedup = selector_bench.SNAPSHOT_SPEEDUP_TARGET
    batch_target = selector_bench.BATCH_NS_TARGET
    # One row per selector and target: the worst consumer count judged, every count shown.
    for kind in dict.fromkeys(figures["selector"] for figures in results):
        mine = [figures for figures in results if figures["selector"] == kind]
        slowest = min(mine, key=lambda figures: figures["ratio"])
        section.rows.append(Row(
            f"selector snapshot vs SortedDict, {kind}", f"{slowest['ratio']:.1f}x",
            "; ".join(f"{f['consumers']} consumers {f['ratio']:.1f}x" for f in mine)
            + " (worst judged)",
            f">= {speedup:.0f}x", judge(slowest["ratio"], at_least=speedup)))
        costliest = max(mine, key=lambda figures: figures["batch_ns"])
        section.rows.append(Row(
            f"  select_batch per entry, {kind}", f"{costliest['batch_ns']:.0f} ns",
            "; ".join(f"{f['consumers']} consumers {f['batch_ns']:.0f}" for f in mine)
            + " ns (worst judged)",
            f"< {batch_target:.0f} ns", judge(costliest["batch_ns"], below=batch_target)))
    return section
