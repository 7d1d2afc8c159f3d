"""What runs in the throughput bench's client processes: one producer each, or the consumer.

The official client's Python API holds the GIL for every send, callback and receive, so one
process tops out far below what the broker takes. The bench therefore spawns each producer and
the consumer as a process of its own (``multiprocessing``, spawn context). A worker builds its
client, says it is ready, waits for the shared start event, does its share and sends back one
report through its end of a pipe.

Times are ``time.monotonic_ns()``. On Linux that is CLOCK_MONOTONIC, one clock for every
process on the machine, so a send time stamped into a payload by a producer can be subtracted
from the receive time the consumer takes in another process.
"""

from __future__ import annotations

import struct
import time
from array import array
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from typing import Any

import pulsar

__all__ = [
    "MESSAGE_SIZE",
    "READY",
    "ConsumerJob",
    "ConsumerReport",
    "ProducerJob",
    "ProducerReport",
    "run_consumer",
    "run_producer",
]

MESSAGE_SIZE = 128
READY = "ready"

_SEND_TIME = struct.Struct(">q")
_PADDING = b"\x00" * (MESSAGE_SIZE - _SEND_TIME.size)
_RECEIVE_POLL_MS = 200  # how soon an idle consumer notices it should give up
_STOP_CHECK_EVERY = 4096  # messages between looks at the stop event while messages flow


@dataclass(frozen=True)
class ProducerJob:
    """One producer process's share of a run.

    Attributes:
        service_url: The broker's ``pulsar://`` URL.
        topic: The topic to send to.
        messages: How many messages this producer sends.
        batching: Whether the producer batches (with the client's default batching limits).
        max_pending: The producer's ``max_pending_messages``: most sends in flight at once.
        timeout: Seconds to wait for the start.
    """

    service_url: str
    topic: str
    messages: int
    batching: bool
    max_pending: int
    timeout: float


@dataclass(frozen=True)
class ConsumerJob:
    """The consumer process's part of a run.

    Attributes:
        service_url: The broker's ``pulsar://`` URL.
        topic: The topic to subscribe to.
        subscription: The Shared subscription's name.
        messages: How many messages to receive before reporting.
        timeout: Seconds to wait for the start.
    """

    service_url: str
    topic: str
    subscription: str
    messages: int
    timeout: float


@dataclass(frozen=True)
class ProducerReport:
    """What one producer did.

    Attributes:
        sent: Sends issued.
        first_send_ns: ``monotonic_ns`` just before the first send; 0 if none was made.
        last_completion_ns: ``monotonic_ns`` once every send was acknowledged (the flush
            returned); 0 if they were not.
        cpu_s: CPU seconds (user + system, all threads) from the start to the flush's return.
        error: Why the producer did not finish, or None.
    """

    sent: int = 0
    first_send_ns: int = 0
    last_completion_ns: int = 0
    cpu_s: float = 0.0
    error: str | None = None


@dataclass(frozen=True)
class ConsumerReport:
    """What the consumer did.

    Attributes:
        received: Messages received (and acknowledged).
        last_receive_ns: ``monotonic_ns`` of the last receive; 0 if none arrived.
        latencies_ns: Send-to-receive latency of every message, an ``array("q")`` as bytes.
        cpu_s: CPU seconds (user + system, all threads) from the start to the last receive.
        error: Why the consumer did not finish, or None.
    """

    received: int = 0
    last_receive_ns: int = 0
    latencies_ns: bytes = b""
    cpu_s: float = 0.0
    error: str | None = None


def run_producer(job: ProducerJob, start: Event, conn: Connection) -> None:
    """Process entry point: send ``job.messages`` once ``start`` is set; report through ``conn``.

    Sends a :data:`READY` string once the producer is connected, then one
    :class:`ProducerReport`. A setup failure is reported as a :class:`ProducerReport` with
    ``error`` set, in place of :data:`READY`.
    """
    client = pulsar.Client(job.service_url, logger=_quiet_logger())
    try:
        try:
            producer = client.create_producer(
                job.topic,
                batching_enabled=job.batching,
                max_pending_messages=job.max_pending,
                block_if_queue_full=True,
            )
        except Exception as error:  # reported to the bench, which stops the run
            conn.send(ProducerReport(error=f"create_producer failed: {error!r}"))
            return
        conn.send(READY)
        if not start.wait(job.timeout):
            conn.send(ProducerReport(error="the start was never given"))
            return
        conn.send(_send_all(producer, job))
    finally:
        client.close()
        conn.close()


