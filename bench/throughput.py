"""Produce and end-to-end throughput through the official ``pulsar-client``, in client processes.

A run puts N producers and one Shared consumer on a fresh topic, each in a process of its own
(see :mod:`bench.load_client`), against a broker in yet another; this process only coordinates.
It starts the workers, waits until every one is connected, releases them together with one
event, and collects their reports through pipes. Each payload starts with its send time
(``monotonic_ns``, one clock machine-wide on Linux), so the consumer measures end-to-end latency
to the microsecond instead of trusting the millisecond publish timestamp.
"""

from __future__ import annotations

import math
import multiprocessing
import time
import uuid
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnContext, SpawnProcess
from multiprocessing.synchronize import Event

import psutil

from bench.load_client import (
    MESSAGE_SIZE,
    READY,
    ConsumerJob,
    ConsumerReport,
    ProducerJob,
    ProducerReport,
    run_consumer,
    run_producer,
)

__all__ = ["DEFAULT_PRODUCERS", "MESSAGE_SIZE", "MODES", "Mode", "RunResult", "run_once"]

DEFAULT_PRODUCERS = 2
SETUP_TIMEOUT = 60.0  # seconds for every worker to start, import the client and connect
STOP_GRACE = 10.0  # seconds a worker gets to report or exit once told to stop


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


class _Worker:
    """A client process and the reading end of the pipe it reports through."""

    def __init__(
        self,
        context: SpawnContext,
        name: str,
        target: Callable[..., None],
        args: tuple[object, ...],
    ) -> None:
        self.name = name
        self.reports, child_end = context.Pipe(duplex=False)
        self.process: SpawnProcess = context.Process(
            target=target, args=(*args, child_end), name=f"bench-{name}", daemon=True
        )
        self.process.start()
        # Only the child holds the writing end now, so its exit reads as EOF here.
        child_end.close()

    def receive(self, deadline: float) -> object:
        """The next thing the worker sent, waiting until ``deadline`` (``time.monotonic``).

        Raises:
            _NoReportError: Nothing came in time, or the worker exited without a word.
        """
        connection: Connection = self.reports
        if not connection.poll(max(0.0, deadline - time.monotonic())):
            raise _NoReportError(f"the {self.name} sent nothing in time")
        try:
            return connection.recv()
        except EOFError:
            self.process.join(STOP_GRACE)
            raise _NoReportError(
                f"the {self.name} exited without reporting (exit code {self.process.exitcode})"
            ) from None

    def close(self) -> None:
        """Wait for the process to end, terminating (then killing) it if it does not."""
        self.process.join(STOP_GRACE)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(STOP_GRACE)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.reports.close()


class _NoReportError(Exception):
    """A worker did not send what the bench waited for."""


def run_once(
    service_url: str,
    mode: Mode,
    messages: int,
    timeout: float,
    broker: psutil.Process | None = None,
    producers: int = DEFAULT_PRODUCERS,
) -> RunResult:
    """Send ``messages`` through a fresh topic from ``producers`` processes and time them.

    Args:
        service_url: The broker's ``pulsar://`` URL.
        mode: How the producers send.
        messages: How many messages to send, split evenly over the producers.
        timeout: Seconds from the start for every message to be sent and received.
        broker: The broker's process, to report the CPU it used; None to skip that.
        producers: How many producer processes to run.

    Returns:
        The run's figures; ``error`` is set if not every message made it in time.
    """
    topic = f"persistent://public/default/bench-{mode.name}-{uuid.uuid4().hex[:12]}"
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    stop = context.Event()
    workers: list[_Worker] = []
    try:
        consumer_job = ConsumerJob(service_url, topic, "bench", messages, SETUP_TIMEOUT)
        workers.append(_Worker(context, "consumer", run_consumer, (consumer_job, start, stop)))
        for index, share in enumerate(_shares(messages, producers)):
            job = ProducerJob(service_url, topic, share, mode.batching, mode.max_pending,
                              SETUP_TIMEOUT)
            workers.append(_Worker(context, f"producer {index + 1}", run_producer, (job, start)))
        return _drive(mode, messages, timeout, workers[0], workers[1:], start, stop, broker)
    finally:
        stop.set()
        for worker in workers:
            worker.close()


