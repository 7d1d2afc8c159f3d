"""Produce and end-to-end throughput through the official ``pulsar-client``.

One producer and one Shared consumer on a fresh topic, both in this process, against a broker
in another. Each payload starts with its send time (``perf_counter_ns``), so the consumer
measures end-to-end latency to the microsecond instead of trusting the millisecond publish
timestamp; both ends share this process's clock.
"""

from __future__ import annotations

import struct
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import psutil
import pulsar

__all__ = ["MESSAGE_SIZE", "MODES", "Mode", "RunResult", "run_once"]

MESSAGE_SIZE = 128

_SEND_TIME = struct.Struct(">q")
_PADDING = b"\x00" * (MESSAGE_SIZE - _SEND_TIME.size)
_RECEIVE_POLL_MS = 200  # how soon the receive thread notices it should give up


@dataclass(frozen=True)
class Mode:
    """How the producer sends.

    Attributes:
        name: Short label, ``"batched"`` or ``"unbatched"``.
        batching: Whether the producer batches (with the client's default batching limits).
        max_pending: The producer's ``max_pending_messages``.
        window: Most sends in flight at once, bounded by us through the send callbacks.
    """

    name: str
    batching: bool
    max_pending: int
    window: int


MODES = {
    "batched": Mode("batched", batching=True, max_pending=10_000, window=5_000),
    "unbatched": Mode("unbatched", batching=False, max_pending=1_000, window=1_000),
}


@dataclass(frozen=True)
class RunResult:
    """Figures of one run.

    Attributes:
        mode: The mode's name.
        messages: Messages sent (and expected back).
        sent: Sends whose callback reported success.
        received: Messages the consumer received.
        produce_rate: Completed sends per second, first send to last send callback.
        end_to_end_rate: Received messages per second, first send to last receive.
        latency_p50_ms: Median send-to-receive latency, milliseconds.
        latency_p99_ms: 99th percentile send-to-receive latency, milliseconds.
        broker_cpu: CPU the broker used over the run, in cores (1.0 = one core busy).
        client_cpu: CPU this process used over the run, in cores.
        broker_cpu_per_message_us: Broker CPU time per received message, microseconds.
        error: Why the run did not complete, or None.
    """

    mode: str
    messages: int
    sent: int
    received: int
    produce_rate: float
    end_to_end_rate: float
    latency_p50_ms: float
    latency_p99_ms: float
    broker_cpu: float
    client_cpu: float
    broker_cpu_per_message_us: float
    error: str | None = None


class _Receiver:
    """A thread that receives, records latency and acks each message."""

    def __init__(self, consumer: Any, expected: int) -> None:
        self.consumer = consumer
        self.expected = expected
        self.received = 0
        self.latencies_ns: list[int] = []
        self.last_receive_ns = 0
        self.failure: str | None = None
        self.done = threading.Event()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="bench-receiver", daemon=True)

    def _run(self) -> None:
        receive = self.consumer.receive
        acknowledge = self.consumer.acknowledge
        unpack = _SEND_TIME.unpack_from
        clock = time.perf_counter_ns
        latencies = self.latencies_ns
        try:
            while self.received < self.expected and not self.stopping.is_set():
                try:
                    message = receive(_RECEIVE_POLL_MS)
                except pulsar.Timeout:
                    continue
                now = clock()
                latencies.append(now - unpack(message.data())[0])
                acknowledge(message)
                self.received += 1
                self.last_receive_ns = now
        except Exception as error:  # reported in the run's result
            self.failure = f"receive failed: {error!r}"
        finally:
            self.done.set()


class _Sender:
    """Send callbacks: each frees a window slot; the last one is timed."""

    def __init__(self, expected: int, window: int) -> None:
        self.expected = expected
        self.window = threading.Semaphore(window)
        self.completed = 0
        self.failures = 0
        self.first_failure: str | None = None
        self.last_completion_ns = 0
        self.done = threading.Event()

    def on_sent(self, result: Any, _message_id: Any) -> None:
        # Runs on the client's I/O thread; an exception here would abort the process.
        if result != pulsar.Result.Ok:
            self.failures += 1
            if self.first_failure is None:
                self.first_failure = str(result)
        self.completed += 1
        self.window.release()
        if self.completed == self.expected:
            self.last_completion_ns = time.perf_counter_ns()
            self.done.set()


