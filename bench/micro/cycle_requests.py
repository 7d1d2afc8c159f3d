"""What each request of a test-suite cycle costs the broker, request by request.

``python -m bench.micro.cycle_requests [--cycles N] [--storage memory|disk] [--source DIR]
[--no-pulsar-lite] [--pause-ms MS] [--callgrind | --wall]``

The cycle is the ``latency`` section's (a client, a producer and a consumer on a fresh topic,
10 synchronous sends, 10 receives and acks, close), played on raw sockets so that every
request can be charged on its own: CONNECT, PARTITIONED_METADATA and LOOKUP, PRODUCER (a
new topic), SUBSCRIBE, FLOW, the 10 SENDs (each waits for its receipt and its delivery), the
10 ACKs, CLOSE_PRODUCER, CLOSE_CONSUMER and the socket's close.

By default the figure is the broker's CPU per request (user + system of all its threads, from
``/proc/<pid>/task/*/schedstat``, Linux), with ``--pause-ms`` (0.5) between requests, so that
each finds the broker idle as a test suite's do; pulsar-lite plays the same cycle, the two
taking turns cycle by cycle. On this kind of VM a request that comes after an idle moment costs
several times what the same request costs back to back (docs/performance.md, thirtieth pass):
these are the figures the test-suite cycle's ratio follows, more than the saturated ones.

``--wall`` times instead how long the client waits for each request (the median; the sends'
round trips and the ACKs' writes summed without the pauses between them): what the
latency section's cycle is made of, request by request.

``--callgrind`` counts instead the instructions brokerlet runs per request: the cycle's
requests are played in blocks (N connections, then N lookups, N producers, ...), each block
dumped with ``callgrind_control`` (needs Debian's valgrind), divided by N. Instruction counts
repeat to about a per cent: the figure to compare two trees by (``--source``). Prints
figures, never asserts them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from tempfile import TemporaryDirectory

from bench.callgrind import total_instructions, under_callgrind
from bench.rawsocket import RawConnection
from brokerlet.testing.process import BrokerletProcess, ChildBroker
from brokerlet.transport.protocol import build_entry, encode_ack, encode_flow, encode_send, pb
from loadtests.brokers import PulsarLiteProcess

__all__ = [
    "REQUESTS",
    "RawCycle",
    "broker_cpu_ns",
    "cpu_per_request",
    "instructions_per_request",
    "main",
    "wall_per_request",
]

T = pb.BaseCommand
SENDS = 10
REQUESTS = (
    "connect",
    "partitioned metadata + lookup",
    "producer (new topic)",
    "subscribe",
    "flow",
    f"{SENDS} sends, each received",
    f"{SENDS} acks",
    "close producer",
    "close consumer",
    "close connection",
)
_METADATA = pb.MessageMetadata(producer_name="cycle", sequence_id=0, publish_time=1)
_ENTRY = build_entry(_METADATA, b"x" * 128)
_SETTLE = 0.3  # s before a callgrind dump: a block's last replies are still being written


class RawCycle:
    """One cycle's state on one connection; each method is one of :data:`REQUESTS`."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.topic = f"persistent://public/default/cycle-{uuid.uuid4().hex[:10]}"
        self.connection: RawConnection | None = None
        self.delivered: list[tuple[int, int]] = []
        self.waited: float | None = None  # the last sends or acks, less their pauses

    @property
    def raw(self) -> RawConnection:
        assert self.connection is not None
        return self.connection

    def connect(self) -> None:
        self.connection = RawConnection(self.url, "cycle-requests")

    def lookup(self) -> None:
        metadata = pb.CommandPartitionedTopicMetadata(topic=self.topic, request_id=1)
        self.raw.expect(
            T(type=T.PARTITIONED_METADATA, partitioned_metadata=metadata),
            T.PARTITIONED_METADATA_RESPONSE,
        )
        lookup = pb.CommandLookupTopic(topic=self.topic, request_id=2)
        self.raw.expect(T(type=T.LOOKUP, lookup=lookup), T.LOOKUP_RESPONSE)

    def producer(self) -> None:
        producer = pb.CommandProducer(topic=self.topic, producer_id=1, request_id=3)
        self.raw.expect(T(type=T.PRODUCER, producer=producer), T.PRODUCER_SUCCESS)

    def subscribe(self) -> None:
        self.raw.subscribe(self.topic, "cycle")

    def flow(self) -> None:
        self.raw.sock.sendall(encode_flow(1, 1000))

    def sends(self, pause: float) -> None:
        self.waited = 0.0
        for sequence_id in range(SENDS):
            if sequence_id and pause:
                time.sleep(pause)
            start = time.perf_counter()
            self.raw.sock.sendall(b"".join(encode_send(1, sequence_id, 1, _ENTRY)))
            receipt = message = False
            while not (receipt and message):
                for command in self.raw.read(1):
                    if command.type == T.SEND_RECEIPT:
                        receipt = True
                    elif command.type == T.MESSAGE:
                        message = True
                        ids = command.message.message_id
                        self.delivered.append((ids.ledger_id, ids.entry_id))
            self.waited += time.perf_counter() - start

    def acks(self, pause: float) -> None:
        self.waited = 0.0
        for index, message_id in enumerate(self.delivered):
            if index and pause:
                time.sleep(pause)
            start = time.perf_counter()
            self.raw.sock.sendall(encode_ack(1, [message_id]))
            self.waited += time.perf_counter() - start

    def close_producer(self) -> None:
        close = pb.CommandCloseProducer(producer_id=1, request_id=5)
        self.raw.expect(T(type=T.CLOSE_PRODUCER, close_producer=close), T.SUCCESS)

    def close_consumer(self) -> None:
        self.raw.close_consumer(1, 6)

    def close(self) -> None:
        self.raw.close()

    def steps(self, pause: float) -> list[Callable[[], None]]:
        """The requests in :data:`REQUESTS`' order."""
        return [
            self.connect,
            self.lookup,
            self.producer,
            self.subscribe,
            self.flow,
            lambda: self.sends(pause),
            lambda: self.acks(pause),
            self.close_producer,
            self.close_consumer,
            self.close,
        ]


