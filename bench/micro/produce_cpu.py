"""The broker's CPU per message on the produce path alone, driven by a raw-socket producer.

``python -m bench.micro.produce_cpu [--messages N] [--storage memory|disk] [--rounds R] [--keys K]
[--batch B]``

A plain blocking socket in this process sends pre-encoded unbatched SENDs of 128 bytes with a
window of receipts in flight; the broker runs in a subprocess (brokerlet.testing's
BrokerletProcess) and its CPU time (user + system) is divided by the messages. No
pulsar-client and no consumer: the figure is decode, append, storage and receipt, and it
stays meaningful on a loaded machine because it counts the broker's CPU, not wall clock.
Prints figures, never asserts them. ``--source DIR`` runs the broker from another tree;
``--keys K`` gives each SEND one of K partition keys (the broker then hashes each key as it
checks the SEND, for Key_Shared); ``--batch B`` sends batches of B messages (one SEND each,
as a batching client does) and keeps B times fewer SENDs in flight, so the window counts
messages as the client's ``maxPendingMessages`` does.
"""

from __future__ import annotations

import argparse
import random
import sys
import uuid
from collections.abc import Sequence
from functools import partial

from bench.micro.broker_cpu import run
from bench.rawsocket import RawConnection
from brokerlet.testing.process import ChildBroker
from brokerlet.transport.protocol import build_entry, encode_batch, encode_send, pb

__all__ = ["main", "measure"]

T = pb.BaseCommand
_WINDOW = 1000


def _entry(key: str | None = None, batch: int = 1) -> bytes:
    metadata = pb.MessageMetadata(producer_name="cpu-bench", sequence_id=0, publish_time=1)
    if key is not None:
        metadata.partition_key = key
    if batch == 1:
        return build_entry(metadata, b"x" * 128)
    metadata.num_messages_in_batch = batch
    single = pb.SingleMessageMetadata(payload_size=128)
    if key is not None:
        single.partition_key = key
    return build_entry(metadata, encode_batch([(single, b"x" * 128)] * batch))


def measure(
    broker: ChildBroker,
    messages: int,
    topic: str | None = None,
    keys: Sequence[str] = (),
    batch: int = 1,
) -> float:
    """Send ``messages`` to ``topic`` (None: a new one), ``batch`` to a SEND, each SEND with
    one of ``keys`` (drawn by a seeded random) if any; the broker's CPU µs per message."""
    connection = RawConnection(broker.service_url, "cpu-bench")
    if topic is None:
        topic = f"persistent://public/default/cpu-{uuid.uuid4().hex[:8]}"
    producer = pb.CommandProducer(topic=topic, producer_id=1, request_id=1)
    reply = connection.request(T(type=T.PRODUCER, producer=producer))
    if reply.type != T.PRODUCER_SUCCESS:
        raise RuntimeError(f"PRODUCER failed: {reply}")
    sends = -(-messages // batch)
    if keys:
        rng = random.Random(19)
        entries = [_entry(rng.choice(keys), batch) for _ in range(sends)]
    else:
        entries = [_entry(None, batch)] * sends
    frames = [b"".join(encode_send(1, i, batch, entry)) for i, entry in enumerate(entries)]
    window = max(1, _WINDOW // batch)
    before = broker.cpu_seconds()
    sent = received = 0
    while received < sends:
        if sent < sends and sent - received < window:
            due = frames[sent : min(sends, received + window)]
            connection.sock.sendall(b"".join(due))
            sent += len(due)
        got = connection.read(1)
        received += sum(1 for command in got if command.type == T.SEND_RECEIPT)
        if any(command.type != T.SEND_RECEIPT for command in got):
            raise RuntimeError(f"unexpected reply: {got[0]}")
    cpu = broker.cpu_seconds() - before
    connection.close()
    return cpu / (sends * batch) * 1e6


def main() -> None:
    # --keys is this benchmark's own; everything else is the shared runner's.
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--keys", type=int, default=0)
    parser.add_argument("--batch", type=int, default=1)
    known, sys.argv[1:] = parser.parse_known_args()
    keys = [f"key-{number:04d}" for number in range(known.keys)]
    shape = "unbatched 128 B SENDs" if known.batch == 1 else f"128 B messages {known.batch} a SEND"
    run(
        "python -m bench.micro.produce_cpu",
        "produce path",
        partial(measure, keys=keys, batch=known.batch),
        f"{shape}, window {_WINDOW} messages"
        + (f", {known.keys:,} partition keys" if keys else ""),
    )


if __name__ == "__main__":
    main()