def run_once(
    service_url: str,
    mode: Mode,
    messages: int,
    timeout: float,
    broker: psutil.Process | None = None,
) -> RunResult:
    """Send ``messages`` through a fresh topic and time them out and back.

    Args:
        service_url: The broker's ``pulsar://`` URL.
        mode: How the producer sends.
        messages: How many messages to send.
        timeout: Seconds to wait, after the last send was issued, for the rest to arrive.
        broker: The broker's process, to report the CPU it used; None to skip that.

    Returns:
        The run's figures; ``error`` is set if not every message made it in time.
    """
    topic = f"persistent://public/default/bench-{mode.name}-{uuid.uuid4().hex[:12]}"
    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    receiver: _Receiver | None = None
    try:
        # The default ack grouping (100 ms) stays on: acks travel in batches.
        consumer = client.subscribe(topic, "bench", consumer_type=pulsar.ConsumerType.Shared)
        producer = client.create_producer(
            topic,
            batching_enabled=mode.batching,
            max_pending_messages=mode.max_pending,
            block_if_queue_full=True,
        )
        receiver = _Receiver(consumer, messages)
        sender = _Sender(messages, mode.window)
        return _drive(producer, mode, messages, timeout, sender, receiver, broker)
    finally:
        if receiver is not None and receiver.thread.is_alive():
            receiver.stopping.set()
            receiver.thread.join(timeout)
        client.close()


def _drive(
    producer: Any,
    mode: Mode,
    messages: int,
    timeout: float,
    sender: _Sender,
    receiver: _Receiver,
    broker: psutil.Process | None,
) -> RunResult:
    """Send everything, wait for it to come back, and compute the figures."""
    client = psutil.Process()
    acquire = sender.window.acquire
    send_async = producer.send_async
    on_sent = sender.on_sent
    clock = time.perf_counter_ns
    pack = _SEND_TIME.pack
    padding = _PADDING

    broker_cpu_start = _cpu_seconds(broker)
    client_cpu_start = _cpu_seconds(client)
    receiver.thread.start()
    started_ns = clock()
    error = None
    for _ in range(messages):
        if not acquire(True, timeout):
            error = f"the send window stayed full for {timeout:.0f} s"
            break
        send_async(pack(clock()) + padding, on_sent)
    if error is None and not sender.done.wait(timeout):
        error = f"only {sender.completed} of {messages} sends completed"
    if error is None:
        receiver.done.wait(timeout)
    finished_ns = clock()
    broker_cpu = _cpu_seconds(broker) - broker_cpu_start
    client_cpu = _cpu_seconds(client) - client_cpu_start

    if receiver.failure is not None:
        error = receiver.failure
    elif error is None and receiver.received < messages:
        error = f"only {receiver.received} of {messages} messages arrived"
    if error is None and sender.failures:
        error = f"{sender.failures} sends failed, the first with {sender.first_failure}"
    produce_ns = (sender.last_completion_ns or finished_ns) - started_ns
    end_to_end_ns = (receiver.last_receive_ns or finished_ns) - started_ns
    elapsed_s = (finished_ns - started_ns) / 1e9
    latencies = sorted(receiver.latencies_ns)
    return RunResult(
        mode=mode.name,
        messages=messages,
        sent=sender.completed - sender.failures,
        received=receiver.received,
        produce_rate=sender.completed / (produce_ns / 1e9),
        end_to_end_rate=receiver.received / (end_to_end_ns / 1e9),
        latency_p50_ms=_percentile(latencies, 0.50) / 1e6,
        latency_p99_ms=_percentile(latencies, 0.99) / 1e6,
        broker_cpu=broker_cpu / elapsed_s,
        client_cpu=client_cpu / elapsed_s,
        broker_cpu_per_message_us=broker_cpu * 1e6 / max(1, receiver.received),
        error=error,
    )


def _cpu_seconds(process: psutil.Process | None) -> float:
    """User plus system CPU seconds a process has used so far; 0 for None."""
    if process is None:
        return 0.0
    times = process.cpu_times()
    return float(times.user + times.system)


def _percentile(ordered: list[int], fraction: float) -> float:
    """Nearest-rank percentile of an ascending list; NaN when it is empty."""
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, round(fraction * len(ordered)) - 1))
    return float(ordered[rank])
