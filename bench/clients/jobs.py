"""What runs in the bench's client processes: one producer each, or the consumer(s).

The official client's Python API holds the GIL for every send, callback and receive, so one
process tops out far below what the broker takes. The bench therefore spawns each producer and
the consumer as a process of its own (``multiprocessing``, spawn context). A worker builds its
client, says it is ready, waits for the shared start event, does its share and sends back one
report through its end of a pipe.

Three kinds of worker: :func:`run_producer` (plain or keyed sends, optionally timing some
sends to their receipt), :func:`run_consumer` (one Shared consumer) and
:func:`run_key_shared_consumers` (several consumers on one Key_Shared subscription, checking
each key's order).

Times are ``time.monotonic_ns()``. On Linux that is CLOCK_MONOTONIC, one clock for every
process on the machine, so a send time stamped into a payload by a producer can be subtracted
from the receive time the consumer takes in another process.
"""

from __future__ import annotations

import os
import random
import struct
import threading
import time
from array import array
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from typing import Any

import pulsar

__all__ = [
    "MESSAGE_SIZE",
    "READY",
    "ConsumerJob",
    "ConsumerReport",
    "KeySharedJob",
    "ProducerJob",
    "ProducerReport",
    "key_space",
    "quiet_logger",
    "run_consumer",
    "run_key_shared_consumers",
    "run_producer",
]

MESSAGE_SIZE = 128
READY = "ready"

_SEND_TIME = struct.Struct(">q")
_PADDING = b"\x00" * (MESSAGE_SIZE - _SEND_TIME.size)
# A keyed payload: send time, producer number, key number, the key's sequence at that producer.
_KEYED = struct.Struct(">qIIq")
_KEYED_PADDING = b"\x00" * (MESSAGE_SIZE - _KEYED.size)
_KEY_SEED = 20_000_005  # every producer draws from the same key space
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
        index: This producer's number, stamped into keyed payloads.
        keys: Size of the key space each send draws a random ``partition_key`` from; 0 sends
            without keys.
        key_based_batching: Batch by key (``BatchingType.KeyBased``) rather than by arrival.
        latency_every: Time every this many sends from ``send_async`` to the receipt's
            callback; 0 times none (and runs no Python code per receipt).
        nice: Added to the process's niceness before it connects (0: unchanged), so the
            OS runs the broker first whenever both want a core.
    """

    service_url: str
    topic: str
    messages: int
    batching: bool
    max_pending: int
    timeout: float
    index: int = 0
    keys: int = 0
    key_based_batching: bool = False
    latency_every: int = 0
    nice: int = 0


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
class KeySharedJob:
    """A Key_Shared consumer process's part of a run.

    Attributes:
        service_url: The broker's ``pulsar://`` URL.
        topic: The topic to subscribe to.
        subscription: The Key_Shared subscription's name.
        consumers: How many consumers this process subscribes.
        first_consumer: The number of its first consumer; the others follow (numbers are
            unique over the run, so the bench can tell where each key went).
        timeout: Seconds to wait for the start, and then for the stop.
    """

    service_url: str
    topic: str
    subscription: str
    consumers: int
    first_consumer: int
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
        latencies_ns: Send-to-receipt latency of the timed sends (see
            ``ProducerJob.latency_every``), an ``array("q")`` as bytes.
    """

    sent: int = 0
    first_send_ns: int = 0
    last_completion_ns: int = 0
    cpu_s: float = 0.0
    error: str | None = None
    latencies_ns: bytes = b""


@dataclass(frozen=True)
class ConsumerReport:
    """What the consumer did.

    Attributes:
        received: Messages received (and acknowledged).
        last_receive_ns: ``monotonic_ns`` of the last receive; 0 if none arrived.
        latencies_ns: Send-to-receive latency of every message, an ``array("q")`` as bytes.
        cpu_s: CPU seconds (user + system, all threads) from the start to the last receive.
        error: Why the consumer did not finish, or None.
        order_violations: Keyed messages that arrived at or below the sequence last seen
            for their (producer, key): out of order or duplicated. Key_Shared only.
        key_owners: For each key number, the consumer numbers that received it (one each
            while no consumer joins or leaves). Key_Shared only.
        per_consumer: Messages each consumer of the process received. Key_Shared only.
    """

    received: int = 0
    last_receive_ns: int = 0
    latencies_ns: bytes = b""
    cpu_s: float = 0.0
    error: str | None = None
    order_violations: int = 0
    key_owners: dict[int, list[int]] = field(default_factory=dict)
    per_consumer: list[int] = field(default_factory=list)


