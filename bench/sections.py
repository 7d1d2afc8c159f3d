"""The three measurements, each run end to end: brokers started, figures taken, rows made."""

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

__all__ = ["FULL", "QUICK", "Plan", "SectionResult", "run_memory", "run_startup", "run_throughput"]

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
    """

    repeats: int
    messages: dict[str, int]
    warmup: dict[str, int]
    startup_repeats: int
    connections: int


FULL = Plan(
    repeats=3,
    messages={"batched": 200_000, "unbatched": 50_000},
    warmup={"batched": 20_000, "unbatched": 5_000},
    startup_repeats=5,
    connections=1000,
)
QUICK = Plan(
    repeats=3,
    messages={"batched": 20_000, "unbatched": 5_000},
    warmup={"batched": 5_000, "unbatched": 1_000},
    startup_repeats=3,
    connections=1000,
)


@dataclass
class SectionResult:
    """A section's figures for the JSON file and its rows for the table."""

    data: dict[str, Any] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    failed: bool = False


def _run_timeout(messages: int) -> float:
    # Generous: a run only fails this when the broker makes less than 2,000 msg/s.
    return max(30.0, messages / 2_000)


# Throughput.


def run_throughput(plan: Plan, profile_path: Path | None) -> SectionResult:
    """Batched and unbatched runs, each mode on a broker of its own; optionally a profiled one."""
    section = SectionResult()
    for name, mode in MODES.items():
        messages = plan.messages[name]
        runs: list[RunResult] = []
        with BrokerProcess() as broker:
            url = broker.start().service_url
            process = psutil.Process(broker.pid)
            print(f"throughput, {name}: warm-up of {plan.warmup[name]:,} messages", flush=True)
            warm = run_once(url, mode, plan.warmup[name], _run_timeout(plan.warmup[name]), process)
            if warm.error is not None:
                print(f"  warm-up failed: {warm.error}", flush=True)
            for index in range(plan.repeats):
                result = run_once(url, mode, messages, _run_timeout(messages), process)
                print(f"  run {index + 1}/{plan.repeats}, {messages:,} messages: "
                      f"{_describe(result)}", flush=True)
                runs.append(result)
        section.data[name] = _summarise_mode(runs)
        section.rows.extend(_mode_rows(name, runs))
        section.failed |= any(run.error is not None for run in runs)

    if profile_path is not None:
        section.data["profile"] = _profile_unbatched(plan, profile_path)
    return section


def _describe(result: RunResult) -> str:
    text = (
        f"produce {format_rate(result.produce_rate)}, "
        f"end-to-end {format_rate(result.end_to_end_rate)}, "
        f"latency p50 {result.latency_p50_ms:.1f} ms p99 {result.latency_p99_ms:.1f} ms, "
        f"CPU broker {result.broker_cpu:.0%} bench {result.client_cpu:.0%}"
    )
    return text if result.error is None else f"{text}; FAILED: {result.error}"


def _summarise_mode(runs: list[RunResult]) -> dict[str, Any]:
    good = [run for run in runs if run.error is None]
    return {
        "runs": [dataclasses.asdict(run) for run in runs],
        "produce_rate": Summary.of([run.produce_rate for run in good]).as_dict(),
        "end_to_end_rate": Summary.of([run.end_to_end_rate for run in good]).as_dict(),
        "latency_p50_ms": Summary.of([run.latency_p50_ms for run in good]).as_dict(),
        "latency_p99_ms": Summary.of([run.latency_p99_ms for run in good]).as_dict(),
        "broker_cpu": Summary.of([run.broker_cpu for run in good]).as_dict(),
        "client_cpu": Summary.of([run.client_cpu for run in good]).as_dict(),
        "broker_cpu_per_message_us": Summary.of(
            [run.broker_cpu_per_message_us for run in good]
        ).as_dict(),
    }


def _mode_rows(name: str, runs: list[RunResult]) -> list[Row]:
    good = [run for run in runs if run.error is None]
    failures = len(runs) - len(good)
    note = f" ({failures} of {len(runs)} runs failed)" if failures else ""
    end_to_end = Summary.of([run.end_to_end_rate for run in good])
    produce = Summary.of([run.produce_rate for run in good])
    p50 = Summary.of([run.latency_p50_ms for run in good])
    p99 = Summary.of([run.latency_p99_ms for run in good])
    broker_cpu = Summary.of([run.broker_cpu for run in good])
    client_cpu = Summary.of([run.client_cpu for run in good])
    per_message = Summary.of([run.broker_cpu_per_message_us for run in good])
    target = END_TO_END_TARGETS[name]
    status = "FAILED" if failures else judge(end_to_end.median, at_least=target)
    return [
        Row(f"end-to-end, {name}", format_rate(end_to_end.median),
            _rate_range(end_to_end) + note, f">= {target:,.0f} msg/s", status),
        Row(f"  produce, {name}", format_rate(produce.median), _rate_range(produce)),
        Row(f"  latency p50 / p99, {name}", f"{p50.median:.1f} / {p99.median:.1f} ms",
            f"p99 {p99.low:.1f}-{p99.high:.1f} ms"),
        Row(f"  CPU broker / bench, {name}",
            f"{broker_cpu.median:.0%} / {client_cpu.median:.0%}",
            f"of one core: {_bottleneck(broker_cpu.median, client_cpu.median)}"),
        Row(f"  broker CPU per message, {name}", f"{per_message.median:.1f} µs",
            f"~ {_per_core(per_message.median)} if it had a core to itself"),
    ]


def _bottleneck(broker_cpu: float, client_cpu: float) -> str:
    """Which side ran out of CPU; the bench process is one GIL, so about one core at most."""
    if math.isnan(broker_cpu):
        return "n/a"
    if broker_cpu >= SATURATED:
        return "broker saturated"
    if client_cpu >= SATURATED:
        return "bench process saturated"
    if broker_cpu + client_cpu >= SATURATED * (os.cpu_count() or 1):
        return "machine saturated"
    return "neither saturated"


def _per_core(microseconds: float) -> str:
    if math.isnan(microseconds) or microseconds <= 0:
        return "n/a"
    return format_rate(1e6 / microseconds)


def _rate_range(summary: Summary) -> str:
    if math.isnan(summary.median):
        return ""
    return f"{summary.low:,.0f}-{summary.high:,.0f}"


def _profile_unbatched(plan: Plan, profile_path: Path) -> dict[str, Any]:
    """One more unbatched run, against a broker under cProfile; print its top functions."""
    messages = plan.messages["unbatched"]
    profile_path.parent.mkdir(parents=True, exist_ok=True)
    profile_path.unlink(missing_ok=True)
    print(f"profile: unbatched, {messages:,} messages, broker under cProfile", flush=True)
    with BrokerProcess(profile_path=profile_path) as broker:
        url = broker.start().service_url
        result = run_once(url, MODES["unbatched"], messages, _run_timeout(messages),
                          psutil.Process(broker.pid))
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
