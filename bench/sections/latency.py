"""The ``latency`` section: what a test suite and a request/reply user wait for.

Three figures, brokerlet (disk with its default sync policy every_batch, disk with
``--sync-policy never``, the durability pulsar-lite has, and memory) against pulsar-lite,
the brokers started once and the measurements interleaved round by round in one run, so that
other work on the machine falls on all of them alike:

* ping-pong: one message at a time, ``send()`` (synchronous) then ``receive()`` and
  ``acknowledge()``, on one topic; p50 and p99 of the round trip.
* test-suite cycle: a new client, a producer and a consumer on a fresh topic, 10 synchronous
  sends, 10 receive + ack, close; the median cycle, and the median of each phase.
* topic creation: the first PRODUCER on a new name, from a raw socket (CONNECT once, then
  PRODUCER and its answer per name); p50 and p99.

The client is the official ``pulsar-client`` in this process (its calls block in C++ with the
GIL released). Prints figures and judges targets, never asserts them.
"""

from __future__ import annotations

import itertools
import os
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import pulsar

from bench.clients.jobs import quiet_logger
from bench.plan import SectionResult
from bench.rawsocket import RawConnection
from bench.report import Row, judge
from brokerlet.testing import percentile
from brokerlet.testing.process import BrokerletProcess, ChildBroker
from brokerlet.transport.protocol import pb
from loadtests.brokers import PulsarLiteProcess

__all__ = ["CYCLE_PHASES", "measure_topic_creation", "run_latency", "suite_cycle"]

T = pb.BaseCommand
_PAYLOAD = b"x" * 128
PING_PONG_P99_RATIO = 1.0  # brokerlet disk / pulsar-lite
CYCLE_RATIO_DISK = 0.8
CYCLE_RATIO_MEMORY = 0.5
TOPIC_CREATE_MS = 1.0  # disk, every_batch


def _topic(prefix: str) -> str:
    return f"persistent://public/default/{prefix}-{uuid.uuid4().hex[:10]}"


def ping_pong(url: str, count: int) -> list[float]:
    """Seconds per send-then-receive round trip, ``count`` of them after a short warm-up."""
    client = pulsar.Client(url, logger=quiet_logger())
    try:
        topic = _topic("ping")
        consumer = client.subscribe(topic, "ping", consumer_type=pulsar.ConsumerType.Shared)
        producer = client.create_producer(topic, batching_enabled=False)
        times: list[float] = []
        for index in range(count + 20):
            start = time.perf_counter()
            producer.send(_PAYLOAD)
            message = consumer.receive(timeout_millis=10_000)
            consumer.acknowledge(message)
            if index >= 20:
                times.append(time.perf_counter() - start)
        return times
    finally:
        client.close()


CYCLE_PHASES = ("client and producer", "subscribe", "10 sends", "10 receive + ack", "close")


def suite_cycle(url: str) -> list[float]:
    """Seconds each of the :data:`CYCLE_PHASES` of one test-suite cycle took, fresh topic."""
    marks = [time.perf_counter()]
    client = pulsar.Client(url, logger=quiet_logger())
    try:
        topic = _topic("cycle")
        producer = client.create_producer(topic, batching_enabled=False)
        marks.append(time.perf_counter())
        consumer = client.subscribe(topic, "cycle", consumer_type=pulsar.ConsumerType.Shared)
        marks.append(time.perf_counter())
        for _ in range(10):
            producer.send(_PAYLOAD)
        marks.append(time.perf_counter())
        for _ in range(10):
            consumer.acknowledge(consumer.receive(timeout_millis=10_000))
        marks.append(time.perf_counter())
    finally:
        client.close()
    marks.append(time.perf_counter())
    return [end - start for start, end in itertools.pairwise(marks)]