def run_producer(job: ProducerJob, start: Event, conn: Connection) -> None:
    """Process entry point: send ``job.messages`` once ``start`` is set; report through ``conn``.

    Sends a :data:`READY` string once the producer is connected, then one
    :class:`ProducerReport`. A setup failure is reported as a :class:`ProducerReport` with
    ``error`` set, in place of :data:`READY`.
    """
    if job.nice:
        os.nice(job.nice)
    client = _client(job.service_url)
    try:
        try:
            options: dict[str, Any] = {}
            if job.key_based_batching:
                options["batching_type"] = pulsar.BatchingType.KeyBased
            producer = client.create_producer(
                job.topic,
                batching_enabled=job.batching,
                max_pending_messages=job.max_pending,
                block_if_queue_full=True,
                **options,
            )
        except Exception as error:  # reported to the bench, which stops the run
            conn.send(ProducerReport(error=f"create_producer failed: {error!r}"))
            return
        # Drawn before the start, so the random numbers cost the timed part nothing.
        choices = (
            random.Random(job.index).choices(range(job.keys), k=job.messages) if job.keys else []
        )
        conn.send(READY)
        if not start.wait(job.timeout):
            conn.send(ProducerReport(error="the start was never given"))
            return
        if job.keys or job.latency_every:
            conn.send(_send_keyed_or_timed(producer, job, choices))
        else:
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
    client = _client(job.service_url)
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


def run_key_shared_consumers(
    job: KeySharedJob, start: Event, stop: Event, progress: Any, conn: Connection
) -> None:
    """Process entry point: ``job.consumers`` consumers on one Key_Shared subscription.

    Each consumer gets a message listener; the client runs every listener on its one
    listener thread, so a consumer's messages are handled in the order they arrived. The
    listeners write the process's running count of received messages into ``progress``
    (a shared integer), from which the bench tells when the run is complete, since no one
    process knows how many messages its keys will bring. The process reports once ``stop``
    is set.
    """
    client = pulsar.Client(job.service_url, logger=quiet_logger(), message_listener_threads=1)
    tally = _KeySharedTally(job.first_consumer, job.consumers, progress)
    try:
        try:
            consumers = [
                client.subscribe(
                    job.topic,
                    job.subscription,
                    consumer_type=pulsar.ConsumerType.KeyShared,
                    consumer_name=f"consumer-{number}",
                    message_listener=tally.listener(number),
                )
                for number in range(job.first_consumer, job.first_consumer + job.consumers)
            ]
        except Exception as error:  # reported to the bench, which stops the run
            conn.send(ConsumerReport(error=f"subscribe failed: {error!r}"))
            return
        conn.send(READY)
        if not start.wait(job.timeout):
            conn.send(ConsumerReport(error="the start was never given"))
            return
        cpu_start = _cpu_seconds()
        stopped = stop.wait(job.timeout)
        for consumer in consumers:
            consumer.pause_message_listener()
        cpu_s = _cpu_seconds() - cpu_start
        conn.send(tally.report(cpu_s, None if stopped else "the stop was never given"))
    finally:
        client.close()
        conn.close()


class _KeySharedTally:
    """What the listeners of one Key_Shared consumer process saw, and their per-key checks."""

    def __init__(self, first: int, count: int, progress: Any) -> None:
        self.first = first
        self.progress = progress
        self.latencies = array("q")
        self.last_sequence: dict[int, int] = {}  # (producer << 32 | key) -> last sequence
        self.owners: dict[int, int] = {}  # key -> the first consumer that received it
        self.other_owners: dict[int, set[int]] = {}  # key -> consumers that got it besides
        self.per_consumer = [0] * count
        self.received = 0
        self.order_violations = 0
        self.last_receive_ns = 0

    def listener(self, number: int) -> Any:
        """The message listener of consumer ``number``."""
        slot = number - self.first
        unpack = _KEYED.unpack_from
        clock = time.monotonic_ns
        record = self.latencies.append
        last_sequence = self.last_sequence
        owners = self.owners
        per_consumer = self.per_consumer

        def on_message(consumer: Any, message: Any) -> None:
            now = clock()
            sent_ns, producer, key, sequence = unpack(message.data())
            record(now - sent_ns)
            stream = (producer << 32) | key
            if sequence <= last_sequence.get(stream, -1):
                self.order_violations += 1
            last_sequence[stream] = sequence
            if owners.setdefault(key, number) != number:
                self.other_owners.setdefault(key, set()).add(number)
            per_consumer[slot] += 1
            consumer.acknowledge(message)
            self.received += 1
            self.last_receive_ns = now
            self.progress.value = self.received

        return on_message

    def report(self, cpu_s: float, error: str | None) -> ConsumerReport:
        key_owners = {
            key: [owner, *sorted(self.other_owners.get(key, ()))]
            for key, owner in self.owners.items()
        }
        return ConsumerReport(
            received=self.received,
            last_receive_ns=self.last_receive_ns,
            latencies_ns=self.latencies.tobytes(),
            cpu_s=cpu_s,
            error=error,
            order_violations=self.order_violations,
            key_owners=key_owners,
            per_consumer=list(self.per_consumer),
        )


