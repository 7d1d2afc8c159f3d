"""The broker's CPU per request when requests come one at a time, beside a bare gevent server's.

``python -m bench.micro.request_cpu [--requests N] [--pause-ms MS] [--rounds R]
[--storage memory|disk] [--sync-policy P] [--subscriptions N] [--source DIR]
[--no-pulsar-lite] [--callgrind]``

A blocking raw socket sends one unbatched 128-byte SEND, waits for its receipt, pauses, and
sends the next, so every request finds the broker idle in its event loop. Below saturation
that is what each message costs: the wake-ups, the kernel's loopback delivery and code run
with cold caches, more than the per-message work the saturated figures (``produce_cpu``)
count. The floor line is a gevent ``StreamServer`` in a process of its own that echoes each
request's bytes, driven the same way in the same run: the ratio to it is what a change to the
broker's request path moves. pulsar-lite gets the same SENDs, for the comparison the
low-rate target of issue 19 makes. Prints figures, never asserts them.

``--subscriptions N`` adds N Shared subscriptions, one raw consumer each on a connection of
its own: a request is then a SEND, its receipt and the N deliveries of it, and the consumers
acknowledge in groups of 50 as the official client's ack grouping would at these rates. That
is the shape of ``loadtests``' telemetry-high-rate scenario (800 msg/s to five subscriptions)
without Locust and pulsar-client sharing the two cores; the echo floor stays one request.

``--callgrind`` counts instead the instructions brokerlet runs per request under valgrind's
callgrind (needs Debian's valgrind): the difference between a run of ``--requests`` and one
of a sixth as many, divided by the requests between them. On a shared VM, where CPU time
per request moves by a third from run to run, this is the figure to compare two trees by:
it repeats to a few per cent (the broker's timers still run by the clock; use a pause of
10 ms or so, as a request takes milliseconds under valgrind).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import tempfile
import time
import uuid
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

import psutil

from bench.callgrind import total_instructions, under_callgrind
from bench.linetrace import LineCounts, TracedBroker
from bench.rawsocket import RawConnection
from brokerlet.testing.process import BrokerletProcess, ChildBroker
from brokerlet.transport.protocol import build_entry, encode_ack, encode_flow, encode_send, pb
from loadtests.brokers import PulsarLiteProcess

__all__ = ["instructions_per_request", "main", "measure_broker", "measure_echo"]

T = pb.BaseCommand
_WARM_UP = 200
_ACK_EVERY = 50


def _cpu(process: psutil.Process) -> tuple[float, float]:
    times = process.cpu_times()
    return times.user, times.system


def _per_request(
    process: psutil.Process, requests: int, pause: float, one: Callable[[int], None]
) -> tuple[float, float]:
    """Run ``one(i)`` ``requests`` times with ``pause`` s before each; the process's user and
    system CPU µs per request."""
    for i in range(_WARM_UP):
        one(i)
    user0, system0 = _cpu(process)
    for i in range(_WARM_UP, _WARM_UP + requests):
        if pause:
            time.sleep(pause)
        one(i)
    user1, system1 = _cpu(process)
    return (user1 - user0) / requests * 1e6, (system1 - system0) / requests * 1e6


def measure_broker(
    service_url: str, pid: int, requests: int, pause: float, subscriptions: int = 0
) -> tuple[float, float]:
    """One SEND at a time to a fresh topic, each delivered to ``subscriptions`` consumers
    before the next; the broker's user and system CPU µs per SEND."""
    connection = RawConnection(service_url, "request-cpu")
    topic = f"persistent://public/default/request-cpu-{uuid.uuid4().hex[:8]}"
    consumers = [_consumer(service_url, topic, f"sub-{k}") for k in range(subscriptions)]
    producer = pb.CommandProducer(topic=topic, producer_id=1, request_id=1)
    reply = connection.request(T(type=T.PRODUCER, producer=producer))
    if reply.type != T.PRODUCER_SUCCESS:
        raise RuntimeError(f"PRODUCER failed: {reply}")
    metadata = pb.MessageMetadata(producer_name="request-cpu", sequence_id=0, publish_time=1)
    entry = build_entry(metadata, b"x" * 128)
    unacked: list[list[tuple[int, int]]] = [[] for _ in consumers]

    def one(sequence_id: int) -> None:
        connection.sock.sendall(b"".join(encode_send(1, sequence_id, 1, entry)))
        got = connection.read(1)
        if got[0].type != T.SEND_RECEIPT:
            raise RuntimeError(f"unexpected reply: {got[0]}")
        for consumer, ids in zip(consumers, unacked, strict=True):
            for command in consumer.read(1):
                if command.type != T.MESSAGE:
                    raise RuntimeError(f"unexpected frame to a consumer: {command}")
                message_id = command.message.message_id
                ids.append((message_id.ledger_id, message_id.entry_id))
            if len(ids) >= _ACK_EVERY:
                consumer.sock.sendall(encode_ack(1, ids))
                ids.clear()

    try:
        return _per_request(psutil.Process(pid), requests, pause, one)
    finally:
        connection.close()
        for consumer in consumers:
            consumer.close()


