"""Start-up time: a broker subprocess until it accepts a TCP connection, and in-process."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass

from bench.broker_process import BrokerProcess, free_port
from brokerlet import Broker

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
    with BrokerProcess(port=port) as broker:
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
                        f"broker never accepted a connection:\n{broker.stderr_tail()}"
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
