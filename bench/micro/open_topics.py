"""What a connection and a test-suite cycle cost the broker as open topics pile up.

``python -m bench.micro.open_topics [--counts 0,2000,8000] [--cycles N] [--storage
memory|disk] [--source DIR]``

A test suite that makes a fresh topic per test leaves each one open with its durable
subscription: after a few thousand tests the broker runs thousands of topic and dispatcher
actors. A broker per count in ``--counts`` is brought to that many open topics (a
subscription each, its consumer closed) and left until idle; then the brokers take turns:
each round, each broker's CPU (all threads, ``schedstat``) is measured for a bare connection
(connect, then close) and for a raw test-suite cycle (`bench.micro.cycle_requests.RawCycle`,
a fresh topic), 2 ms apart; ``--cycles`` rounds, medians. The figures to read are each
count's against the first: a cost that grows with the open topics is work that scans them.
Then a second broker per count answers PINGs 1 ms apart for a few seconds while its periodic
checks (backlog quotas, compaction thresholds, retention, expiry, and on disk the inactive-topic
check; every second here instead of every minute or more) walk its open topics: the slowest
PING says how long a pass held the hub; then it makes a new topic (a PRODUCER) every 10 ms for
a few seconds: the slowest says how long a pass held the broker actor, which makes topics. The
client's own garbage collector is off meanwhile (its pauses would be read as the broker's).
Last, :func:`heap` opens the largest count in an embedded broker in a process of its own and
counts the garbage collector's share: tracked objects per open topic and the time of a full
collection with none and with all of them open (every full collection walks them all).
Prints figures, never asserts them.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from functools import partial
from pathlib import Path

from bench.micro.cycle_requests import RawCycle, broker_cpu_ns
from bench.rawsocket import RawConnection
from brokerlet.testing.process import BrokerletProcess
from brokerlet.transport.protocol import pb

__all__ = ["heap", "main", "measure", "open_topics"]

T = pb.BaseCommand

_GAP = 0.002  # s after each measured unit: what it set off (closes) finishes
# Every periodic pass over the open topics once a second, so a few seconds of PINGs meet them.
_CHECKS_EVERY_SECOND = [
    "--backlog-quota-check-interval-in-seconds=1",
    "--broker-service-compaction-monitor-interval-in-seconds=1",
    "--retention-check-interval-in-seconds=1",
    "--message-expiry-check-interval-in-minutes=0.0167",
    "--inactive-topic-close-interval-seconds=1",  # disk only: memory topics never close
]
_PING_SECONDS = 5.0
_CREATION_SECONDS = 5.0


def open_topics(url: str, count: int) -> None:
    """``count`` more topics, each with a durable subscription; left open. Each consumer is
    closed and its close answered, so none of this work spills into what is measured next."""
    connection = RawConnection(url, "open-topics")
    try:
        for request_id in range(1, count + 1):
            topic = f"persistent://public/default/open-{uuid.uuid4().hex[:12]}"
            connection.subscribe(topic, "suite")
            connection.close_consumer(1, request_id)
    finally:
        connection.close()


def _wait_until_idle(pid: int, timeout: float = 300.0) -> None:
    """Until the broker spends under 2% of a core over half a second: on disk, what opening
    the topics left to the storage threads (their files, fsyncs) runs for seconds after."""
    ticks = os.sysconf("SC_CLK_TCK")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = _process_ticks(pid)
        time.sleep(0.5)
        if (_process_ticks(pid) - before) / ticks < 0.01:
            return
    raise RuntimeError(f"the broker stayed busy for {timeout:.0f} s after opening its topics")


def _process_ticks(pid: int) -> int:
    """User + system clock ticks of the process, its ended threads included."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _cpu_us(broker: BrokerletProcess, unit: Callable[[], None]) -> float:
    before = broker_cpu_ns(broker.pid)
    unit()
    time.sleep(_GAP)
    return (broker_cpu_ns(broker.pid) - before) / 1e3


def _round_trips(
    url: str,
    seconds: float,
    gap: float,
    command: Callable[[int], pb.BaseCommand],
    answer: pb.BaseCommand.Type.ValueType,
) -> list[float]:
    """Sorted round trips, s, of ``command(n)`` (n = 1, 2, ...; answered with ``answer``),
    one every ``gap`` s for ``seconds``. The client's collector is off meanwhile."""
    times: list[float] = []
    connection = RawConnection(url, "open-topics")
    gc.disable()
    try:
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            request = command(len(times) + 1)
            sent = time.perf_counter()
            connection.expect(request, answer)
            times.append(time.perf_counter() - sent)
            time.sleep(gap)
    finally:
        gc.enable()
        connection.close()
    return sorted(times)


def _slowest_pings(url: str, seconds: float) -> tuple[float, float]:
    """The slowest PING round trip and the p99.9, ms, of PINGs 1 ms apart for ``seconds``."""
    ping = T(type=T.PING, ping=pb.CommandPing())
    times = _round_trips(url, seconds, 0.001, lambda _n: ping, T.PONG)
    return times[-1] * 1e3, times[int(len(times) * 0.999)] * 1e3


def _creations(url: str, seconds: float) -> tuple[float, float]:
    """The slowest PRODUCER on a new topic and the p99, ms, one every 10 ms for ``seconds``:
    topic creation is the broker actor's, so a pass that holds that actor shows here."""
    times = _round_trips(url, seconds, 0.01, _new_topic_producer, T.PRODUCER_SUCCESS)
    return times[-1] * 1e3, times[int(len(times) * 0.99)] * 1e3