def run_consumer(job: ConsumerJob, start: Event, stop: Event, conn: Connection) -> None:
    """Process entry point: receive and ack ``job.messages``; report through ``conn``.

    Subscribes before saying :data:`READY` (so no message is sent before the subscription
    exists), then reports one :class:`ConsumerReport` once every message arrived or ``stop``
    was set.
    """
    client = pulsar.Client(job.service_url, logger=_quiet_logger())
    try:
        try:
            # The default ack grouping (100 ms) stays on: acks travel in batches.
            consumer = client.subscribe(
                job.topic, job.subscription, consumer_type=pulsar.ConsumerType.Shared
            )
        except Exception as error:  # reported to the bench, which stops the run
            conn.send(ConsumerReport(error=f"subscribe failed: {error!r}"))
            return
        conn.send(READY)
        if not start.wait(job.timeout):
            conn.send(ConsumerReport(error="the start was never given"))
            return
        conn.send(_receive_all(consumer, job.messages, stop))
    finally:
        client.close()
        conn.close()


def _send_all(producer: Any, job: ProducerJob) -> ProducerReport:
    """Send the share with async sends, then flush; the client bounds what is in flight.

    ``block_if_queue_full`` makes ``send_async`` wait while ``max_pending_messages`` sends
    are unacknowledged, so the bound costs no Python work here. The callback is a dict's
    ``__setitem__``, a C-level call, so a completed send runs no Python bytecode: a Python
    callback (entered from the client's I/O thread) about doubled this process's CPU per
    message. The dict ends up holding each distinct result that came back.
    """
    results: dict[Any, Any] = {}
    on_sent = results.__setitem__
    send_async = producer.send_async
    clock = time.monotonic_ns
    pack = _SEND_TIME.pack
    padding = _PADDING

    cpu_start = _cpu_seconds()
    first_send_ns = clock()
    error = None
    sent = 0
    try:
        for _ in range(job.messages):
            send_async(pack(clock()) + padding, on_sent)
            sent += 1
        producer.flush()
    except Exception as error_raised:  # reported in the run's result
        error = f"send failed after {sent} sends: {error_raised!r}"
    last_completion_ns = clock()
    cpu_s = _cpu_seconds() - cpu_start
    failed = sorted(str(result) for result in results if result != pulsar.Result.Ok)
    if error is None and failed:
        error = f"sends failed with {', '.join(failed)}"
    return ProducerReport(
        sent=sent,
        first_send_ns=first_send_ns if sent else 0,
        last_completion_ns=last_completion_ns if error is None else 0,
        cpu_s=cpu_s,
        error=error,
    )


def _receive_all(consumer: Any, expected: int, stop: Event) -> ConsumerReport:
    """Receive, time and ack each message until all arrived or ``stop`` is set."""
    receive = consumer.receive
    acknowledge = consumer.acknowledge
    unpack = _SEND_TIME.unpack_from
    clock = time.monotonic_ns
    latencies = array("q")
    record = latencies.append
    timeout_type = pulsar.Timeout

    cpu_start = _cpu_seconds()
    received = 0
    last_receive_ns = 0
    error = None
    try:
        while received < expected:
            try:
                message = receive(_RECEIVE_POLL_MS)
            except timeout_type:
                if stop.is_set():
                    break
                continue
            now = clock()
            record(now - unpack(message.data())[0])
            acknowledge(message)
            received += 1
            last_receive_ns = now
            if received % _STOP_CHECK_EVERY == 0 and stop.is_set():
                break
    except Exception as error_raised:  # reported in the run's result
        error = f"receive failed: {error_raised!r}"
    cpu_s = _cpu_seconds() - cpu_start
    if error is None and received < expected:
        error = f"only {received} of {expected} messages arrived"
    return ConsumerReport(received, last_receive_ns, latencies.tobytes(), cpu_s, error)


def _cpu_seconds() -> float:
    """User plus system CPU seconds this process (every thread) has used so far.

    ``process_time`` reads CLOCK_PROCESS_CPUTIME_ID to the nanosecond; psutil's figures
    come in 10 ms ticks, too coarse for a short run's CPU per message.
    """
    return time.process_time()


def _quiet_logger() -> Any:
    return pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn)