def broker_cpu_ns(pid: int) -> int:
    """CPU time of all ``pid``'s threads so far, from the scheduler's own accounting."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat", encoding="ascii") as stats:
                total += int(stats.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
    return total


Measure = Callable[[ChildBroker, RawCycle, Callable[[], None]], float]
"""One request's figure: ``measure(broker, cycle, step)`` runs ``step`` and says what it cost."""


def _per_request(
    brokers: dict[str, ChildBroker], cycles: int, pause: float, measure: Measure
) -> dict[str, list[list[float]]]:
    """Each broker's figures for each of :data:`REQUESTS` over ``cycles`` cycles (after three
    each to warm up), the brokers taking turns cycle by cycle."""
    figures: dict[str, list[list[float]]] = {name: [[] for _ in REQUESTS] for name in brokers}
    for round_ in range(cycles + 3):
        for name, broker in brokers.items():
            cycle = RawCycle(broker.service_url)
            for index, step in enumerate(cycle.steps(pause)):
                time.sleep(pause)
                figure = measure(broker, cycle, step)
                if round_ >= 3:
                    figures[name][index].append(figure)
    return figures


def cpu_per_request(
    brokers: dict[str, ChildBroker], cycles: int, pause: float
) -> dict[str, list[float]]:
    """Mean broker CPU µs of each of :data:`REQUESTS`, per broker; the brokers take turns."""

    def charged(broker: ChildBroker, _cycle: RawCycle, step: Callable[[], None]) -> float:
        before = broker_cpu_ns(broker.pid)
        step()
        time.sleep(pause)  # what the request set off finishes (deliveries, closes)
        return broker_cpu_ns(broker.pid) - before

    spent = _per_request(brokers, cycles, pause, charged)
    return {
        name: [statistics.mean(values) / 1e3 for values in per_request]
        for name, per_request in spent.items()
    }


def wall_per_request(
    brokers: dict[str, ChildBroker], cycles: int, pause: float
) -> dict[str, list[float]]:
    """Median µs the client waits for each of :data:`REQUESTS`, per broker; the brokers take
    turns."""

    def waited(_broker: ChildBroker, cycle: RawCycle, step: Callable[[], None]) -> float:
        cycle.waited = None
        start = time.perf_counter()
        step()
        return time.perf_counter() - start if cycle.waited is None else cycle.waited

    waits = _per_request(brokers, cycles, pause, waited)
    return {
        name: [statistics.median(values) * 1e6 for values in per_request]
        for name, per_request in waits.items()
    }


