"""A seeded fuzzer for a running broker: bad peers must not break topics (issue 10).

Each input goes out on a short-lived raw connection, mostly after a real handshake and a real
producer and consumer on one of a few fuzz topics, so the bad bytes reach the connection,
topic and dispatcher actors and not only the decoder. Categories:

- ``random_bytes``: random bytes, before or after the handshake;
- ``bad_sizes``: frames whose total and command sizes disagree with what follows;
- ``bit_flips``: real frames (as the official client sends them) with one to three bits flipped;
- ``unknown_ids``: FLOW, ACK, REDELIVER, closes, SEEK and SEND for ids that do not exist;
- ``live_ids``: the same commands, with random positions, for the real producer and consumer;
- ``odd_flow``: FLOW permits of 0, 1, 2^31 and 2^32 - 1 on a real consumer, and early acks;
- ``bad_names``: topic, subscription and producer names that are empty, invalid, not UTF-8;
- ``bad_payloads``: SENDs with garbage metadata, bad checksums, wrong sizes;
- ``unsupported``: known requests brokerlet does not serve (schemas, transactions, stats).

A witness connection on its own topic produces throughout and must receive every message it
stored; afterwards every fuzz topic must take a new producer and a new consumer of every
subscription type, no actor may have failed, and no socket on the broker port may be left open.

Run ``python tests/fuzz.py --duration 60 --seed 1`` (or ``make fuzz``) for a report;
``tests/test_fuzz.py`` runs it briefly in ``make test``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import socket
import struct
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from brokerlet import Broker
from brokerlet.actors.supervision import restarts
from brokerlet.testing.rawclient import RawClient, make_entry
from brokerlet.transport.protocol import (
    PROTOCOL_VERSION,
    build_entry,
    encode_ack,
    encode_command,
    encode_flow,
    encode_send,
    pb,
)

T = pb.BaseCommand
S = pb.CommandSubscribe
FUZZ_TOPICS = [f"persistent://public/default/fuzz-{i}" for i in range(4)]
WITNESS_TOPIC = "persistent://public/default/fuzz-witness"
CATEGORIES = (
    "random_bytes",
    "bad_sizes",
    "bit_flips",
    "unknown_ids",
    "live_ids",
    "odd_flow",
    "bad_names",
    "bad_payloads",
    "unsupported",
)
SUB_TYPES = (S.Exclusive, S.Shared, S.Failover, S.Key_Shared)
_LINGER_RST = struct.pack("ii", 1, 0)


def open_fds(port: int) -> int:
    """This process's open sockets on ``port``, either end (broker side and fuzzer side).

    Counted by socket, not over every descriptor: other tests' clients in the same process,
    and the storage's segment files, open and close descriptors of their own meanwhile.
    """
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local, remote = (int(a.rsplit(":", 1)[1], 16) for a in fields[1:3])
                if port in (local, remote):
                    inodes.add(fields[9])
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/self/fd/{fd}")
            if link.startswith("socket:[") and link[8:-1] in inodes:
                count += 1
    return count


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@dataclass
class Report:
    inputs: Counter[str] = field(default_factory=Counter)
    connections: int = 0
    actor_failures: dict[str, int] = field(default_factory=dict)
    topics_usable: int = 0
    topics_used: int = 0
    witness_sent: int = 0
    witness_lost: int = -1
    fds_before: int = 0
    fds_after: int = 0
    rss_before_kib: int = 0
    rss_after_kib: int = 0
    seconds: float = 0.0

    @property
    def total_inputs(self) -> int:
        return sum(self.inputs.values())

    def problems(self) -> list[str]:
        found = []
        if any(self.actor_failures.values()):
            found.append(f"actors failed: {self.actor_failures}")
        if self.topics_usable != self.topics_used:
            found.append(f"only {self.topics_usable} of {self.topics_used} topics usable")
        if self.witness_lost != 0:
            found.append(f"witness lost {self.witness_lost} of {self.witness_sent} messages")
        if self.fds_after > self.fds_before:
            found.append(
                f"sockets on the broker port: {self.fds_before} before, {self.fds_after} after"
            )
        return found

    def lines(self) -> list[str]:
        per_category = ", ".join(f"{k} {v}" for k, v in sorted(self.inputs.items()))
        return [
            f"inputs tried: {self.total_inputs} over {self.connections} connections "
            f"in {self.seconds:.1f} s ({per_category})",
            f"actor failures: {sum(self.actor_failures.values())} {self.actor_failures}",
            f"topics usable: {self.topics_usable} of {self.topics_used}",
            f"witness: {self.witness_sent} receipted, {self.witness_lost} lost",
            f"sockets on the broker port: {self.fds_before} before, {self.fds_after} after",
            f"RSS: {self.rss_before_kib / 1024:.1f} MiB before, "
            f"{self.rss_after_kib / 1024:.1f} MiB after",
        ]


def _command(command: pb.BaseCommand) -> bytes:
    return encode_command(command)


def _raw_frame(command_bytes: bytes, trailer: bytes = b"") -> bytes:
    return struct.pack(">II", 4 + len(command_bytes) + len(trailer), len(command_bytes)) + (
        command_bytes + trailer
    )


def _send(producer_id: int, sequence_id: int, payload: bytes, key: str | None = None) -> bytes:
    metadata = pb.MessageMetadata(producer_name="fuzz", sequence_id=sequence_id, publish_time=1)
    if key is not None:
        metadata.partition_key = key
    header, body = encode_send(producer_id, sequence_id, 1, build_entry(metadata, payload))
    return header + body


class Fuzzer:
    """Drives one broker with seeded bad input; see the module docstring."""

    def __init__(self, broker: Broker, seed: int) -> None:
        self.broker = broker
        self.rng = random.Random(seed)
        self.report = Report()
        self.templates = self._templates()
        self._generators: dict[str, Callable[[], list[bytes]]] = {
            name: getattr(self, f"_gen_{name}") for name in CATEGORIES
        }

    # Real frames, as the official client sends them, to flip bits in.

    def _templates(self) -> list[bytes]:
        topic = FUZZ_TOPICS[0]
        subscribe = S(
            topic=topic, subscription="flip", sub_type=S.Shared, consumer_id=1, request_id=2
        )
        lookup = pb.CommandLookupTopic(topic=topic, request_id=3)
        seek = pb.CommandSeek(consumer_id=1, request_id=4)
        seek.message_id.ledger_id = 1
        seek.message_id.entry_id = 0
        return [
            _command(T(type=T.PRODUCER, producer=pb.CommandProducer(
                topic=topic, producer_id=1, request_id=1, producer_name="flipper"))),
            _command(T(type=T.SUBSCRIBE, subscribe=subscribe)),
            _command(T(type=T.LOOKUP, lookup=lookup)),
            _command(T(type=T.PARTITIONED_METADATA,
                       partitioned_metadata=pb.CommandPartitionedTopicMetadata(
                           topic=topic, request_id=5))),
            _send(1, 0, b"flipped payload", key="k"),
            encode_flow(1, 1000),
            encode_ack(1, [(1, 0), (1, 1)]),
            _command(T(type=T.SEEK, seek=seek)),
            _command(T(type=T.REDELIVER_UNACKNOWLEDGED_MESSAGES,
                       redeliver_unacknowledged_messages=pb.CommandRedeliverUnacknowledgedMessages(
                           consumer_id=1))),
            _command(T(type=T.CLOSE_CONSUMER, close_consumer=pb.CommandCloseConsumer(
                consumer_id=1, request_id=6))),
            _command(T(type=T.PING, ping=pb.CommandPing())),
        ]  # fmt: skip

    # Generators: each returns the bytes of a few inputs for one connection.

    def _gen_random_bytes(self) -> list[bytes]:
        return [self.rng.randbytes(self.rng.randint(1, 200)) for _ in range(self.rng.randint(1, 3))]

    def _gen_bad_sizes(self) -> list[bytes]:
        rng = self.rng
        ping = T(type=T.PING, ping=pb.CommandPing()).SerializeToString()
        total = rng.choice([0, 1, 3, 4, 5, len(ping) + 3, 2**31, 2**32 - 1, rng.randint(0, 10**7)])
        command_size = rng.choice([0, len(ping), total, total + 1, rng.randint(0, 2**32 - 1)])
        return [struct.pack(">II", total % 2**32, command_size % 2**32) + ping]

    def _gen_bit_flips(self) -> list[bytes]:
        rng = self.rng
        frames = []
        for _ in range(rng.randint(1, 4)):
            data = bytearray(rng.choice(self.templates))
            for _ in range(rng.randint(1, 3)):
                position = rng.randrange(len(data))
                data[position] ^= 1 << rng.randrange(8)
            frames.append(bytes(data))
        return frames

    def _gen_unknown_ids(self) -> list[bytes]:
        return self._id_commands(self.rng.choice([2, 999, 2**63, 2**64 - 1]))

    def _gen_live_ids(self) -> list[bytes]:
        return self._id_commands(1)  # the producer and consumer the setup made

    def _id_commands(self, cid: int) -> list[bytes]:
        rng = self.rng
        seek = pb.CommandSeek(consumer_id=cid, request_id=9)
        seek.message_id.ledger_id = rng.randint(0, 2**64 - 1)
        seek.message_id.entry_id = rng.randint(0, 2**64 - 1)
        options = [
            encode_flow(cid, rng.randint(0, 2**32 - 1)),
            encode_ack(cid, [(rng.randint(0, 5), rng.randint(0, 100))]),
            _command(T(type=T.REDELIVER_UNACKNOWLEDGED_MESSAGES,
                       redeliver_unacknowledged_messages=pb.CommandRedeliverUnacknowledgedMessages(
                           consumer_id=cid))),
            _command(T(type=T.CLOSE_CONSUMER, close_consumer=pb.CommandCloseConsumer(
                consumer_id=cid, request_id=7))),
            _command(T(type=T.CLOSE_PRODUCER, close_producer=pb.CommandCloseProducer(
                producer_id=cid, request_id=8))),
            _command(T(type=T.SEEK, seek=seek)),
            _command(T(type=T.GET_LAST_MESSAGE_ID,
                       get_last_message_id=pb.CommandGetLastMessageId(consumer_id=cid,
                                                                      request_id=10))),
            _command(T(type=T.UNSUBSCRIBE, unsubscribe=pb.CommandUnsubscribe(
                consumer_id=cid, request_id=11))),
            _send(cid, 0, b"to nobody"),
        ]  # fmt: skip
        return [rng.choice(options) for _ in range(rng.randint(1, 5))]

    def _gen_odd_flow(self) -> list[bytes]:
        rng = self.rng
        permits = [0, 1, 2**31, 2**32 - 1, rng.randint(0, 2**32 - 1)]
        ledger = rng.choice([0, 1, 2**64 - 1])
        frames = [encode_flow(1, rng.choice(permits)) for _ in range(rng.randint(1, 4))]
        frames.append(encode_ack(1, [(ledger, rng.randint(0, 10**6)) for _ in range(3)]))
        cumulative = pb.CommandAck(consumer_id=1, ack_type=pb.CommandAck.Cumulative)
        cumulative.message_id.add(ledger_id=ledger, entry_id=rng.randint(0, 2**63))
        frames.append(_command(T(type=T.ACK, ack=cumulative)))
        rng.shuffle(frames)
        return frames

    def _gen_bad_names(self) -> list[bytes]:
        # Answered, not disconnected: several fit in one connection.
        return [self._bad_name() for _ in range(self.rng.randint(1, 4))]

    def _bad_name(self) -> bytes:
        rng = self.rng
        names = [
            "", " ", "persistent://", "persistent://a/b/", "a/b/c", "x" * 5000,
            "persistent://public/default/fuzz-0\xff", "\u2603", "persistent://p/d/t t",
        ]  # fmt: skip
        name = rng.choice(names)
        kind = rng.randrange(4)
        if kind == 0:
            command = T(type=T.PRODUCER, producer=pb.CommandProducer(
                topic=name or "persistent://", producer_id=5, request_id=12))  # fmt: skip
        elif kind == 1:
            command = T(type=T.SUBSCRIBE, subscribe=S(
                topic=rng.choice(FUZZ_TOPICS), subscription=name + "Z", sub_type=S.Shared,
                consumer_id=5, request_id=13))  # fmt: skip
        elif kind == 2:
            command = T(type=T.PRODUCER, producer=pb.CommandProducer(
                topic=rng.choice(FUZZ_TOPICS), producer_id=6, request_id=14,
                producer_name=name + "Z"))  # fmt: skip
        else:
            command = T(
                type=T.LOOKUP, lookup=pb.CommandLookupTopic(topic=name + "Z", request_id=15)
            )
        body = command.SerializeToString()
        if rng.random() < 0.5 and b"Z" in body:  # not UTF-8 where a name ends
            index = body.rindex(b"Z")
            body = body[:index] + bytes([rng.choice([0x80, 0xC0, 0xFF])]) + body[index + 1 :]
        return _raw_frame(body)

    def _gen_bad_payloads(self) -> list[bytes]:
        return [self._bad_payload() for _ in range(self.rng.randint(1, 3))]

    def _bad_payload(self) -> bytes:
        rng = self.rng
        entry = make_entry("fuzz", 0, b"body")
        choice = rng.randrange(4)
        if choice == 0:  # garbage metadata with a valid checksum
            metadata = rng.randbytes(rng.randint(1, 30))
            entry = struct.pack(">I", len(metadata)) + metadata + b"body"
            header, body = encode_send(1, 0, 1, entry)
            return header + body
        header, body = encode_send(1, 0, rng.choice([1, 0, -1, 2**31 - 1]), entry)
        data = bytearray(header + body)
        if choice == 1:  # a wrong checksum
            data[-len(entry) - 1] ^= 0xFF
        elif choice == 2:  # a metadata size past the end
            offset = len(data) - len(entry)
            data[offset : offset + 4] = struct.pack(">I", rng.randint(len(entry), 2**32 - 1))
        return bytes(data)

    def _gen_unsupported(self) -> list[bytes]:
        return [self._unsupported() for _ in range(self.rng.randint(1, 4))]

    def _unsupported(self) -> bytes:
        rng = self.rng
        kind = rng.choice([T.GET_SCHEMA, T.CONSUMER_STATS, T.GET_TOPICS_OF_NAMESPACE,
                           T.GET_OR_CREATE_SCHEMA, T.NEW_TXN, T.END_TXN, T.ADD_PARTITION_TO_TXN,
                           T.TC_CLIENT_CONNECT_REQUEST, T.WATCH_TOPIC_LIST, T.AUTH_RESPONSE,
                           T.ACK_RESPONSE, 99])  # fmt: skip
        body = bytes([0x08, rng.randint(0, 127)]) + rng.randbytes(rng.randint(0, 8))
        key = (kind << 3) | 2
        tag = bytes([(key & 0x7F) | 0x80, key >> 7]) if key >= 0x80 else bytes([key])
        return _raw_frame(bytes([0x08, kind]) + tag + bytes([len(body)]) + body)

    # Driving connections.

    def _setup(self, sock: socket.socket) -> bytes:
        """A handshake plus a real producer and consumer, sent without waiting for answers."""
        rng = self.rng
        topic = rng.choice(FUZZ_TOPICS)
        frames = [
            _command(T(type=T.CONNECT, connect=pb.CommandConnect(
                client_version="fuzz", protocol_version=PROTOCOL_VERSION))),
            _command(T(type=T.PRODUCER, producer=pb.CommandProducer(
                topic=topic, producer_id=1, request_id=100))),
            _command(T(type=T.SUBSCRIBE, subscribe=S(
                topic=topic, subscription=f"fuzz-{rng.randrange(4)}",
                sub_type=rng.choice(SUB_TYPES), consumer_id=1, request_id=101,
                initial_position=S.Earliest))),
            encode_flow(1, rng.randint(0, 100)),
            _send(1, rng.randint(0, 1000), b"fuzz message", key=f"k{rng.randrange(8)}"),
        ]  # fmt: skip
        return b"".join(frames)

    def one_connection(self, category: str) -> None:
        rng = self.rng
        inputs = self._generators[category]()
        handshake = category not in ("random_bytes", "bad_sizes") or rng.random() < 0.5
        sock = socket.create_connection(self.broker.address, timeout=2)
        try:
            data = (self._setup(sock) if handshake else b"") + b"".join(inputs)
            with contextlib.suppress(OSError):
                sock.sendall(data)
                if rng.random() < 0.3:  # sometimes read what came back before leaving
                    sock.settimeout(0.02)
                    with contextlib.suppress(OSError):
                        sock.recv(65536)
            if rng.random() < 0.75:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
        finally:
            sock.close()
        self.report.inputs[category] += len(inputs)
        self.report.connections += 1


class Witness:
    """A good connection on its own topic; it must lose nothing while the fuzzer runs."""

    def __init__(self, broker: Broker) -> None:
        self.client = RawClient(broker.address, timeout=5)
        self.client.handshake()
        self.client.create_producer(WITNESS_TOPIC, 1)
        self.client.subscribe(WITNESS_TOPIC, "witness", 1)
        self.sent: list[bytes] = []

    def produce(self) -> None:
        payload = f"witness {len(self.sent)}".encode()
        self.client.produce(1, len(self.sent), payload)
        self.sent.append(payload)

    def lost(self) -> int:
        self.client.flow(1, len(self.sent))
        got = [m.payload for m in self.client.receive(1, len(self.sent), timeout=10)]
        return sum(1 for payload in self.sent if payload not in got)

    def close(self) -> None:
        self.client.close()


def topic_usable(broker: Broker, topic: str, check: int) -> bool:
    """A new producer and a new consumer of every subscription type work on ``topic``."""
    try:
        with RawClient(broker.address, timeout=5) as client:
            client.handshake()
            client.create_producer(topic, 1)
            for index, sub_type in enumerate(SUB_TYPES):
                client.subscribe(
                    topic,
                    f"check-{check}-{index}",
                    index + 1,
                    initial_position=S.Latest,
                    sub_type=sub_type,
                )
                client.flow(index + 1, 10)
            client.produce(1, 0, b"usable")
            for _ in SUB_TYPES:
                client.expect(T.MESSAGE)
    except (AssertionError, OSError, ConnectionError) as error:
        print(f"topic {topic} unusable: {error!r}", file=sys.stderr)
        return False
    return True


def run(broker: Broker, *, seed: int, inputs_per_category: int = 0, duration: float = 0) -> Report:
    """Fuzz ``broker`` until each category had ``inputs_per_category`` inputs, or ``duration``."""
    fuzzer = Fuzzer(broker, seed)
    report = fuzzer.report
    failures_before = restarts()
    witness = Witness(broker)
    # Open every topic first: a disk topic's files are not a leak.
    for topic in FUZZ_TOPICS:
        topic_usable(broker, topic, -1)
    port = broker.address[1]
    report.fds_before = open_fds(port)
    report.rss_before_kib = rss_kib()
    began = time.monotonic()
    try:
        while True:
            if duration:
                if time.monotonic() - began >= duration:
                    break
                pending = list(CATEGORIES)
            else:
                pending = [c for c in CATEGORIES if report.inputs[c] < inputs_per_category]
                if not pending:
                    break
            fuzzer.one_connection(fuzzer.rng.choice(pending))
            if report.connections % 50 == 0:
                witness.produce()
        witness.produce()
        report.seconds = time.monotonic() - began
        report.witness_sent = len(witness.sent)
        report.witness_lost = witness.lost()
        report.topics_used = len(FUZZ_TOPICS)
        report.topics_usable = sum(
            topic_usable(broker, topic, check) for check, topic in enumerate(FUZZ_TOPICS)
        )
        # Every fuzz connection is closed: wait (bounded) for the broker to let go of its
        # sockets too; the witness's connection is open in both counts.
        deadline = time.monotonic() + 10
        while open_fds(port) > report.fds_before and time.monotonic() < deadline:
            time.sleep(0.05)
        report.fds_after = open_fds(port)
    finally:
        witness.close()
    report.rss_after_kib = rss_kib()
    now = restarts()
    report.actor_failures = {k: now[k] - failures_before[k] for k in now}
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of fuzzing")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--storage", choices=("memory", "disk"), default="memory")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory() as data_dir:
        broker = Broker(port=0, storage=args.storage, data_dir=data_dir).start()
        try:
            report = run(broker, seed=args.seed, duration=args.duration)
        finally:
            broker.stop()
    print(f"seed {args.seed}, {args.storage} storage")
    for line in report.lines():
        print(line)
    problems = report.problems()
    for problem in problems:
        print(f"PROBLEM: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