def _new_topic_producer(producer_id: int) -> pb.BaseCommand:
    topic = f"persistent://public/default/created-{uuid.uuid4().hex[:12]}"
    producer = pb.CommandProducer(topic=topic, producer_id=producer_id, request_id=producer_id)
    return T(type=T.PRODUCER, producer=producer)


def _connect_and_close(url: str) -> None:
    RawConnection(url, "open-topics").close()


def _cycle(url: str) -> None:
    for step in RawCycle(url).steps(0.0):
        step()


def _loaded_brokers(
    stack: ExitStack, counts: list[int], flags: list[str], source: Path | None
) -> list[BrokerletProcess]:
    """A broker per count, warmed, with that many open topics, idle."""
    brokers = []
    for count in counts:
        broker = stack.enter_context(BrokerletProcess(flags, source=source))
        broker.start()
        for _ in range(20):  # warm
            _cycle(broker.service_url)
        open_topics(broker.service_url, count)
        brokers.append(broker)
    for broker in brokers:
        _wait_until_idle(broker.pid)
    return brokers


def measure(
    counts: list[int], cycles: int, storage: str = "memory", source: Path | None = None
) -> list[dict[str, float]]:
    """Median broker CPU µs of a bare connection (``connection_us``) and of a raw cycle
    (``cycle_us``) with each count of open topics: a broker per count, each brought to its
    count first, then measured in turns (a connection and a cycle each per round). Then the
    slowest PING and the p99.9 (``slowest_ping_ms``, ``ping_p999_ms``), and the slowest new
    topic's PRODUCER and the p99 (``slowest_creation_ms``, ``creation_p99_ms``), on fresh
    brokers with the same counts whose periodic checks run every second (on the first brokers
    they would have run into the CPU measured)."""
    spent: list[tuple[list[float], list[float]]] = [([], []) for _ in counts]
    with ExitStack() as stack:
        brokers = _loaded_brokers(stack, counts, ["--storage", storage], source)
        for _ in range(cycles):
            for broker, (connections, cycle_costs) in zip(brokers, spent, strict=True):
                connections.append(_cpu_us(broker, partial(_connect_and_close, broker.service_url)))
                cycle_costs.append(_cpu_us(broker, partial(_cycle, broker.service_url)))
    with ExitStack() as stack:
        flags = ["--storage", storage, *_CHECKS_EVERY_SECOND]
        brokers = _loaded_brokers(stack, counts, flags, source)
        pings = [_slowest_pings(broker.service_url, _PING_SECONDS) for broker in brokers]
        creations = [_creations(broker.service_url, _CREATION_SECONDS) for broker in brokers]
    return [
        {
            "open_topics": count,
            "connection_us": statistics.median(connections),
            "cycle_us": statistics.median(cycle_costs),
            "slowest_ping_ms": slowest,
            "ping_p999_ms": p999,
            "slowest_creation_ms": slowest_creation,
            "creation_p99_ms": creation_p99,
        }
        for count, (connections, cycle_costs), (slowest, p999), (
            slowest_creation,
            creation_p99,
        ) in zip(counts, spent, pings, creations, strict=True)
    ]


def heap(count: int, source: Path | None = None) -> dict[str, float]:
    """GC-tracked objects per open topic (``tracked_per_topic``) and the median full
    collection, ms, with none (``full_collection_ms_none``) and ``count`` open
    (``full_collection_ms``): an embedded in-memory broker in a fresh interpreter, brokerlet
    from ``source`` if given."""
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(source.resolve()), env.get("PYTHONPATH", "")]
        ).rstrip(os.pathsep)
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("_topic_heap.py")), str(count)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    )
    result: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.micro.open_topics")
    parser.add_argument("--counts", default="0,2000,8000", help="open topics per broker")
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--storage", choices=("memory", "disk"), default="memory")
    parser.add_argument("--source", type=Path, metavar="DIR")
    args = parser.parse_args()
    counts = [int(value) for value in args.counts.split(",")]
    if min(counts) < 0:
        parser.error(f"--counts must be 0 or more: {args.counts}")
    print(
        f"broker CPU µs (median of {args.cycles}), brokerlet {args.storage}, as open topics "
        f"pile up ({time.strftime('%H:%M')})"
    )
    print(
        f"  {'open topics':>12}{'connect + close':>18}{'raw cycle':>15}"
        f"{'checks running: PING slowest / p99.9, new topic slowest / p99':>64}"
    )
    results = measure(counts, args.cycles, args.storage, args.source)
    first = results[0]
    for row in results:
        connection, cycle = row["connection_us"], row["cycle_us"]
        print(
            f"  {row['open_topics']:>12,.0f}{connection:>10,.0f} "
            f"({connection / first['connection_us']:.2f}x){cycle:>8,.0f} "
            f"({cycle / first['cycle_us']:.2f}x)"
            f"{row['slowest_ping_ms']:>24.1f} / {row['ping_p999_ms']:.1f} ms, "
            f"{row['slowest_creation_ms']:.1f} / {row['creation_p99_ms']:.1f} ms"
        )
    most = max(counts)
    found = heap(most, args.source)
    print(
        f"  garbage collector, embedded broker in memory: {found['tracked_per_topic']:.0f} "
        f"tracked objects per open topic; a full collection "
        f"{found['full_collection_ms_none']:.1f} ms with none open, "
        f"{found['full_collection_ms']:.1f} ms with {most:,}"
    )


if __name__ == "__main__":
    main()
