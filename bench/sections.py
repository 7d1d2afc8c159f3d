"""The plans, and the first three measurements: throughput, start-up and memory.

Each section runs end to end (brokers started, figures taken, rows made). The others live in
:mod:`bench.dispatch_sections` and :mod:`bench.storage_section`.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench import memory as memory_bench
from bench import profiling, startup
from bench.broker_process import BrokerProcess
from bench.report import Row, Summary, format_bytes, format_rate, format_seconds, judge
from bench.throughput import MODES, RunResult, run_once

__all__ = [
    "FULL",
    "QUICK",
    "Plan",
    "SectionResult",
    "run_memory",
    "run_startup",
    "run_throughput",
    "run_timeout",
]

END_TO_END_TARGETS = {"batched": 50_000.0, "unbatched": 15_000.0}
STARTUP_TARGET_S = 0.5
PER_CONNECTION_TARGET = 100_000.0  # bytes, "< 100 KB"
PROFILE_LIMIT = 25
SATURATED = 0.9  # share of a core from which a process counts as the bottleneck


@dataclass(frozen=True)
class Plan:
    """How much of everything to run.

    Attributes:
        repeats: Timed throughput runs per mode.
        messages: Messages per timed run, by mode.
        warmup: Messages in the untimed warm-up run, by mode.
        startup_repeats: Starts timed per kind of start.
        connections: Idle connections for the memory figure.
        compare_single_producer: Whether each timed throughput run is paired with one from
            a single producer process.
        keyshared_messages: Messages per timed Key_Shared run (``repeats`` runs per mode).
        keyshared_warmup: Messages in the untimed Key_Shared warm-up run, per mode.
        storage_rounds: Produce runs per storage back-end, the back-ends taking turns.
        storage_messages: Messages per storage produce run.
        storage_warmup: Messages in each back-end's untimed warm-up run.
        stall_messages: Messages sent to each stall probe.
        flow_samples: FLOW latency samples per path.
        selector_quick: Whether the selector micro-benchmark runs its short version.
        schema_rounds: Rounds of producer creations per kind in the schema section.
    """

    repeats: int
    messages: dict[str, int]
    warmup: dict[str, int]
    startup_repeats: int
    connections: int
    compare_single_producer: bool
    keyshared_messages: int
    keyshared_warmup: int
    storage_rounds: int
    storage_messages: int
    storage_warmup: int
    stall_messages: int
    flow_samples: int
    selector_quick: bool
    schema_rounds: int


FULL = Plan(
    repeats=3,
    messages={"batched": 400_000, "unbatched": 100_000},
    warmup={"batched": 40_000, "unbatched": 10_000},
    startup_repeats=5,
    connections=1000,
    compare_single_producer=True,
    keyshared_messages=150_000,
    keyshared_warmup=10_000,
    storage_rounds=5,
    storage_messages=100_000,
    storage_warmup=10_000,
    stall_messages=150_000,
    flow_samples=40,
    selector_quick=False,
    schema_rounds=200,
)
QUICK = Plan(
    repeats=3,
    messages={"batched": 20_000, "unbatched": 5_000},
    warmup={"batched": 5_000, "unbatched": 1_000},
    startup_repeats=3,
    connections=1000,
    compare_single_producer=False,
    keyshared_messages=10_000,
    keyshared_warmup=2_000,
    storage_rounds=2,
    storage_messages=10_000,
    storage_warmup=2_000,
    stall_messages=30_000,
    flow_samples=20,
    selector_quick=True,
    schema_rounds=40,
)


@dataclass
class SectionResult:
    """A section's figures for the JSON file and its rows for the table."""

    data: dict[str, Any] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    failed: bool = False


def run_timeout(messages: int) -> float:
    """Seconds a run of ``messages`` may take before it counts as failed."""
    # Generous: a run only fails this when the broker makes less than 2,000 msg/s.
    return max(30.0, messages / 2_000)


# Throughput.


