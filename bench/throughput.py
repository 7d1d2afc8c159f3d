"""Produce and end-to-end throughput through the official ``pulsar-client``.

One producer and one Shared consumer on a fresh topic, in this process, against a broker in
another. Each payload starts with its send time (``perf_counter_ns``), so the consumer can
measure end-to-end latency to the microsecond without trusting the millisecond publish
timestamp.
"""

from __future__ import annotations

import struct
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import pulsar

__all__ = ["MESSAGE_SIZE", "MODES", "Mode", "RunResult", "run_once"]

MESSAGE_SIZE = 128

_SEND_TIME = struct.Struct(">q")
_PADDING = b"\x00" * (MESSAGE_SIZE - _SEND_TIME.size)


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
    error: str | None = None


class _Receiver:
    """The consumer's message listener: records latency, acks, and signals the last one."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.received = 0
        self.latencies_ns: list[int] = []
        self.last_receive_ns = 0
        self.done = threading.Event()

    def on_message(self, consumer: Any, message: Any) -> None:
        now = time.perf_counter_ns()
        (sent_ns,) = _SEND_TIME.unpack_from(message.data())
        self.latencies_ns.append(now - sent_ns)
        consumer.acknowledge(message)
        self.received += 1
        if self.received == self.expected:
            self.last_receive_ns = now
            self.done.set()


class _Sender:
    """Send callbacks: frees a window slot per completion and signals the last one."""

    def __init__(self, expected: int, window: int) -> None:
        self.expected = expected
        self.window = threading.Semaphore(window)
        self.completed = 0
        self.failures = 0
        self.first_failure: str | None = None
        self.last_completion_ns = 0
        self.done = threading.Event()

    def on_sent(self, result: Any, _message_id: Any) -> None:
        if result != pulsar.Result.Ok:
            self.failures += 1
            if self.first_failure is None:
                self.first_failure = str(result)
        self.completed += 1
        self.window.release()
        if self.completed == self.expected:
            self.last_completion_ns = time.perf_counter_ns()
            self.done.set()


def run_once(service_url: str, mode: Mode, messages: int, timeout: float) -> RunResult:
    """Send ``messages`` through a fresh topic and time them out and back.

    Args:
        service_url: The broker's ``pulsar://`` URL.
        mode: How the producer sends.
        messages: How many messages to send.
        timeout: Seconds to wait for the last send and the last receive.

    Returns:
        The run's figures; ``error`` is set if not every message made it in time.
    """
    topic = f"persistent://public/default/bench-{mode.name}-{uuid.uuid4().hex[:12]}"
    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        receiver = _Receiver(messages)
        client.subscribe(
            topic,
            "bench",
            consumer_type=pulsar.ConsumerType.Shared,
            message_listener=receiver.on_message,
        )
        producer = client.create_producer(
            topic,
            batching_enabled=mode.batching,
            max_pending_messages=mode.max_pending,
            block_if_queue_full=True,
        )
        sender = _Sender(messages, mode.window)
        return _drive(producer, mode, messages, timeout, sender, receiver)
    finally:
        client.close()


def _drive(
    producer: Any,
    mode: Mode,
    messages: int,
    timeout: float,
    sender: _Sender,
    receiver: _Receiver,
) -> RunResult:
    acquire = sender.window.acquire
    send_async = producer.send_async
    on_sent = sender.on_sent
    clock = time.perf_counter_ns
    pack = _SEND_TIME.pack
    padding = _PADDING
    started_ns = clock()
    for _ in range(messages):
        acquire()
        send_async(pack(clock()) + padding, on_sent)
    producer.flush()
    deadline = time.monotonic() + timeout
    error = None
    if not sender.done.wait(max(0.0, deadline - time.monotonic())):
        error = f"only {sender.completed} of {messages} sends completed in {timeout:.0f} s"
    elif not receiver.done.wait(max(0.0, deadline - time.monotonic())):
        error = f"only {receiver.received} of {messages} messages arrived in {timeout:.0f} s"
    if sender.failures and error is None:
        error = f"{sender.failures} sends failed, first with {sender.first_failure}"
    produce_ns = (sender.last_completion_ns or clock()) - started_ns
    end_to_end_ns = (receiver.last_receive_ns or clock()) - started_ns
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
        error=error,
    )


def _percentile(ordered: list[int], fraction: float) -> float:
    """Nearest-rank percentile of an ascending list; NaN when it is empty."""
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, round(fraction * len(ordered)) - 1))
    return float(ordered[rank])