def _dump(broker: BrokerletProcess) -> None:
    """Have callgrind write what it counted since the last dump (and start again from 0)."""
    time.sleep(_SETTLE)
    subprocess.run(["callgrind_control", "-d", str(broker.pid)], check=True, capture_output=True)


def instructions_per_request(
    flags: list[str], source: Path | None, cycles: int, pause: float
) -> list[float]:
    """Instructions brokerlet runs per each of :data:`REQUESTS`: blocks of ``cycles``."""
    with TemporaryDirectory(prefix="cycle-requests-") as directory:
        out = Path(directory) / "callgrind.out"
        broker = BrokerletProcess(flags, source=source)
        under_callgrind(broker, out)
        with broker:
            broker.start(timeout=300)
            for measured in (False, True):  # a block of warm-up cycles first
                group = [RawCycle(broker.service_url) for _ in range(cycles)]
                _dump(broker)  # the block starts here
                for index in range(len(REQUESTS)):
                    for cycle in group:
                        cycle.steps(pause)[index]()
                    if measured:
                        _dump(broker)
            broker.stop(timeout=300)
        dumps = sorted(out.parent.glob("callgrind.out.*"), key=lambda p: int(p.suffix[1:]))
        counted = [total_instructions(path) for path in dumps[-len(REQUESTS) :]]
    return [count / cycles for count in counted]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.micro.cycle_requests")
    parser.add_argument("--cycles", type=int, default=60, help="(under --callgrind, 20)")
    parser.add_argument("--storage", choices=("memory", "disk"), default="memory")
    parser.add_argument("--source", type=Path, metavar="DIR")
    parser.add_argument("--no-pulsar-lite", action="store_true")
    parser.add_argument("--pause-ms", type=float, default=0.5)
    measure = parser.add_mutually_exclusive_group()
    measure.add_argument("--callgrind", action="store_true")
    measure.add_argument("--wall", action="store_true")
    args = parser.parse_args()
    pause = args.pause_ms / 1000
    flags = ["--storage", args.storage]
    if args.callgrind:
        cycles = 20 if args.cycles == parser.get_default("cycles") else args.cycles
        counts = instructions_per_request(flags, args.source, cycles, pause)
        print(
            f"brokerlet {args.storage}: instructions per request of a raw test-suite cycle "
            f"(callgrind; blocks of {cycles}, {time.strftime('%H:%M')})"
        )
        for name, count in zip(REQUESTS, counts, strict=True):
            print(f"  {name:32} {count:12,.0f}")
        print(f"  {'the cycle':32} {sum(counts):12,.0f}")
        return
    brokers: dict[str, ChildBroker] = {
        f"brokerlet {args.storage}": BrokerletProcess(flags, source=args.source)
    }
    if not args.no_pulsar_lite:
        brokers["pulsar-lite"] = PulsarLiteProcess()
    try:
        for broker in brokers.values():
            broker.start()
        measured = wall_per_request if args.wall else cpu_per_request
        figures = measured(brokers, args.cycles, pause)
    finally:
        for broker in brokers.values():
            broker.close()
    load = " / ".join(f"{value:.2f}" for value in os.getloadavg())
    what = "client's wait" if args.wall else "broker CPU"
    average = "median" if args.wall else "mean"
    print(
        f"{what} µs per request of a raw test-suite cycle, {args.pause_ms:g} ms before and "
        f"after each, {average} of {args.cycles} cycles (load {load}, {time.strftime('%H:%M')})"
    )
    print(f"  {'request':32}" + "".join(f"{name:>18}" for name in figures))
    for index, name in enumerate(REQUESTS):
        print(f"  {name:32}" + "".join(f"{values[index]:18,.0f}" for values in figures.values()))
    totals = {name: sum(values) for name, values in figures.items()}
    print(f"  {'the cycle':32}" + "".join(f"{total:18,.0f}" for total in totals.values()))


if __name__ == "__main__":
    main()
