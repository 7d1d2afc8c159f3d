"""The broker's CPU per message on the produce path alone, driven by a raw-socket producer.

``python -m bench.micro.produce_cpu [--messages N] [--storage memory|disk] [--rounds R]``

A plain blocking socket in this process sends pre-encoded unbatched SENDs of 128 bytes with a
window of receipts in flight; the broker runs in a subprocess (brokerlet.testing's
BrokerletProcess) and its CPU time (user + system) is divided by the messages. No
pulsar-client and no consumer: the figure is decode, append, storage and receipt, and it
stays meaningful on a loaded machine because it counts the broker's CPU, not wall clock.
Prints figures, never asserts them. ``--source DIR`` runs the broker from another tree.
"""

from __future__ import annotations

import argparse
import os
import socket
import time
import uuid
from pathlib import Path

from bench.profiling import print_top, top_entries
from brokerlet.testing.process import BrokerletProcess, ChildBroker
from brokerlet.transport.protocol import (
    FrameDecoder,
    build_entry,
    encode_command,
    encode_send,
    pb,
)

__all__ = ["main", "measure"]

T = pb.BaseCommand
_WINDOW = 1000


def _entry() -> bytes:
    metadata = pb.MessageMetadata(producer_name="cpu-bench", sequence_id=0, publish_time=1)
    return build_entry(metadata, b"x" * 128)


def _read_until(sock: socket.socket, decoder: FrameDecoder, wanted: int) -> list[pb.BaseCommand]:
    commands: list[pb.BaseCommand] = []
    while len(commands) < wanted:
        data = sock.recv(1 << 16)
        if not data:
            raise RuntimeError("broker closed the connection")
        commands += [frame.command for frame in decoder.feed(data)]
    return commands


def measure(broker: ChildBroker, messages: int, topic: str | None = None) -> float:
    """Send ``messages`` SENDs to ``topic`` (None: a new one); the broker's CPU µs per message."""
    host, port = broker.service_url.removeprefix("pulsar://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    decoder = FrameDecoder(8 << 20)
    sock.sendall(
        encode_command(
            T(
                type=T.CONNECT,
                connect=pb.CommandConnect(client_version="cpu-bench", protocol_version=20),
            )
        )
    )
    _read_until(sock, decoder, 1)
    if topic is None:
        topic = f"persistent://public/default/cpu-{uuid.uuid4().hex[:8]}"
    sock.sendall(
        encode_command(
            T(
                type=T.PRODUCER,
                producer=pb.CommandProducer(topic=topic, producer_id=1, request_id=1),
            )
        )
    )
    [reply] = _read_until(sock, decoder, 1)
    if reply.type != T.PRODUCER_SUCCESS:
        raise RuntimeError(f"PRODUCER failed: {reply}")
    entry = _entry()
    frames = [b"".join(encode_send(1, i, 1, entry)) for i in range(messages)]
    before = broker.cpu_seconds()
    sent = received = 0
    while received < messages:
        if sent < messages and sent - received < _WINDOW:
            batch = frames[sent : min(messages, received + _WINDOW)]
            sock.sendall(b"".join(batch))
            sent += len(batch)
        got = _read_until(sock, decoder, 1)
        received += sum(1 for command in got if command.type == T.SEND_RECEIPT)
        if any(command.type != T.SEND_RECEIPT for command in got):
            raise RuntimeError(f"unexpected reply: {got[0]}")
    cpu = broker.cpu_seconds() - before
    sock.close()
    return cpu / messages * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.micro.produce_cpu")
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--storage", choices=("memory", "disk"), action="append")
    parser.add_argument(
        "--source",
        type=Path,
        metavar="DIR",
        help="run the broker from this source tree (to compare two versions)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="PATH",
        help="run the broker under cProfile (one file per storage, named after "
        "PATH) and print its top own-time lines",
    )
    args = parser.parse_args()
    for storage in args.storage or ["memory", "disk"]:
        profile = None
        if args.profile is not None:
            profile = args.profile.with_name(f"{args.profile.stem}-{storage}{args.profile.suffix}")
        with BrokerletProcess(
            ["--storage", storage], profile_path=profile, source=args.source
        ) as broker:
            broker.start()
            measure(broker, 2000)  # warm-up: imports, first topic
            figures = [measure(broker, args.messages) for _ in range(args.rounds)]
        load = " / ".join(f"{value:.2f}" for value in os.getloadavg())
        text = ", ".join(f"{figure:.2f}" for figure in figures)
        print(
            f"produce path, {storage:6}: broker CPU µs per message {min(figures):.2f} "
            f"(rounds {text}; {args.messages} unbatched 128 B SENDs, window {_WINDOW}; "
            f"load {load}; {time.strftime('%H:%M:%S')})"
        )
        if profile is not None:
            print_top(top_entries(profile, "tottime"), f"broker own time, {storage} ({profile})")


if __name__ == "__main__":
    main()