def measure_topic_creation(url: str, count: int) -> list[float]:
    """Seconds from PRODUCER on a new name to PRODUCER_SUCCESS, ``count`` names."""
    connection = RawConnection(url, "latency-bench")
    times: list[float] = []
    try:
        for index in range(count):
            request = pb.CommandProducer(
                topic=_topic("create"), producer_id=index, request_id=index
            )
            start = time.perf_counter()
            reply = connection.request(T(type=T.PRODUCER, producer=request))
            times.append(time.perf_counter() - start)
            if reply.type != T.PRODUCER_SUCCESS:
                raise RuntimeError(f"PRODUCER failed: {reply}")
    finally:
        connection.close()
    return times


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def run_latency(quick: bool) -> SectionResult:
    """Measure the three figures against each broker, interleaved; judge the ratios."""
    rounds, pings, cycles, creates = (2, 100, 5, 20) if quick else (5, 400, 20, 50)
    brokers: dict[str, Callable[[], ChildBroker]] = {
        "brokerlet disk": lambda: BrokerletProcess(["--storage", "disk"]),
        "brokerlet disk never": lambda: BrokerletProcess(
            ["--storage", "disk", "--sync-policy", "never"]
        ),
        "brokerlet memory": lambda: BrokerletProcess(["--storage", "memory"]),
        "pulsar-lite": PulsarLiteProcess,
    }
    print(
        f"latency: {rounds} interleaved rounds of {pings} ping-pongs, {cycles} test-suite "
        f"cycles and {creates} topic creations per broker ({', '.join(brokers)})",
        flush=True,
    )
    running: dict[str, ChildBroker] = {}
    # Per broker, one list per round: ping-pong round trips, cycles (phase seconds each) and
    # topic creations. Totals, phase medians and per-round figures are all derived from these.
    rounds_of: dict[str, dict[str, list[list[Any]]]] = {
        name: {"ping": [], "cycle": [], "create": []} for name in brokers
    }
    try:
        for name, make in brokers.items():
            running[name] = make().start()
        for _ in range(rounds):
            for name, broker in running.items():
                url = broker.service_url
                got = rounds_of[name]
                got["ping"].append(ping_pong(url, pings))
                got["cycle"].append([suite_cycle(url) for _ in range(cycles)])
                got["create"].append(measure_topic_creation(url, creates))
    finally:
        for broker in running.values():
            broker.close()
    summary: dict[str, dict[str, Any]] = {}
    for name, got in rounds_of.items():
        ping, create = list(itertools.chain(*got["ping"])), list(itertools.chain(*got["create"]))
        cycles_run = list(itertools.chain(*got["cycle"]))
        medians = {
            phase: statistics.median(cycle[index] for cycle in cycles_run)
            for index, phase in enumerate(CYCLE_PHASES)
        }
        summary[name] = {
            "ping_p50_s": percentile(ping, 0.5),
            "ping_p99_s": percentile(ping, 0.99),
            "cycle_median_s": statistics.median(sum(cycle) for cycle in cycles_run),
            "create_p50_s": percentile(create, 0.5),
            "create_p99_s": percentile(create, 0.99),
            # Each round's own, to show how far the ratios move between rounds.
            "ping_p99_rounds_s": [percentile(r, 0.99) for r in got["ping"]],
            "cycle_median_rounds_s": [
                statistics.median(sum(cycle) for cycle in r) for r in got["cycle"]
            ],
        }
        summary[name].update({f"cycle {phase} median_s": s for phase, s in medians.items()})
        print(
            f"  test-suite cycle phases, {name}, median ms: "
            + ", ".join(f"{phase} {s * 1000:.2f}" for phase, s in medians.items()),
            flush=True,
        )
    disk, never, memory, lite = (summary[n] for n in brokers)
    ping_ratio = disk["ping_p99_s"] / lite["ping_p99_s"]
    ping_never = never["ping_p99_s"] / lite["ping_p99_s"]
    cycle_disk = disk["cycle_median_s"] / lite["cycle_median_s"]
    cycle_never = never["cycle_median_s"] / lite["cycle_median_s"]
    cycle_memory = memory["cycle_median_s"] / lite["cycle_median_s"]

    def per_round(mine: dict[str, Any], figure: str) -> list[float]:
        return [a / b for a, b in zip(mine[figure], lite[figure], strict=True)]

    ping_rounds = per_round(disk, "ping_p99_rounds_s")
    cycle_disk_rounds = per_round(disk, "cycle_median_rounds_s")
    cycle_memory_rounds = per_round(memory, "cycle_median_rounds_s")

    def span(ratios: list[float]) -> str:
        return f"rounds {min(ratios):.2f}-{max(ratios):.2f}x"

    load = " / ".join(f"{value:.2f}" for value in os.getloadavg())
    rows = [
        Row(
            "latency, ping-pong p99 disk / pulsar-lite",
            f"{ping_ratio:.2f}x",
            f"{_ms(disk['ping_p99_s'])} vs {_ms(lite['ping_p99_s'])} (p50 "
            f"{_ms(disk['ping_p50_s'])} vs {_ms(lite['ping_p50_s'])}; {span(ping_rounds)})",
            f"<= {PING_PONG_P99_RATIO}x",
            judge(ping_ratio, at_most=PING_PONG_P99_RATIO),
        ),
        Row(
            "  ping-pong p99 disk never / pulsar-lite",
            f"{ping_never:.2f}x",
            f"{_ms(never['ping_p99_s'])} (pulsar-lite never fsyncs either)",
        ),
        Row(
            "  ping-pong p99 memory", _ms(memory["ping_p99_s"]), f"p50 {_ms(memory['ping_p50_s'])}"
        ),
        Row(
            "latency, test-suite cycle disk / pulsar-lite",
            f"{cycle_disk:.2f}x",
            f"{_ms(disk['cycle_median_s'])} vs {_ms(lite['cycle_median_s'])}; "
            f"{span(cycle_disk_rounds)}",
            f"<= {CYCLE_RATIO_DISK}x",
            judge(cycle_disk, at_most=CYCLE_RATIO_DISK),
        ),
        Row(
            "  test-suite cycle disk never / pulsar-lite",
            f"{cycle_never:.2f}x",
            f"{_ms(never['cycle_median_s'])}; every_batch pays an fdatasync per sync send",
            f"<= {CYCLE_RATIO_DISK}x",
            judge(cycle_never, at_most=CYCLE_RATIO_DISK),
        ),
        Row(
            "latency, test-suite cycle memory / pulsar-lite",
            f"{cycle_memory:.2f}x",
            f"{_ms(memory['cycle_median_s'])} vs {_ms(lite['cycle_median_s'])}; "
            f"{span(cycle_memory_rounds)}",
            f"<= {CYCLE_RATIO_MEMORY}x",
            judge(cycle_memory, at_most=CYCLE_RATIO_MEMORY),
        ),
        Row(
            "latency, topic creation p50 disk every_batch",
            _ms(disk["create_p50_s"]),
            f"p99 {_ms(disk['create_p99_s'])}; memory {_ms(memory['create_p50_s'])}, "
            f"pulsar-lite {_ms(lite['create_p50_s'])}",
            f"<= {TOPIC_CREATE_MS} ms",
            judge(disk["create_p50_s"] * 1000, at_most=TOPIC_CREATE_MS),
        ),
    ]
    for row in rows:
        print(f"  {row.figure.strip()}: {row.value} ({row.spread})")
    print(f"  load average: {load}")
    data: dict[str, Any] = {
        "summary": summary,
        "rounds": rounds,
        "load_average": load,
        "ratios": {
            "ping_p99_disk": ping_ratio,
            "ping_p99_never": ping_never,
            "cycle_disk": cycle_disk,
            "cycle_never": cycle_never,
            "cycle_memory": cycle_memory,
        },
        "ratios_per_round": {
            "ping_p99_disk": ping_rounds,
            "cycle_disk": cycle_disk_rounds,
            "cycle_memory": cycle_memory_rounds,
        },
    }
    return SectionResult(data=data, rows=rows)


if __name__ == "__main__":
    import sys

    run_latency("--quick" in sys.argv[1:])