def run_throughput(plan: Plan, profile_path: Path | None, producers: int) -> SectionResult:
    """Batched and unbatched runs, each mode on a broker of its own; optionally a profiled one.

    Every run drives the broker from ``producers`` producer processes and one consumer process.
    Unless the plan says otherwise, each timed run is followed by one with a single producer
    process on the same broker, so the two figures share conditions and their ratio is fair.
    """
    section = SectionResult()
    compare = plan.compare_single_producer and producers != 1
    for name, mode in MODES.items():
        messages = plan.messages[name]
        timeout = run_timeout(messages)
        runs: list[RunResult] = []
        single_runs: list[RunResult] = []
        with BrokerProcess() as broker:
            url = broker.start().service_url
            process = psutil.Process(broker.pid)
            print(f"throughput, {name}: {_producer_processes(producers)} + 1 consumer "
                  f"process; warm-up of {plan.warmup[name]:,} messages", flush=True)
            warm = run_once(url, mode, plan.warmup[name], run_timeout(plan.warmup[name]),
                            process, producers)
            if warm.error is not None:
                print(f"  warm-up failed: {warm.error}", flush=True)
            for index in range(plan.repeats):
                result = run_once(url, mode, messages, timeout, process, producers)
                print(f"  run {index + 1}/{plan.repeats}, {messages:,} messages, "
                      f"{_producer_processes(producers)}: {_describe(result)}", flush=True)
                runs.append(result)
                if compare:
                    single = run_once(url, mode, messages, timeout, process, 1)
                    print(f"  run {index + 1}/{plan.repeats}, {messages:,} messages, "
                          f"{_producer_processes(1)}: {_describe(single)}", flush=True)
                    single_runs.append(single)
        load = os.getloadavg()[0]
        print(f"  load average (1 min) after the {name} runs: {load:.2f}", flush=True)
        section.data[name] = {"producers": producers, "load_average_after": load,
                              **_summarise_mode(runs)}
        section.rows.extend(_mode_rows(name, runs))
        section.failed |= any(run.error is not None for run in runs)
        if compare:
            section.data[name]["single_producer"] = _summarise_mode(single_runs)
            section.rows.append(_single_producer_row(name, runs, single_runs))
            section.failed |= any(run.error is not None for run in single_runs)

    if profile_path is not None:
        section.data["profile"] = _profile_unbatched(plan, profile_path, producers)
    return section


def _describe(result: RunResult) -> str:
    text = (
        f"produce {format_rate(result.produce_rate)}, "
        f"end-to-end {format_rate(result.end_to_end_rate)}, "
        f"latency p50 {result.latency_p50_ms:.1f} ms p99 {result.latency_p99_ms:.1f} ms, "
        f"CPU broker {result.broker_cpu:.0%} busiest producer {result.producer_cpu:.0%} "
        f"consumer {result.consumer_cpu:.0%} all clients {result.client_cpu:.0%} "
        f"machine {result.machine_cpu:.0%}"
    )
    return text if result.error is None else f"{text}; FAILED: {result.error}"


_FIGURES = (
    "produce_rate",
    "end_to_end_rate",
    "latency_p50_ms",
    "latency_p99_ms",
    "broker_cpu",
    "producer_cpu",
    "consumer_cpu",
    "client_cpu",
    "machine_cpu",
    "broker_cpu_per_message_us",
    "producer_cpu_per_message_us",
    "consumer_cpu_per_message_us",
)


def _summarise_mode(runs: list[RunResult]) -> dict[str, Any]:
    good = [run for run in runs if run.error is None]
    summary: dict[str, Any] = {"runs": [dataclasses.asdict(run) for run in runs]}
    for figure in _FIGURES:
        summary[figure] = Summary.of([getattr(run, figure) for run in good]).as_dict()
    return summary


def _median(runs: list[RunResult], figure: str) -> float:
    return Summary.of([getattr(run, figure) for run in runs]).median