def key_space(count: int) -> list[str]:
    """``count`` random keys (16 hex digits each), the same ones in every process."""
    rng = random.Random(_KEY_SEED)
    return [f"{rng.getrandbits(64):016x}" for _ in range(count)]


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
    return _producer_report(sent, first_send_ns, last_completion_ns, cpu_s, results, error)


def _send_keyed_or_timed(producer: Any, job: ProducerJob, choices: list[int]) -> ProducerReport:
    """Like :func:`_send_all`, with random keys and/or timed receipts.

    A keyed send draws its key from ``choices`` and stamps the payload with this producer's
    number, the key's number and that key's sequence, for the consumers' order check. A timed
    send (every ``job.latency_every``-th) gets a Python callback that records the time to its
    receipt; the others keep the C-level callback.
    """
    results: dict[Any, Any] = {}
    on_sent = results.__setitem__
    send_async = producer.send_async
    clock = time.monotonic_ns
    latencies = array("q")
    record = latencies.append
    every = job.latency_every
    timed_sends = -(-job.messages // every) if every else 0
    all_timed = threading.Event()
    keys = key_space(job.keys)
    sequences = [0] * job.keys
    pack_keyed = _KEYED.pack
    keyed_padding = _KEYED_PADDING
    pack = _SEND_TIME.pack
    padding = _PADDING
    index = job.index

    def timed(sent_ns: int) -> Any:
        def on_receipt(result: Any, message_id: Any) -> None:
            results[result] = message_id
            record(clock() - sent_ns)
            if len(latencies) == timed_sends:
                all_timed.set()

        return on_receipt

    cpu_start = _cpu_seconds()
    first_send_ns = clock()
    error = None
    sent = 0
    try:
        for number in range(job.messages):
            now = clock()
            callback = timed(now) if every and number % every == 0 else on_sent
            if keys:
                key = choices[number]
                sequence = sequences[key]
                sequences[key] = sequence + 1
                send_async(
                    pack_keyed(now, index, key, sequence) + keyed_padding,
                    callback,
                    partition_key=keys[key],
                )
            else:
                send_async(pack(now) + padding, callback)
            sent += 1
        producer.flush()
    except Exception as error_raised:  # reported in the run's result
        error = f"send failed after {sent} sends: {error_raised!r}"
    last_completion_ns = clock()
    cpu_s = _cpu_seconds() - cpu_start
    # The flush returns once every send is acknowledged; their callbacks may still be running.
    if error is None and timed_sends and not all_timed.wait(job.timeout):
        error = f"only {len(latencies)} of {timed_sends} timed receipts arrived"
    return _producer_report(
        sent, first_send_ns, last_completion_ns, cpu_s, results, error, latencies.tobytes()
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


def quiet_logger() -> Any:
    """A pulsar-client logger that prints warnings and errors only, not every connection."""
    return pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn)


TLS_TRUST_ENV = "BENCH_TLS_TRUST_CERTS"  # not BROKERLET_*: the broker reads those
"""For ``pulsar+ssl://`` runs, the CA file the client trusts (set by :mod:`bench.tls`; worker
processes inherit the environment)."""


def _client(service_url: str) -> Any:
    options: dict[str, Any] = {}
    if service_url.startswith("pulsar+ssl://"):
        options = {
            "tls_trust_certs_file_path": os.environ[TLS_TRUST_ENV],
            "tls_validate_hostname": False,
        }
    return pulsar.Client(service_url, logger=quiet_logger(), **options)


def _producer_report(
    sent: int,
    first_send_ns: int,
    last_completion_ns: int,
    cpu_s: float,
    results: Any,
    error: str | None,
    latencies_ns: bytes = b"",
) -> ProducerReport:
    """The report of a send loop: a failed send result fails the run."""
    failed = sorted(str(result) for result in results if result != pulsar.Result.Ok)
    if error is None and failed:
        error = f"sends failed with {', '.join(failed)}"
    return ProducerReport(
        sent=sent,
        first_send_ns=first_send_ns if sent else 0,
        last_completion_ns=last_completion_ns if error is None else 0,
        cpu_s=cpu_s,
        error=error,
        latencies_ns=latencies_ns,
    )
