"""Client processes for the end-to-end sections: spawn them, release them together, collect.

Every end-to-end run (throughput, Key_Shared, storage) has the same shape: producer and
consumer processes of the official client (see :mod:`bench.clients.jobs`) each connect and say
they are ready; this process then sets one start event, and each worker sends back one report
through its pipe. :func:`drive` does that part and measures the broker's and the machine's CPU
over it; the sections turn the reports into their figures.
"""

from __future__ import annotations

import math
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnContext, SpawnProcess
from multiprocessing.synchronize import Event

import psutil

from bench.clients.jobs import READY, ConsumerReport, ProducerReport
from brokerlet.testing import percentile

__all__ = [
    "SETUP_TIMEOUT",
    "STOP_GRACE",
    "Collected",
    "NoReportError",
    "Worker",
    "close_all",
    "cpu_seconds",
    "drive",
    "machine_busy_seconds",
    "rate",
    "share_of_core",
    "shares",
]

SETUP_TIMEOUT = 60.0  # seconds for every worker to start, import the client and connect
STOP_GRACE = 10.0  # seconds a worker gets to report or exit once told to stop


class Worker:
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
            NoReportError: Nothing came in time, or the worker exited without a word.
        """
        connection: Connection = self.reports
        if not connection.poll(max(0.0, deadline - time.monotonic())):
            raise NoReportError(f"the {self.name} sent nothing in time")
        try:
            return connection.recv()
        except EOFError:
            self.process.join(STOP_GRACE)
            raise NoReportError(
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


class NoReportError(Exception):
    """A worker did not send what the bench waited for."""


@dataclass
class Collected:
    """What :func:`drive` gathered from one run.

    Attributes:
        producers: The producers' reports, in worker order; missing ones are left out.
        consumers: The consumers' reports, in worker order; missing ones are left out.
        errors: What went wrong, worker by worker; empty for a clean run.
        broker_cpu_s: CPU seconds the broker used from the start to the last report.
        machine_cpu_s: CPU seconds every core of the machine spent busy over the same span.
        elapsed_s: Wall seconds from the start to the last report.
        setup_error: Set (and nothing else is) when a worker failed before the start.
    """

    producers: list[ProducerReport] = field(default_factory=list)
    consumers: list[ConsumerReport] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    broker_cpu_s: float = math.nan
    machine_cpu_s: float = math.nan
    elapsed_s: float = math.nan
    setup_error: str | None = None


def drive(
    producers: Sequence[Worker],
    consumers: Sequence[Worker],
    start: Event,
    stop: Event,
    timeout: float,
    broker: psutil.Process | None,
    before_consumers: Callable[[float], object] | None = None,
    on_start: Callable[[], object] | None = None,
) -> Collected:
    """Wait until every worker is ready, release them together and collect their reports.

    Producers report first (each once its sends are acknowledged); the consumers get until
    ``timeout`` seconds after the start, then ``stop`` is set and they get
    :data:`STOP_GRACE` more to report what they have. ``before_consumers``, if given, is
    called with that deadline (a ``time.monotonic`` time) once the producers have reported,
    for consumers that report only when stopped; ``on_start``, if given, right after the
    start is given.
    """
    ready_by = time.monotonic() + SETUP_TIMEOUT
    try:
        for worker in [*consumers, *producers]:
            greeting = worker.receive(ready_by)
            if greeting != READY:
                return Collected(
                    setup_error=f"the {worker.name} failed to connect: {_error_of(greeting)}"
                )
    except NoReportError as silence:
        return Collected(setup_error=f"{silence} while connecting")

    collected = Collected()
    broker_cpu_start = cpu_seconds(broker)
    machine_cpu_start = machine_busy_seconds()
    started = time.monotonic()
    start.set()
    if on_start is not None:
        on_start()
    done_by = started + timeout
    for worker in producers:
        report = _report(worker, done_by, None, collected.errors)
        if report is not None:
            assert isinstance(report, ProducerReport)
            collected.producers.append(report)
    if collected.errors:
        stop.set()
    if before_consumers is not None:
        before_consumers(done_by)
    for worker in consumers:
        report = _report(worker, done_by, stop, collected.errors)
        if report is not None:
            assert isinstance(report, ConsumerReport)
            collected.consumers.append(report)
    collected.elapsed_s = time.monotonic() - started
    collected.broker_cpu_s = cpu_seconds(broker) - broker_cpu_start
    collected.machine_cpu_s = machine_busy_seconds() - machine_cpu_start
    return collected


def _report(
    worker: Worker, deadline: float, stop: Event | None, errors: list[str]
) -> ProducerReport | ConsumerReport | None:
    """A worker's report by ``deadline``; None (and the reason in ``errors``) if none came.

    With ``stop`` (consumers, which report what they have once stopped), a worker silent at
    the deadline is stopped and gets :data:`STOP_GRACE` more.
    """
    try:
        try:
            report = worker.receive(deadline)
        except NoReportError:
            if stop is None:
                raise
            stop.set()
            report = worker.receive(time.monotonic() + STOP_GRACE)
    except NoReportError as silence:
        errors.append(str(silence))
        return None
    assert isinstance(report, ProducerReport | ConsumerReport)
    if report.error is not None:
        errors.append(f"{worker.name}: {report.error}")
    return report


def close_all(workers: Sequence[Worker]) -> None:
    """Close every worker (after the caller has set the stop event)."""
    for worker in workers:
        worker.close()


def _error_of(message: object) -> str:
    error = getattr(message, "error", None)
    return str(error) if error is not None else repr(message)


def shares(messages: int, parts: int) -> list[int]:
    """``messages`` split into ``parts`` counts that differ by at most one."""
    if parts < 1:
        raise ValueError(f"need at least one part, not {parts}")
    base, extra = divmod(messages, parts)
    return [base + (1 if index < extra else 0) for index in range(parts)]


def rate(count: int, start_ns: int, end_ns: int) -> float:
    """``count`` per second over a span of ``monotonic_ns`` times; NaN for an empty span."""
    if not start_ns or end_ns <= start_ns:
        return math.nan
    return count / ((end_ns - start_ns) / 1e9)


def cpu_seconds(process: psutil.Process | None) -> float:
    """User plus system CPU seconds a process has used so far; 0 for None, NaN once gone."""
    if process is None:
        return 0.0
    try:
        times = process.cpu_times()
    except psutil.Error:  # the broker died: the run fails on its own, its figure is unknown
        return math.nan
    return float(times.user + times.system)


def machine_busy_seconds() -> float:
    """CPU seconds every core of the machine has spent busy (not idle, not waiting on I/O)."""
    times = psutil.cpu_times()
    # Guest time is already inside user and nice on Linux, so it is not added again.
    return float(times.user + times.nice + times.system + times.irq + times.softirq + times.steal)


def share_of_core(cpu_s: float, start_ns: int, end_ns: int) -> float:
    """CPU seconds over a wall-clock span of ``monotonic_ns`` times, in cores; NaN if empty."""
    if not start_ns or end_ns <= start_ns:
        return math.nan
    return cpu_s / ((end_ns - start_ns) / 1e9)


@dataclass(frozen=True)
class SendWindow:
    """What the producer processes of a run did, from their reports.

    Attributes:
        first_send_ns: ``monotonic_ns`` of the earliest send (0 if none).
        last_completion_ns: ``monotonic_ns`` of the latest acknowledged send.
        sent: Messages sent over all producers.
        cpu_s: CPU seconds over all producer processes.
        produce_rate: Sent per second over the window; NaN unless every producer saw all
            its sends acknowledged.
    """

    first_send_ns: int
    last_completion_ns: int
    sent: int
    cpu_s: float
    produce_rate: float

    @classmethod
    def of(cls, reports: Sequence[ProducerReport], expected: int | None = None) -> SendWindow:
        """The window of ``reports``; ``expected`` producers must all have reported."""
        first = min((r.first_send_ns for r in reports if r.first_send_ns), default=0)
        last = max((r.last_completion_ns for r in reports), default=0)
        sent = sum(r.sent for r in reports)
        complete = bool(reports) and all(r.last_completion_ns for r in reports)
        if expected is not None:
            complete = complete and len(reports) == expected
        return cls(
            first,
            last,
            sent,
            sum(r.cpu_s for r in reports),
            rate(sent, first, last) if complete else math.nan,
        )


def latency_ms(
    reports: Sequence[ProducerReport] | Sequence[ConsumerReport],
) -> tuple[float, float, int]:
    """p50 and p99 (milliseconds) of the latencies the reports carry, and how many."""
    latencies = array("q")
    for report in reports:
        latencies.frombytes(report.latencies_ns)
    return percentile(latencies, 0.50) / 1e6, percentile(latencies, 0.99) / 1e6, len(latencies)
