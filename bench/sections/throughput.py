"""Produce and end-to-end throughput through the official ``pulsar-client``, in client processes.

A run puts N producers and one Shared consumer on a fresh topic, each in a process of its own
(see :mod:`bench.clients.jobs`), against a broker in yet another; this process only
coordinates (see :mod:`bench.clients.workers`): it starts the workers, waits until every one
is connected, releases them together with one event, and collects their reports through
pipes. Each payload starts with its send time (``monotonic_ns``, one clock machine-wide on
Linux), so the consumer measures end-to-end latency to the microsecond instead of trusting
the millisecond publish timestamp.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from bench import profiling
from bench.clients.jobs import (
    MESSAGE_SIZE,
    ConsumerJob,
    ConsumerReport,
    ProducerJob,
    ProducerReport,
    run_consumer,
    run_producer,
)
from bench.clients.workers import (
    SETUP_TIMEOUT,
    Collected,
    SendWindow,
    Worker,
    close_all,
    drive,
    latency_ms,
    rate,
    share_of_core,
    shares,
)
from bench.plan import Plan, SectionResult, run_timeout
from bench.report import (
    Row,
    Summary,
    format_rate,
    judge,
    latency_row,
    rate_range,
    succeeded,
)
from brokerlet.testing.process import BrokerletProcess

__all__ = [
    "DEFAULT_PRODUCERS",
    "MESSAGE_SIZE",
    "MODES",
    "Mode",
    "RunResult",
    "run_in_turns",
    "run_once",
]

DEFAULT_PRODUCERS = 2


@dataclass(frozen=True)
class Mode:
    """How the producers send.

    Attributes:
        name: Short label, ``"batched"`` or ``"unbatched"``.
        batching: Whether the producers batch (with the client's default batching limits).
        max_pending: Each producer's ``max_pending_messages``, which bounds its sends in
            flight (``send_async`` blocks at that many).
    """

    name: str
    batching: bool
    max_pending: int


MODES = {
    "batched": Mode("batched", batching=True, max_pending=5_000),
    "unbatched": Mode("unbatched", batching=False, max_pending=1_000),
}


@dataclass(frozen=True)
class RunResult:
    """Figures of one run.

    Attributes:
        mode: The mode's name.
        producers: Producer processes (there is always one consumer process besides).
        messages: Messages sent (and expected back), over all producers.
        sent: Sends issued over all producers (each acknowledged unless ``error`` is set).
        received: Messages the consumer received (and acknowledged).
        produce_rate: Sends per second, first send to the moment every producer had all its
            sends acknowledged.
        end_to_end_rate: Received messages per second, first send to last receive.
        latency_p50_ms: Median send-to-receive latency, milliseconds.
        latency_p99_ms: 99th percentile send-to-receive latency, milliseconds.
        broker_cpu: CPU the broker used over the run, in cores (1.0 = one core busy).
        producer_cpu: CPU of the busiest producer process while it sent, in cores. The
            client's C++ threads run outside the GIL, so this can pass 1.0 a little.
        consumer_cpu: CPU of the consumer process from the first send to its last receive,
            in cores.
        client_cpu: CPU of every client process together, from the first send to the last
            receive, in cores.
        machine_cpu: CPU busy on the whole machine over the run, whoever used it, in cores;
            with ``broker_cpu + client_cpu`` it shows how much other work competed.
        broker_cpu_per_message_us: Broker CPU time per received message, microseconds.
        producer_cpu_per_message_us: CPU time of all producer processes per sent message.
        consumer_cpu_per_message_us: CPU time of the consumer process per received message.
        error: Why the run did not complete, or None.

    A run that failed before it started has only the counts and ``error``; the rest is NaN.
    """

    mode: str
    producers: int
    messages: int
    sent: int = 0
    received: int = 0
    produce_rate: float = math.nan
    end_to_end_rate: float = math.nan
    latency_p50_ms: float = math.nan
    latency_p99_ms: float = math.nan
    broker_cpu: float = math.nan
    producer_cpu: float = math.nan
    consumer_cpu: float = math.nan
    client_cpu: float = math.nan
    machine_cpu: float = math.nan
    broker_cpu_per_message_us: float = math.nan
    producer_cpu_per_message_us: float = math.nan
    consumer_cpu_per_message_us: float = math.nan
    error: str | None = None


def run_once(
    service_url: str,
    mode: Mode,
    messages: int,
    timeout: float,
    broker: psutil.Process | None = None,
    producers: int = DEFAULT_PRODUCERS,
    topic: str | None = None,
) -> RunResult:
    """Send ``messages`` through a fresh topic from ``producers`` processes and time them.

    Args:
        service_url: The broker's ``pulsar://`` URL.
        mode: How the producers send.
        messages: How many messages to send, split evenly over the producers.
        timeout: Seconds from the start for every message to be sent and received.
        broker: The broker's process, to report the CPU it used; None to skip that.
        producers: How many producer processes to run.
        topic: The topic to use (a partitioned one, say); None makes a fresh one.

    Returns:
        The run's figures; ``error`` is set if not every message made it in time.
    """
    if topic is None:
        topic = f"persistent://public/default/bench-{mode.name}-{uuid.uuid4().hex[:12]}"
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    stop = context.Event()
    workers: list[Worker] = []
    try:
        consumer_job = ConsumerJob(service_url, topic, "bench", messages, SETUP_TIMEOUT)
        workers.append(Worker(context, "consumer", run_consumer, (consumer_job, start, stop)))
        for index, share in enumerate(shares(messages, producers)):
            job = ProducerJob(
                service_url, topic, share, mode.batching, mode.max_pending, SETUP_TIMEOUT
            )
            workers.append(Worker(context, f"producer {index + 1}", run_producer, (job, start)))
        collected = drive(workers[1:], workers[:1], start, stop, timeout, broker)
        return _result(mode, messages, producers, collected)
    finally:
        stop.set()
        close_all(workers)


def run_in_turns(
    topics: dict[str, Callable[[], str]],
    repeats: int,
    service_url: str,
    mode: Mode,
    messages: int,
    broker: psutil.Process,
    producers: int,
) -> dict[str, list[RunResult]]:
    """Run each variant once per repeat, variants taking turns on one broker, and print each.

    Args:
        topics: per variant's label, what makes the fresh topic of one of its runs.
        repeats: runs per variant.
        service_url, mode, messages, broker, producers: as for :func:`run_once`.

    Returns:
        Each variant's results, in run order.
    """
    runs: dict[str, list[RunResult]] = {label: [] for label in topics}
    for index in range(repeats):
        for label, topic in topics.items():
            result = run_once(
                service_url,
                mode,
                messages,
                run_timeout(messages),
                broker,
                producers=producers,
                topic=topic(),
            )
            runs[label].append(result)
            print(
                f"  run {index + 1}/{repeats}, {label}: produce "
                f"{format_rate(result.produce_rate)}, end-to-end "
                f"{format_rate(result.end_to_end_rate)}, broker CPU {result.broker_cpu:.0%}"
                + (f"; FAILED: {result.error}" if result.error else ""),
                flush=True,
            )
    return runs


def _result(mode: Mode, messages: int, producers: int, collected: Collected) -> RunResult:
    """The run's figures, or only its error when the consumer's report is missing."""
    if collected.setup_error is not None:
        return RunResult(mode.name, producers, messages, error=collected.setup_error)
    if not collected.consumers:
        return RunResult(mode.name, producers, messages, error="; ".join(collected.errors))
    return _figures(
        mode,
        messages,
        collected.producers,
        collected.consumers[0],
        collected.broker_cpu_s,
        collected.machine_cpu_s,
        collected.elapsed_s,
        "; ".join(collected.errors) or None,
    )


def _figures(
    mode: Mode,
    messages: int,
    producers: list[ProducerReport],
    consumer: ConsumerReport,
    broker_cpu_s: float,
    machine_cpu_s: float,
    elapsed_s: float,
    error: str | None,
) -> RunResult:
    """The run's figures from the workers' reports."""
    window = SendWindow.of(producers)
    p50, p99, _ = latency_ms([consumer])
    per_received = max(1, consumer.received)
    return RunResult(
        mode=mode.name,
        producers=len(producers),
        messages=messages,
        sent=window.sent,
        received=consumer.received,
        produce_rate=window.produce_rate,
        end_to_end_rate=rate(consumer.received, window.first_send_ns, consumer.last_receive_ns),
        latency_p50_ms=p50,
        latency_p99_ms=p99,
        broker_cpu=broker_cpu_s / elapsed_s,
        producer_cpu=max((_busy(report) for report in producers), default=math.nan),
        consumer_cpu=share_of_core(consumer.cpu_s, window.first_send_ns, consumer.last_receive_ns),
        client_cpu=share_of_core(
            window.cpu_s + consumer.cpu_s, window.first_send_ns, consumer.last_receive_ns
        ),
        machine_cpu=machine_cpu_s / elapsed_s,
        broker_cpu_per_message_us=broker_cpu_s * 1e6 / per_received,
        producer_cpu_per_message_us=window.cpu_s * 1e6 / max(1, window.sent),
        consumer_cpu_per_message_us=consumer.cpu_s * 1e6 / per_received,
        error=error,
    )


def _busy(report: ProducerReport) -> float:
    return share_of_core(report.cpu_s, report.first_send_ns, report.last_completion_ns)


# The section: ``--only throughput``.

END_TO_END_TARGETS = {"batched": 50_000.0, "unbatched": 15_000.0}
PROFILE_LIMIT = 25
SATURATED = 0.9  # share of a core from which a process counts as the bottleneck


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
        with BrokerletProcess() as broker:
            url = broker.start().service_url
            process = psutil.Process(broker.pid)
            print(
                f"throughput, {name}: {_producer_processes(producers)} + 1 consumer "
                f"process; warm-up of {plan.warmup[name]:,} messages",
                flush=True,
            )
            warm = run_once(
                url, mode, plan.warmup[name], run_timeout(plan.warmup[name]), process, producers
            )
            if warm.error is not None:
                print(f"  warm-up failed: {warm.error}", flush=True)
            for index in range(plan.repeats):
                result = run_once(url, mode, messages, timeout, process, producers)
                print(
                    f"  run {index + 1}/{plan.repeats}, {messages:,} messages, "
                    f"{_producer_processes(producers)}: {_describe(result)}",
                    flush=True,
                )
                runs.append(result)
                if compare:
                    single = run_once(url, mode, messages, timeout, process, 1)
                    print(
                        f"  run {index + 1}/{plan.repeats}, {messages:,} messages, "
                        f"{_producer_processes(1)}: {_describe(single)}",
                        flush=True,
                    )
                    single_runs.append(single)
        load = os.getloadavg()[0]
        print(f"  load average (1 min) after the {name} runs: {load:.2f}", flush=True)
        section.data[name] = {
            "producers": producers,
            "load_average_after": load,
            **_summarise_mode(runs),
        }
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
    good, failures, note = succeeded(runs)
    producers = runs[0].producers if runs else 0
    end_to_end = Summary.of([run.end_to_end_rate for run in good])
    produce = Summary.of([run.produce_rate for run in good])
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
        Row(
            f"end-to-end, {name}",
            format_rate(end_to_end.median),
            rate_range(end_to_end) + note,
            f">= {target:,.0f} msg/s",
            status,
        ),
        Row(
            f"  produce, {name}, {_producer_processes(producers)}",
            format_rate(produce.median),
            rate_range(produce),
        ),
        latency_row(f"  latency p50 / p99, {name}", good),
        Row(
            f"  CPU broker / busiest producer / consumer, {name}",
            f"{broker_cpu:.0%} / {producer_cpu:.0%} / {consumer_cpu:.0%}",
            f"all clients {client_cpu:.0%}, machine {machine_cpu:.0%} of {_cores():.0%} "
            f"(other work ~{_other_work(machine_cpu, broker_cpu, client_cpu):.0%}); "
            f"{bottleneck}",
        ),
        Row(
            f"  CPU per message broker / clients, {name}",
            f"{broker_us:.1f} / {producer_us + consumer_us:.1f} µs",
            f"producers {producer_us:.1f} + consumer {consumer_us:.1f}; "
            f"broker ~ {_per_core(broker_us)} a core",
        ),
    ]


def _single_producer_row(name: str, runs: list[RunResult], single: list[RunResult]) -> Row:
    """The side row: end to end with one producer process, next to the main figure."""
    good, failures, note = succeeded(single)
    end_to_end = Summary.of([run.end_to_end_rate for run in good])
    several = _median([run for run in runs if run.error is None], "end_to_end_rate")
    ratio = several / end_to_end.median if end_to_end.median > 0 else math.nan
    producers = runs[0].producers if runs else 0
    return Row(
        f"  end-to-end, {name}, {_producer_processes(1)}",
        format_rate(end_to_end.median),
        f"{rate_range(end_to_end)}; {producers} producers do {ratio:.2f}x this{note}",
        "comparison",
        "FAILED" if failures else "",
    )


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


def _profile_unbatched(plan: Plan, profile_path: Path, producers: int) -> dict[str, Any]:
    """One more unbatched run, against a broker under cProfile; print its top functions."""
    messages = plan.messages["unbatched"]
    profile_path.parent.mkdir(parents=True, exist_ok=True)
    profile_path.unlink(missing_ok=True)
    print(f"profile: unbatched, {messages:,} messages, broker under cProfile", flush=True)
    with BrokerletProcess(profile_path=profile_path) as broker:
        url = broker.start().service_url
        result = run_once(
            url,
            MODES["unbatched"],
            messages,
            run_timeout(messages),
            psutil.Process(broker.pid),
            producers,
        )
        print(f"  {_describe(result)} (slowed by the profiler)", flush=True)
        broker.stop()
    if not profile_path.exists():
        print(f"  no profile was written to {profile_path}", flush=True)
        return {"run": dataclasses.asdict(result), "path": None}
    by_cumulative = profiling.top_entries(profile_path, "cumulative", PROFILE_LIMIT)
    by_total = profiling.top_entries(profile_path, "tottime", PROFILE_LIMIT)
    packages = profiling.own_time_by_package(profile_path)
    print(f"  profile written to {profile_path}")
    print(
        "  cProfile under gevent: greenlet switches make cumulative times overlap (a function"
        " waiting\n  in a switch is charged for the greenlets that ran meanwhile); own time is"
        " the reliable column.\n"
    )
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