def _mode_rows(name: str, runs: list[RunResult]) -> list[Row]:
    good = [run for run in runs if run.error is None]
    failures = len(runs) - len(good)
    note = f" ({failures} of {len(runs)} runs failed)" if failures else ""
    producers = runs[0].producers if runs else 0
    end_to_end = Summary.of([run.end_to_end_rate for run in good])
    produce = Summary.of([run.produce_rate for run in good])
    p50 = Summary.of([run.latency_p50_ms for run in good])
    p99 = Summary.of([run.latency_p99_ms for run in good])
    broker_cpu = _median(good, "broker_cpu")
    producer_cpu = _median(good, "producer_cpu")
    consumer_cpu = _median(good, "consumer_cpu")
    client_cpu = _median(good, "client_cpu")
    machine_cpu = _median(good, "machine_cpu")
    broker_us = _median(good, "broker_cpu_per_message_us")
    producer_us = _median(good, "producer_cpu_per_message_us")
    consumer_us = _median(good, "consumer_cpu_per_message_us")
    target = END_TO_END_TARGETS[name]
    status = "FAILED" if failures else judge(end_to_end.median, at_least=target)
    bottleneck = _bottleneck(broker_cpu, producer_cpu, consumer_cpu, machine_cpu)
    return [
        Row(f"end-to-end, {name}", format_rate(end_to_end.median),
            _rate_range(end_to_end) + note, f">= {target:,.0f} msg/s", status),
        Row(f"  produce, {name}, {_producer_processes(producers)}",
            format_rate(produce.median), _rate_range(produce)),
        Row(f"  latency p50 / p99, {name}", f"{p50.median:.1f} / {p99.median:.1f} ms",
            f"p99 {p99.low:.1f}-{p99.high:.1f} ms"),
        Row(f"  CPU broker / busiest producer / consumer, {name}",
            f"{broker_cpu:.0%} / {producer_cpu:.0%} / {consumer_cpu:.0%}",
            f"all clients {client_cpu:.0%}, machine {machine_cpu:.0%} of {_cores():.0%} "
            f"(other work ~{_other_work(machine_cpu, broker_cpu, client_cpu):.0%}); "
            f"{bottleneck}"),
        Row(f"  CPU per message broker / clients, {name}",
            f"{broker_us:.1f} / {producer_us + consumer_us:.1f} µs",
            f"producers {producer_us:.1f} + consumer {consumer_us:.1f}; "
            f"broker ~ {_per_core(broker_us)} a core"),
    ]


def _single_producer_row(name: str, runs: list[RunResult], single: list[RunResult]) -> Row:
    """The side row: end to end with one producer process, next to the main figure."""
    good = [run for run in single if run.error is None]
    failures = len(single) - len(good)
    end_to_end = Summary.of([run.end_to_end_rate for run in good])
    several = _median([run for run in runs if run.error is None], "end_to_end_rate")
    ratio = several / end_to_end.median if end_to_end.median > 0 else math.nan
    note = f" ({failures} of {len(single)} runs failed)" if failures else ""
    producers = runs[0].producers if runs else 0
    return Row(f"  end-to-end, {name}, {_producer_processes(1)}",
               format_rate(end_to_end.median),
               f"{_rate_range(end_to_end)}; {producers} producers do {ratio:.2f}x this{note}",
               "comparison", "FAILED" if failures else "")


def _bottleneck(broker: float, producer: float, consumer: float, machine: float) -> str:
    """Which processes ran out of CPU; each client process is one GIL, about one core at most."""
    if math.isnan(broker):
        return "n/a"
    saturated = [
        label
        for label, busy in (
            ("broker", broker >= SATURATED),
            ("a producer process", producer >= SATURATED),
            ("consumer process", consumer >= SATURATED),
            ("machine", machine >= SATURATED * _cores()),
        )
        if busy
    ]
    return " and ".join(saturated) + " saturated" if saturated else "no process saturated"


def _producer_processes(count: int) -> str:
    return f"{count} producer process" + ("es" if count != 1 else "")


def _other_work(machine: float, broker: float, clients: float) -> float:
    """Cores busy with something besides the broker and the clients (other jobs, the kernel)."""
    return max(0.0, machine - broker - clients)


def _cores() -> float:
    return float(os.cpu_count() or 1)


def _per_core(microseconds: float) -> str:
    if math.isnan(microseconds) or microseconds <= 0:
        return "n/a"
    return format_rate(1e6 / microseconds)


def _rate_range(summary: Summary) -> str:
    if math.isnan(summary.median):
        return ""
    return f"{summary.low:,.0f}-{summary.high:,.0f}"