def _consumer(service_url: str, topic: str, subscription: str) -> RawConnection:
    """A connection with one Shared consumer (id 1) on ``subscription``, given all the permits
    it will need."""
    consumer = RawConnection(service_url, "request-cpu")
    consumer.subscribe(topic, subscription)
    consumer.sock.sendall(encode_flow(1, 1 << 30))
    return consumer


def _echo_server(ready: Connection) -> None:
    from gevent.server import StreamServer  # noqa: PLC0415 - in the child process only

    def handle(sock: socket.socket, _address: object) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while data := sock.recv(16384):
            sock.sendall(data)

    server = StreamServer(("127.0.0.1", 0), handle)
    server.start()
    ready.send(server.server_port)
    server.serve_forever()


def measure_echo(requests: int, pause: float, size: int) -> tuple[float, float]:
    """The same loop against a gevent echo server; its user and system CPU µs per request."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    child = context.Process(target=_echo_server, args=(theirs,), daemon=True)
    child.start()
    try:
        if not ours.poll(30):
            raise RuntimeError("the echo server did not start")
        port = ours.recv()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            request = b"x" * size

            def one(_i: int) -> None:
                sock.sendall(request)
                got = 0
                while got < size:
                    got += len(sock.recv(65536))

            return _per_request(psutil.Process(child.pid), requests, pause, one)
    finally:
        child.kill()
        child.join(10)


def instructions_per_request(
    flags: list[str], source: Path | None, requests: int, pause: float, subscriptions: int = 0
) -> float:
    """Instructions per SEND of a broker under callgrind, from two runs' totals."""
    fewer = max(1, requests // 6)
    totals = []
    with tempfile.TemporaryDirectory() as directory:
        for count in (fewer, requests):
            out = Path(directory) / f"callgrind-{count}.out"
            broker = BrokerletProcess(flags, source=source)
            under_callgrind(broker, out)
            with broker:
                broker.start(timeout=300)
                measure_broker(broker.service_url, broker.pid, count, pause, subscriptions)
                broker.stop(timeout=300)
            totals.append(total_instructions(out))
    return (totals[1] - totals[0]) / (requests - fewer)


def lines_per_request(
    flags: list[str], source: Path | None, requests: int, pause: float, subscriptions: int = 0
) -> LineCounts:
    """The lines of Python per function of ``requests`` SENDs (`bench.linetrace`), from two
    runs' totals as `instructions_per_request`."""
    fewer = max(1, requests // 6)
    totals = []
    with tempfile.TemporaryDirectory() as directory:
        for count in (fewer, requests):
            out = Path(directory) / f"lines-{count}.json"
            with TracedBroker(flags, out, source=source) as broker:
                broker.start(timeout=300)
                measure_broker(broker.service_url, broker.pid, count, pause, subscriptions)
                broker.stop(timeout=300)
            totals.append(LineCounts.read(out))
    return totals[1] - totals[0]


def _flags(storage: str, sync_policy: str | None) -> list[str]:
    flags = ["--storage", storage]
    if storage == "disk" and sync_policy:
        flags += ["--sync-policy", sync_policy]
    return flags


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.micro.request_cpu")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--pause-ms", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--storage", choices=("memory", "disk"), action="append")
    parser.add_argument("--sync-policy", help="for the disk broker (its default: every_batch)")
    parser.add_argument("--subscriptions", type=int, default=0, metavar="N")
    parser.add_argument("--source", type=Path, metavar="DIR")
    parser.add_argument("--no-pulsar-lite", action="store_true")
    parser.add_argument("--callgrind", action="store_true")
    parser.add_argument("--lines", action="store_true", help="count lines of Python instead")
    args = parser.parse_args()
    pause = args.pause_ms / 1000
    shape = "one request at a time"
    if args.subscriptions:
        shape = f"one message at a time to {args.subscriptions} subscriptions"
    if args.lines:
        for storage in args.storage or ["memory", "disk"]:
            counts = lines_per_request(
                _flags(storage, args.sync_policy),
                args.source,
                args.requests,
                pause,
                args.subscriptions,
            )
            print(f"{shape}, brokerlet {storage}, per request:")
            print(counts.report(args.requests - max(1, args.requests // 6)))
        return
    if args.callgrind:
        for storage in args.storage or ["memory", "disk"]:
            count = instructions_per_request(
                _flags(storage, args.sync_policy),
                args.source,
                args.requests,
                pause,
                args.subscriptions,
            )
            print(
                f"{shape}, brokerlet {storage}: {count:,.0f} instructions per "
                f"request (callgrind; {args.requests} and {max(1, args.requests // 6)} "
                f"requests, {args.pause_ms:g} ms apart)"
            )
        return
    brokers: dict[str, ChildBroker] = {
        f"brokerlet {storage}": BrokerletProcess(
            _flags(storage, args.sync_policy), source=args.source
        )
        for storage in args.storage or ["memory", "disk"]
    }
    if not args.no_pulsar_lite:
        brokers["pulsar-lite"] = PulsarLiteProcess()
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in [*brokers, "echo"]}
    try:
        for broker in brokers.values():
            broker.start()
        for _ in range(args.rounds):  # the back-ends take turns: one load for all of them
            for name, broker in brokers.items():
                figures[name].append(
                    measure_broker(
                        broker.service_url, broker.pid, args.requests, pause, args.subscriptions
                    )
                )
            figures["echo"].append(measure_echo(args.requests, pause, 165))
    finally:
        for broker in brokers.values():
            broker.close()
    best = {name: min(user + system for user, system in rounds) for name, rounds in figures.items()}
    load = " / ".join(f"{value:.2f}" for value in os.getloadavg())
    for name, rounds in figures.items():
        text = ", ".join(f"{user:.0f}+{system:.0f}" for user, system in rounds)
        label = "gevent echo" if name == "echo" else name
        against = f"{best[name] / best['echo']:.2f}x the echo floor"
        if name.startswith("brokerlet") and "pulsar-lite" in best:
            against += f", {best[name] / best['pulsar-lite']:.2f}x pulsar-lite"
        print(
            f"{shape}, {label:16}: CPU µs per request {best[name]:.0f} "
            f"({against}; rounds user+system {text})"
        )
    print(
        f"  {args.requests} requests per round after {_WARM_UP} to warm up, "
        f"{args.pause_ms:g} ms pause before each; load {load}; {time.strftime('%H:%M:%S')}"
    )


if __name__ == "__main__":
    main()
