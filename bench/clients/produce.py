"""Produce-only runs: how fast a broker takes messages, and how long each waits for its receipt.

Producer processes of the official client (see :mod:`bench.clients.jobs`) send unbatched
128-byte messages to a fresh topic with no subscription, so the broker's work per message is
the receive, the append to its storage and the receipt. Every few sends is timed from
``send_async`` to its receipt's callback (a Python callback on every send would cost the
producers more than the broker under test).
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from bench.clients.jobs import ProducerJob, run_producer
from bench.clients.workers import (
    SETUP_TIMEOUT,
    SendWindow,
    Worker,
    close_all,
    drive,
    latency_ms,
    shares,
)

__all__ = ["LATENCY_EVERY", "MAX_PENDING", "ProduceResult", "run_produce_once"]

MAX_PENDING = 1_000  # sends in flight per producer, as in the unbatched throughput runs
LATENCY_EVERY = 4  # one send in this many is timed to its receipt


@dataclass(frozen=True)
class ProduceResult:
    """Figures of one produce-only run.

    Attributes:
        producers: Producer processes.
        messages: Messages sent, over all producers.
        sent: Sends issued.
        produce_rate: Sends per second, first send to the last producer's flush.
        latency_p50_ms: Median send-to-receipt latency of the timed sends, milliseconds.
        latency_p99_ms: 99th percentile of the same, milliseconds.
        timed: How many sends were timed.
        broker_cpu: CPU the broker used over the run, in cores.
        machine_cpu: CPU busy on the whole machine over the run, in cores.
        error: Why the run did not complete, or None.
    """

    producers: int
    messages: int
    sent: int = 0
    produce_rate: float = math.nan
    latency_p50_ms: float = math.nan
    latency_p99_ms: float = math.nan
    timed: int = 0
    broker_cpu: float = math.nan
    machine_cpu: float = math.nan
    error: str | None = None


def run_produce_once(
    service_url: str,
    messages: int,
    timeout: float,
    broker: psutil.Process | None,
    producers: int,
    on_start: Callable[[], object] | None = None,
    nice: int = 0,
) -> ProduceResult:
    """Send ``messages`` unbatched from ``producers`` processes to a fresh topic; time them.

    Args:
        service_url: The broker's ``pulsar://`` URL.
        messages: How many messages to send, split evenly over the producers.
        timeout: Seconds from the start for every send to be acknowledged.
        broker: The broker's process, to report the CPU it used; None to skip that.
        producers: Producer processes.
        on_start: Called right after the producers are released.
        nice: Niceness added to each producer process (see `ProducerJob.nice`).
    """
    topic = f"persistent://public/default/bench-produce-{uuid.uuid4().hex[:12]}"
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    stop = context.Event()
    workers: list[Worker] = []
    blank = ProduceResult(producers, messages)
    try:
        for index, share in enumerate(shares(messages, producers)):
            job = ProducerJob(
                service_url,
                topic,
                share,
                False,
                MAX_PENDING,
                SETUP_TIMEOUT,
                index=index,
                latency_every=LATENCY_EVERY,
                nice=nice,
            )
            workers.append(Worker(context, f"producer {index + 1}", run_producer, (job, start)))
        collected = drive(workers, [], start, stop, timeout, broker, on_start=on_start)
    finally:
        stop.set()
        close_all(workers)
    if collected.setup_error is not None:
        return dataclasses.replace(blank, error=collected.setup_error)
    window = SendWindow.of(collected.producers, expected=producers)
    p50, p99, timed = latency_ms(collected.producers)
    return dataclasses.replace(
        blank,
        sent=window.sent,
        produce_rate=window.produce_rate,
        latency_p50_ms=p50,
        latency_p99_ms=p99,
        timed=timed,
        broker_cpu=collected.broker_cpu_s / collected.elapsed_s,
        machine_cpu=collected.machine_cpu_s / collected.elapsed_s,
        error="; ".join(collected.errors) or None,
    )
