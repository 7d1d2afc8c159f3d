"""End-to-end Key_Shared throughput through the official ``pulsar-client``, in client processes.

A run puts N consumers on one Key_Shared subscription of a fresh topic, spread over a few
consumer processes (see :func:`bench.clients.jobs.run_key_shared_consumers`), and producer
processes that send 128-byte messages, each with a ``partition_key`` drawn at random from a
fixed set of random keys. Each payload carries its producer's number, its key's number and
that key's sequence, so the consumer processes check per-key order as messages arrive; the
bench also checks that every key went to one consumer only.

No consumer process knows how many messages its keys will bring, so each one publishes its
running count in a shared integer; this process watches the sum and stops the consumers once
every message arrived.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

import psutil

from bench.clients.jobs import (
    KeySharedJob,
    ProducerJob,
    run_key_shared_consumers,
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
from bench.report import Row, Summary, format_rate, latency_row, rate_range, succeeded
from brokerlet.testing.process import BrokerletProcess

__all__ = ["KEY_SHARED_MODES", "KeySharedMode", "KeySharedResult", "run_key_shared_once"]

_WATCH_INTERVAL = 0.002  # seconds between looks at the consumers' counts (sets the stop only)


@dataclass(frozen=True)
class KeySharedMode:
    """How the producers send.

    Attributes:
        name: Short label.
        batching: Whether the producers batch.
        key_based: Batch by key (``BatchingType.KeyBased``: each batch holds one key).
        max_pending: Each producer's ``max_pending_messages``.
    """

    name: str
    batching: bool
    key_based: bool
    max_pending: int


KEY_SHARED_MODES = {
    "unbatched": KeySharedMode("unbatched", batching=False, key_based=False, max_pending=1_000),
    "key-based batching": KeySharedMode(
        "key-based batching", batching=True, key_based=True, max_pending=5_000
    ),
}


@dataclass(frozen=True)
class KeySharedResult:
    """Figures of one Key_Shared run.

    Attributes:
        mode: The mode's name.
        producers: Producer processes.
        consumer_processes: Consumer processes.
        consumers: Consumers on the subscription, over all consumer processes.
        keys: Keys the producers draw from.
        messages: Messages sent (and expected back), over all producers.
        sent: Sends issued.
        received: Messages received (and acknowledged) over all consumers.
        produce_rate: Sends per second, first send to the last producer's flush.
        end_to_end_rate: Received messages per second, first send to last receive.
        latency_p50_ms: Median send-to-receive latency, milliseconds.
        latency_p99_ms: 99th percentile send-to-receive latency, milliseconds.
        order_violations: Messages that arrived at or below the sequence last seen for their
            (producer, key) at their consumer process: out of order or duplicated.
        keys_at_several_consumers: Keys that reached more than one consumer.
        busiest_consumer_share: The busiest consumer's messages over an even share
            (1.0 = perfectly even); shows how evenly the keys spread.
        idle_consumers: Consumers that received nothing.
        broker_cpu: CPU the broker used over the run, in cores.
        client_cpu: CPU of every client process together, in cores.
        machine_cpu: CPU busy on the whole machine over the run, in cores.
        broker_cpu_per_message_us: Broker CPU time per received message, microseconds.
        error: Why the run did not complete, or None.
    """

    mode: str
    producers: int
    consumer_processes: int
    consumers: int
    keys: int
    messages: int
    sent: int = 0
    received: int = 0
    produce_rate: float = math.nan
    end_to_end_rate: float = math.nan
    latency_p50_ms: float = math.nan
    latency_p99_ms: float = math.nan
    order_violations: int = 0
    keys_at_several_consumers: int = 0
    busiest_consumer_share: float = math.nan
    idle_consumers: int = 0
    broker_cpu: float = math.nan
    client_cpu: float = math.nan
    machine_cpu: float = math.nan
    broker_cpu_per_message_us: float = math.nan
    error: str | None = None


def run_key_shared_once(
    service_url: str,
    mode: KeySharedMode,
    messages: int,
    timeout: float,
    broker: psutil.Process | None,
    *,
    producers: int,
    consumer_processes: int,
    consumers: int,
    keys: int,
) -> KeySharedResult:
    """Send ``messages`` with random keys through a fresh Key_Shared subscription; time them.

    Args:
        service_url: The broker's ``pulsar://`` URL.
        mode: How the producers send.
        messages: How many messages to send, split evenly over the producers.
        timeout: Seconds from the start for every message to be sent and received.
        broker: The broker's process, to report the CPU it used; None to skip that.
        producers: Producer processes.
        consumer_processes: Processes the consumers are spread over.
        consumers: Consumers on the subscription, over all consumer processes.
        keys: How many random keys the producers draw from.
    """
    topic = f"persistent://public/default/bench-key-shared-{uuid.uuid4().hex[:12]}"
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    stop = context.Event()
    counts: list[Any] = [context.RawValue("q", 0) for _ in range(consumer_processes)]
    consumer_workers: list[Worker] = []
    producer_workers: list[Worker] = []
    blank = KeySharedResult(mode.name, producers, consumer_processes, consumers, keys, messages)
    try:
        first = 0
        for index, share in enumerate(shares(consumers, consumer_processes)):
            job = KeySharedJob(
                service_url, topic, "bench-key-shared", share, first, timeout + SETUP_TIMEOUT
            )
            consumer_workers.append(
                Worker(
                    context,
                    f"consumer process {index + 1}",
                    run_key_shared_consumers,
                    (job, start, stop, counts[index]),
                )
            )
            first += share
        for index, share in enumerate(shares(messages, producers)):
            producer_job = ProducerJob(
                service_url,
                topic,
                share,
                mode.batching,
                mode.max_pending,
                SETUP_TIMEOUT,
                index=index,
                keys=keys,
                key_based_batching=mode.key_based,
            )
            producer_workers.append(
                Worker(context, f"producer {index + 1}", run_producer, (producer_job, start))
            )

        def until_all_received(deadline: float) -> None:
            # Polls shared integers; the figures come from the consumers' own timestamps.
            while (
                sum(count.value for count in counts) < messages
                and not stop.is_set()
                and time.monotonic() < deadline
            ):
                time.sleep(_WATCH_INTERVAL)
            stop.set()

        collected = drive(
            producer_workers, consumer_workers, start, stop, timeout, broker, until_all_received
        )
        return _figures(blank, collected)
    finally:
        stop.set()
        close_all([*consumer_workers, *producer_workers])


def _figures(blank: KeySharedResult, collected: Collected) -> KeySharedResult:
    """The run's figures from the workers' reports."""
    if collected.setup_error is not None:
        return _failed(blank, collected.setup_error)
    if len(collected.consumers) < blank.consumer_processes:
        return _failed(blank, "; ".join(collected.errors) or "a consumer process did not report")
    producers = collected.producers
    reports = collected.consumers
    errors = list(collected.errors)
    window = SendWindow.of(producers)
    last_receive_ns = max((r.last_receive_ns for r in reports), default=0)
    received = sum(r.received for r in reports)
    if received < blank.messages and not errors:
        errors.append(f"only {received} of {blank.messages} messages arrived in time")
    p50, p99, _ = latency_ms(reports)
    owners: dict[int, set[int]] = {}
    for report in reports:
        for key, numbers in report.key_owners.items():
            owners.setdefault(key, set()).update(numbers)
    per_consumer = [count for report in reports for count in report.per_consumer]
    even_share = received / len(per_consumer) if per_consumer and received else math.nan
    client_cpu_s = window.cpu_s + sum(r.cpu_s for r in reports)
    elapsed = collected.elapsed_s
    return dataclasses.replace(
        blank,
        sent=window.sent,
        received=received,
        produce_rate=window.produce_rate,
        end_to_end_rate=rate(received, window.first_send_ns, last_receive_ns),
        latency_p50_ms=p50,
        latency_p99_ms=p99,
        order_violations=sum(r.order_violations for r in reports),
        keys_at_several_consumers=sum(1 for numbers in owners.values() if len(numbers) > 1),
        busiest_consumer_share=max(per_consumer, default=0) / even_share,
        idle_consumers=sum(1 for count in per_consumer if count == 0),
        broker_cpu=collected.broker_cpu_s / elapsed,
        client_cpu=share_of_core(client_cpu_s, window.first_send_ns, last_receive_ns),
        machine_cpu=collected.machine_cpu_s / elapsed,
        broker_cpu_per_message_us=collected.broker_cpu_s * 1e6 / max(1, received),
        error="; ".join(errors) or None,
    )


def _failed(blank: KeySharedResult, error: str) -> KeySharedResult:
    return dataclasses.replace(blank, error=error)


# The section: ``--only keyshared``.

KEY_SHARED_CONSUMERS = 20
KEY_SHARED_CONSUMER_PROCESSES = 2
KEY_SHARED_KEYS = 1_000


def run_keyshared(plan: Plan, producers: int) -> SectionResult:
    """Unbatched and key-based batching runs, each mode on a broker of its own."""
    section = SectionResult()
    messages = plan.keyshared_messages
    layout = (
        f"{producers} producer process{'es' if producers != 1 else ''}, "
        f"{KEY_SHARED_CONSUMERS} Key_Shared consumers in "
        f"{KEY_SHARED_CONSUMER_PROCESSES} processes, {KEY_SHARED_KEYS:,} random keys"
    )
    section.data["layout"] = {
        "producers": producers,
        "consumers": KEY_SHARED_CONSUMERS,
        "consumer_processes": KEY_SHARED_CONSUMER_PROCESSES,
        "keys": KEY_SHARED_KEYS,
        "messages": messages,
    }
    for name, mode in KEY_SHARED_MODES.items():
        runs: list[KeySharedResult] = []
        with BrokerletProcess() as broker:
            url = broker.start().service_url
            process = psutil.Process(broker.pid)

            def once(
                count: int, url: str = url, process: psutil.Process = process, mode: Any = mode
            ) -> KeySharedResult:
                return run_key_shared_once(
                    url,
                    mode,
                    count,
                    run_timeout(count),
                    process,
                    producers=producers,
                    consumer_processes=KEY_SHARED_CONSUMER_PROCESSES,
                    consumers=KEY_SHARED_CONSUMERS,
                    keys=KEY_SHARED_KEYS,
                )

            print(
                f"keyshared, {name}: {layout}; warm-up of {plan.keyshared_warmup:,} messages",
                flush=True,
            )
            warm = once(plan.keyshared_warmup)
            if warm.error is not None:
                print(f"  warm-up failed: {warm.error}", flush=True)
            for index in range(plan.repeats):
                result = once(messages)
                print(
                    f"  run {index + 1}/{plan.repeats}, {messages:,} messages: "
                    f"{_describe_keyshared(result)}",
                    flush=True,
                )
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


_KEYSHARED_FIGURES = (
    "produce_rate",
    "end_to_end_rate",
    "latency_p50_ms",
    "latency_p99_ms",
    "busiest_consumer_share",
    "broker_cpu",
    "client_cpu",
    "machine_cpu",
    "broker_cpu_per_message_us",
)


def _summarise_keyshared(runs: list[KeySharedResult]) -> dict[str, Any]:
    good = [run for run in runs if run.error is None]
    summary: dict[str, Any] = {"runs": [dataclasses.asdict(run) for run in runs]}
    for figure in _KEYSHARED_FIGURES:
        summary[figure] = Summary.of([getattr(run, figure) for run in good]).as_dict()
    summary["order_violations"] = sum(run.order_violations for run in runs)
    summary["keys_at_several_consumers"] = sum(run.keys_at_several_consumers for run in runs)
    return summary


def _keyshared_rows(name: str, runs: list[KeySharedResult]) -> list[Row]:
    good, failures, note = succeeded(runs)
    end_to_end = Summary.of([run.end_to_end_rate for run in good])
    produce = Summary.of([run.produce_rate for run in good])
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
        Row(
            f"Key_Shared end-to-end, {name}",
            format_rate(end_to_end.median),
            rate_range(end_to_end) + note,
            "",
            failed,
        ),
        Row(f"  produce, {name}", format_rate(produce.median), rate_range(produce)),
        latency_row(f"  latency p50 / p99, {name}", good),
        Row(
            f"  CPU broker / clients / machine, {name}",
            f"{broker_cpu:.0%} / {client_cpu:.0%} / {machine_cpu:.0%}",
            f"broker {broker_us:.1f} µs per message",
        ),
        Row(
            f"  per-key order violations, {name}",
            f"{violations}",
            f"over {checked:,} messages in {len(runs)} runs",
            "0",
            failed or ("MET" if violations == 0 else "MISSED"),
        ),
        Row(
            f"  keys at more than one consumer, {name}",
            f"{spread_keys}",
            f"busiest consumer {busiest:.2f}x an even share; {idle} idle",
            "0",
            failed or ("MET" if spread_keys == 0 else "MISSED"),
        ),
    ]