def _drive(
    mode: Mode,
    messages: int,
    timeout: float,
    consumer: _Worker,
    producers: list[_Worker],
    start: Event,
    stop: Event,
    broker: psutil.Process | None,
) -> RunResult:
    """Release the workers together, collect their reports and compute the figures."""
    ready_by = time.monotonic() + SETUP_TIMEOUT
    try:
        for worker in [consumer, *producers]:
            greeting = worker.receive(ready_by)
            if greeting != READY:
                error = f"the {worker.name} failed to connect: {_error_of(greeting)}"
                return RunResult(mode.name, len(producers), messages, error=error)
    except _NoReportError as silence:
        return RunResult(mode.name, len(producers), messages, error=f"{silence} while connecting")

    broker_cpu_start = _cpu_seconds(broker)
    machine_cpu_start = _machine_busy_seconds()
    started = time.monotonic()
    start.set()
    done_by = started + timeout
    producer_reports: list[ProducerReport] = []
    errors: list[str] = []
    for worker in producers:
        try:
            report = worker.receive(done_by)
        except _NoReportError as silence:
            errors.append(str(silence))
            continue
        assert isinstance(report, ProducerReport)
        producer_reports.append(report)
        if report.error is not None:
            errors.append(f"{worker.name}: {report.error}")
    if errors:
        stop.set()
    try:
        consumer_report = consumer.receive(done_by)
    except _NoReportError:
        stop.set()
        try:
            consumer_report = consumer.receive(time.monotonic() + STOP_GRACE)
        except _NoReportError as silence:
            error = "; ".join([*errors, str(silence)])
            return RunResult(mode.name, len(producers), messages, error=error)
    finished = time.monotonic()
    broker_cpu = _cpu_seconds(broker) - broker_cpu_start
    machine_cpu = _machine_busy_seconds() - machine_cpu_start
    assert isinstance(consumer_report, ConsumerReport)
    if consumer_report.error is not None:
        errors.append(f"consumer: {consumer_report.error}")
    return _figures(mode, messages, producer_reports, consumer_report, broker_cpu, machine_cpu,
                    finished - started, "; ".join(errors) or None)


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
        produce_rate=_rate(sent, first_send_ns, last_completion_ns) if all_acknowledged
        else math.nan,
        end_to_end_rate=_rate(consumer.received, first_send_ns, consumer.last_receive_ns),
        latency_p50_ms=_percentile(ordered, 0.50) / 1e6,
        latency_p99_ms=_percentile(ordered, 0.99) / 1e6,
        broker_cpu=broker_cpu_s / elapsed_s,
        producer_cpu=max((_busy(report) for report in producers), default=math.nan),
        consumer_cpu=_share_of_core(consumer.cpu_s, first_send_ns, consumer.last_receive_ns),
        client_cpu=_share_of_core(producer_cpu_s + consumer.cpu_s, first_send_ns,
                                  consumer.last_receive_ns),
        machine_cpu=machine_cpu_s / elapsed_s,
        broker_cpu_per_message_us=broker_cpu_s * 1e6 / per_received,
        producer_cpu_per_message_us=producer_cpu_s * 1e6 / max(1, sent),
        consumer_cpu_per_message_us=consumer.cpu_s * 1e6 / per_received,
        error=error,
    )


def _error_of(message: object) -> str:
    error = getattr(message, "error", None)
    return str(error) if error is not None else repr(message)


def _shares(messages: int, parts: int) -> list[int]:
    """``messages`` split into ``parts`` counts that differ by at most one."""
    if parts < 1:
        raise ValueError(f"need at least one producer, not {parts}")
    base, extra = divmod(messages, parts)
    return [base + (1 if index < extra else 0) for index in range(parts)]


def _rate(count: int, start_ns: int, end_ns: int) -> float:
    if not start_ns or end_ns <= start_ns:
        return math.nan
    return count / ((end_ns - start_ns) / 1e9)


def _busy(report: ProducerReport) -> float:
    return _share_of_core(report.cpu_s, report.first_send_ns, report.last_completion_ns)


def _share_of_core(cpu_s: float, start_ns: int, end_ns: int) -> float:
    """CPU seconds over a wall-clock span, in cores; NaN for an empty span."""
    if not start_ns or end_ns <= start_ns:
        return math.nan
    return cpu_s / ((end_ns - start_ns) / 1e9)


def _cpu_seconds(process: psutil.Process | None) -> float:
    """User plus system CPU seconds a process has used so far; 0 for None, NaN once gone."""
    if process is None:
        return 0.0
    try:
        times = process.cpu_times()
    except psutil.Error:  # the broker died: the run fails on its own, its figure is unknown
        return math.nan
    return float(times.user + times.system)


def _machine_busy_seconds() -> float:
    """CPU seconds every core of the machine has spent busy (not idle, not waiting on I/O)."""
    times = psutil.cpu_times()
    # Guest time is already inside user and nice on Linux, so it is not added again.
    return float(times.user + times.nice + times.system + times.irq + times.softirq
                 + times.steal)


def _percentile(ordered: list[int], fraction: float) -> float:
    """Nearest-rank percentile of an ascending list; NaN when it is empty."""
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, round(fraction * len(ordered)) - 1))
    return float(ordered[rank])
