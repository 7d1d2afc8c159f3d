"""Produce and end-to-end throughput through the official ``pulsar-client``, in client processes.

A run puts N producers and one Shared consumer on a fresh topic, each in a process of its own
(see :mod:`bench.load_client`), against a broker in yet another; this process only coordinates
(see :mod:`bench.workers`): it starts the workers, waits until every one is connected, releases
them together with one event, and collects their reports through pipes. Each payload starts
with its send time (``monotonic_ns``, one clock machine-wide on Linux), so the consumer measures
end-to-end latency to the microsecond instead of trusting the millisecond publish timestamp.
"""

from __future__ import annotations

import math
import multiprocessing
import uuid
from array import array
from dataclasses import dataclass

import psutil

from bench.load_client import (
    MESSAGE_SIZE,
    ConsumerJob,
    ConsumerReport,
    ProducerJob,
    ProducerReport,
    run_consumer,
    run_producer,
)
from bench.workers import (
    SETUP_TIMEOUT,
    Collected,
    Worker,
    close_all,
    drive,
    percentile,
    rate,
    share_of_core,
    shares,
)

__all__ = ["DEFAULT_PRODUCERS", "MESSAGE_SIZE", "MODES", "Mode", "RunResult", "run_once"]

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
            job = ProducerJob(service_url, topic, share, mode.batching, mode.max_pending,
                              SETUP_TIMEOUT)
            workers.append(Worker(context, f"producer {index + 1}", run_producer, (job, start)))
        collected = drive(workers[1:], workers[:1], start, stop, timeout, broker)
        return _result(mode, messages, producers, collected)
    finally:
        stop.set()
        close_all(workers)


def _result(mode: Mode, messages: int, producers: int, collected: Collected) -> RunResult:
    """The run's figures, or only its error when the consumer's report is missing."""
    if collected.setup_error is not None:
        return RunResult(mode.name, producers, messages, error=collected.setup_error)
    if not collected.consumers:
        return RunResult(mode.name, producers, messages, error="; ".join(collected.errors))
    return _figures(mode, messages, collected.producers, collected.consumers[0],
                    collected.broker_cpu_s, collected.machine_cpu_s, collected.elapsed_s,
                    "; ".join(collected.errors) or None)


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
    first_send_ns = min((report.first_send_ns for report in producers if report.first_send_ns),
                        default=0)
    last_completion_ns = max((report.last_completion_ns for report in producers), default=0)
    sent = sum(report.sent for report in producers)
    all_acknowledged = all(report.last_completion_ns for report in producers)
    producer_cpu_s = sum(report.cpu_s for report in producers)
    latencies = array("q")
    latencies.frombytes(consumer.latencies_ns)
    ordered = sorted(latencies)
    per_received = max(1, consumer.received)
    return RunResult(
        mode=mode.name,
        producers=len(producers),
        messages=messages,
        sent=sent,
        received=consumer.received,
        produce_rate=rate(sent, first_send_ns, last_completion_ns) if all_acknowledged
        else math.nan,
        end_to_end_rate=rate(consumer.received, first_send_ns, consumer.last_receive_ns),
        latency_p50_ms=percentile(ordered, 0.50) / 1e6,
        latency_p99_ms=percentile(ordered, 0.99) / 1e6,
        broker_cpu=broker_cpu_s / elapsed_s,
        producer_cpu=max((_busy(report) for report in producers), default=math.nan),
        consumer_cpu=share_of_core(consumer.cpu_s, first_send_ns, consumer.last_receive_ns),
        client_cpu=share_of_core(producer_cpu_s + consumer.cpu_s, first_send_ns,
                                  consumer.last_receive_ns),
        machine_cpu=machine_cpu_s / elapsed_s,
        broker_cpu_per_message_us=broker_cpu_s * 1e6 / per_received,
        producer_cpu_per_message_us=producer_cpu_s * 1e6 / max(1, sent),
        consumer_cpu_per_message_us=consumer.cpu_s * 1e6 / per_received,
        error=error,
    )


def _busy(report: ProducerReport) -> float:
    return share_of_core(report.cpu_s, report.first_send_ns, report.last_completion_ns)
