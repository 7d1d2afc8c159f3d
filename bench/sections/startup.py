"""Start-up time: a broker subprocess until it accepts a TCP connection, and in-process."""

from __future__ import annotations

import dataclasses
import socket
import time
from dataclasses import dataclass

from bench.plan import Plan, SectionResult
from bench.report import Row, Summary, format_seconds, judge
from brokerlet import Broker
from brokerlet.testing import free_port
from brokerlet.testing.process import BrokerletProcess

__all__ = ["InProcessStart", "SubprocessStart", "time_in_process", "time_subprocess"]

_CONNECT_RETRY_S = 0.001  # the resolution of the measurement, not a synchronisation


@dataclass(frozen=True)
class SubprocessStart:
    """One ``brokerlet serve`` start.

    Attributes:
        connect_s: Spawn until a TCP connect to the broker's port succeeded.
        ready_line_s: Spawn until the ready line was read from its stdout.
    """

    connect_s: float
    ready_line_s: float


@dataclass(frozen=True)
class InProcessStart:
    """One in-process start.

    Attributes:
        start_s: Wall time of ``Broker(port=0).start()``.
        reported_s: The broker's own ``startup_seconds`` (actors and listener only).
    """

    start_s: float
    reported_s: float


def time_subprocess(timeout: float = 30.0) -> SubprocessStart:
    """Spawn ``python -m brokerlet serve`` and time it until it accepts a connection.

    The port is chosen up front so the bench can knock on it before the broker says
    anything; the process is stopped again before returning.
    """
    port = free_port()
    with BrokerletProcess(port=port) as broker:
        spawned = broker.spawn()
        deadline = spawned + timeout
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                    connected = time.perf_counter()
                break
            except OSError:
                if broker.exited() or time.perf_counter() > deadline:
                    raise RuntimeError(
                        f"broker never accepted a connection:\n{broker.log_tail()}"
                    ) from None
                time.sleep(_CONNECT_RETRY_S)
        broker.wait_ready(timeout)
        assert broker.ready_at is not None
        return SubprocessStart(
            connect_s=connected - spawned, ready_line_s=broker.ready_at - spawned
        )


def time_in_process() -> InProcessStart:
    """Start and stop a :class:`brokerlet.Broker` in this process, timing the start."""
    began = time.perf_counter()
    broker = Broker(port=0).start()
    started = time.perf_counter()
    try:
        reported = broker.startup_seconds
    finally:
        broker.stop()
    return InProcessStart(start_s=started - began, reported_s=reported or float("nan"))


# The section: ``--only startup``.

STARTUP_TARGET_S = 0.5


def run_startup(plan: Plan) -> SectionResult:
    """Time ``brokerlet serve`` to its first accepted connection, and the in-process start."""
    section = SectionResult()
    print(
        f"start-up: {plan.startup_repeats} subprocess and {plan.startup_repeats} in-process starts",
        flush=True,
    )
    spawned = [time_subprocess() for _ in range(plan.startup_repeats)]
    embedded = [time_in_process() for _ in range(plan.startup_repeats)]
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
        Row(
            "start-up, spawn to TCP accept",
            format_seconds(connect.median),
            _seconds_range(connect),
            target,
            judge(connect.median, at_most=STARTUP_TARGET_S),
        ),
        Row("  spawn to ready line", format_seconds(ready.median), _seconds_range(ready)),
        Row(
            "start-up, in-process start()",
            format_seconds(in_process.median),
            _seconds_range(in_process),
            target,
            judge(in_process.median, at_most=STARTUP_TARGET_S),
        ),
    ]
    return section


def _seconds_range(summary: Summary) -> str:
    return f"{format_seconds(summary.low)}-{format_seconds(summary.high)}"
