"""The broker's CPU per message on the consume path alone, driven by a raw-socket consumer.

``python -m bench.micro.consume_cpu [--messages N] [--storage memory|disk] [--rounds R]``

Each round stores N unbatched 128 B messages in a new topic (bench.micro.produce_cpu's
raw-socket producer, not counted), then one Shared consumer on a plain blocking socket reads
them all back: a receiver queue of 1,000 permits refilled by half as the client does, and
individual acks grouped 1,000 to an ACK frame as the client's ack grouping sends them. The
figure is the broker's CPU (user + system) over the consume phase divided by the messages:
dispatch, reading, MESSAGE encoding, socket writes, FLOW and ACK handling. Prints figures,
never asserts them. ``--source DIR`` runs the broker from another tree.
"""

from __future__ import annotations

import argparse
import os
import socket
import time
import uuid
from pathlib import Path

from bench.micro.produce_cpu import measure as produce
from bench.profiling import print_top, top_entries
from brokerlet.testing.process import BrokerletProcess, ChildBroker
from brokerlet.transport.protocol import FrameDecoder, encode_ack, encode_command, encode_flow, pb

__all__ = ["main", "measure"]

T = pb.BaseCommand
_QUEUE = 1000
_ACK_GROUP = 1000


def _request(sock: socket.socket, decoder: FrameDecoder, command: pb.BaseCommand) -> pb.BaseCommand:
    sock.sendall(encode_command(command))
    while True:
        data = sock.recv(1 << 16)
        if not data:
            raise RuntimeError("broker closed the connection")
        frames = decoder.feed(data)
        if frames:
            return frames[0].command


def measure(broker: ChildBroker, messages: int) -> float:
    """Store ``messages`` in a new topic, then consume them; the consume phase's CPU µs each."""
    topic = f"persistent://public/default/consume-{uuid.uuid4().hex[:8]}"
    host, port = broker.service_url.removeprefix("pulsar://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    decoder = FrameDecoder(8 << 20)
    connect = pb.CommandConnect(client_version="cpu-bench", protocol_version=20)
    _request(sock, decoder, T(type=T.CONNECT, connect=connect))
    subscribe = pb.CommandSubscribe(
        topic=topic,
        subscription="bench",
        sub_type=pb.CommandSubscribe.Shared,
        consumer_id=1,
        request_id=1,
        initial_position=pb.CommandSubscribe.Earliest,
    )
    reply = _request(sock, decoder, T(type=T.SUBSCRIBE, subscribe=subscribe))
    if reply.type != T.SUCCESS:
        raise RuntimeError(f"SUBSCRIBE failed: {reply}")
    produce(broker, messages, topic)
    before = broker.cpu_seconds()
    sock.sendall(encode_flow(1, _QUEUE))
    received = since_flow = 0
    acks: list[tuple[int, int]] = []
    while received < messages:
        data = sock.recv(1 << 16)
        if not data:
            raise RuntimeError("broker closed the connection")
        out = []
        for frame in decoder.feed(data):
            if frame.type != T.MESSAGE:
                raise RuntimeError(f"unexpected frame: {frame.command}")
            message_id = frame.command.message.message_id
            acks.append((message_id.ledger_id, message_id.entry_id))
            received += 1
            since_flow += 1
        if since_flow >= _QUEUE // 2:
            out.append(encode_flow(1, since_flow))
            since_flow = 0
        if len(acks) >= _ACK_GROUP or received == messages:
            out.append(encode_ack(1, acks))
            acks = []
        if out:
            sock.sendall(b"".join(out))
    cpu = broker.cpu_seconds() - before
    sock.close()
    return cpu / messages * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.micro.consume_cpu")
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
            f"consume path, {storage:6}: broker CPU µs per message {min(figures):.2f} "
            f"(rounds {text}; {args.messages} unbatched 128 B messages, Shared, queue {_QUEUE}, "
            f"acks grouped by {_ACK_GROUP}; load {load}; {time.strftime('%H:%M:%S')})"
        )
        if profile is not None:
            print_top(top_entries(profile, "tottime"), f"broker own time, {storage} ({profile})")


if __name__ == "__main__":
    main()