def _profile_unbatched(plan: Plan, profile_path: Path, producers: int) -> dict[str, Any]:
    """One more unbatched run, against a broker under cProfile; print its top functions."""
    messages = plan.messages["unbatched"]
    profile_path.parent.mkdir(parents=True, exist_ok=True)
    profile_path.unlink(missing_ok=True)
    print(f"profile: unbatched, {messages:,} messages, broker under cProfile", flush=True)
    with BrokerProcess(profile_path=profile_path) as broker:
        url = broker.start().service_url
        result = run_once(url, MODES["unbatched"], messages, run_timeout(messages),
                          psutil.Process(broker.pid), producers)
        print(f"  {_describe(result)} (slowed by the profiler)", flush=True)
        broker.stop()
    if not profile_path.exists():
        print(f"  no profile was written to {profile_path}", flush=True)
        return {"run": dataclasses.asdict(result), "path": None}
    by_cumulative = profiling.top_entries(profile_path, "cumulative", PROFILE_LIMIT)
    by_total = profiling.top_entries(profile_path, "tottime", PROFILE_LIMIT)
    packages = profiling.own_time_by_package(profile_path)
    print(f"  profile written to {profile_path}")
    print("  cProfile under gevent: greenlet switches make cumulative times overlap (a function"
          " waiting\n  in a switch is charged for the greenlets that ran meanwhile); own time is"
          " the reliable column.\n")
    profiling.print_packages(packages)
    profiling.print_top(by_cumulative, f"top {PROFILE_LIMIT} broker functions by cumulative time")
    profiling.print_top(by_total, f"top {PROFILE_LIMIT} broker functions by total (own) time")
    return {
        "run": dataclasses.asdict(result),
        "path": str(profile_path),
        "own_time_by_package_s": packages,
        "by_cumulative": by_cumulative,
        "by_total": by_total,
    }


# Start-up.


def run_startup(plan: Plan) -> SectionResult:
    """Time ``brokerlet serve`` to its first accepted connection, and the in-process start."""
    section = SectionResult()
    print(f"start-up: {plan.startup_repeats} subprocess and {plan.startup_repeats} in-process "
          "starts", flush=True)
    spawned = [startup.time_subprocess() for _ in range(plan.startup_repeats)]
    embedded = [startup.time_in_process() for _ in range(plan.startup_repeats)]
    connect = Summary.of([run.connect_s for run in spawned])
    ready = Summary.of([run.ready_line_s for run in spawned])
    in_process = Summary.of([run.start_s for run in embedded])
    reported = Summary.of([run.reported_s for run in embedded])
    section.data = {
        "subprocess_connect_s": connect.as_dict(),
        "subprocess_ready_line_s": ready.as_dict(),
        "in_process_start_s": in_process.as_dict(),
        "in_process_reported_s": reported.as_dict(),
        "runs": {
            "subprocess": [dataclasses.asdict(run) for run in spawned],
            "in_process": [dataclasses.asdict(run) for run in embedded],
        },
    }
    target = f"<= {STARTUP_TARGET_S} s"
    section.rows = [
        Row("start-up, spawn to TCP accept", format_seconds(connect.median),
            _seconds_range(connect), target, judge(connect.median, at_most=STARTUP_TARGET_S)),
        Row("  spawn to ready line", format_seconds(ready.median), _seconds_range(ready)),
        Row("start-up, in-process start()", format_seconds(in_process.median),
            _seconds_range(in_process), target,
            judge(in_process.median, at_most=STARTUP_TARGET_S)),
    ]
    return section


def _seconds_range(summary: Summary) -> str:
    return f"{format_seconds(summary.low)}-{format_seconds(summary.high)}"


# Memory.


def run_memory(plan: Plan) -> SectionResult:
    """The broker's RSS idle and with ``plan.connections`` handshaken idle connections."""
    print(f"memory: RSS idle and with {plan.connections:,} idle connections", flush=True)
    result = memory_bench.measure_memory(plan.connections)
    section = SectionResult(data=dataclasses.asdict(result))
    section.rows = [
        Row("RSS, idle", format_bytes(result.idle_rss)),
        Row(f"RSS, {result.connections:,} idle connections", format_bytes(result.loaded_rss)),
        Row("per idle connection", format_bytes(result.per_connection),
            f"{result.per_connection:,.0f} B", f"< {PER_CONNECTION_TARGET / 1000:.0f} KB",
            judge(result.per_connection, below=PER_CONNECTION_TARGET)),
        Row("  marginal, after the first few", format_bytes(result.marginal_per_connection),
            f"{result.marginal_per_connection:,.0f} B"),
    ]
    return section
