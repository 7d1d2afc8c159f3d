"""The broker's CPU per message on the Key_Shared consume path, 20 consumers on one connection.

``python -m bench.micro.key_shared_consume_cpu [--messages N] [--storage memory|disk]``

As ``bench.micro.consume_cpu``, but the messages carry one of 1,000 partition keys and the
subscription is Key_Shared with 20 consumers sharing one raw-socket connection, as the official
client shares one connection per broker among a process's consumers: a read's entries are
split over the consumers in small batches, which is where Key_Shared's cost beyond Shared's
lies. Each consumer has a receiver queue of 1,000 permits refilled by half, and acks grouped
by 100 per consumer. Prints figures, never asserts them; ``--callgrind`` and ``--source DIR``
as the other micro-benchmarks.
"""

from __future__ import annotations

import uuid

from bench.micro.broker_cpu import run
from bench.micro.produce_cpu import measure as produce
from bench.rawsocket import RawConnection, consume
from brokerlet.testing.process import ChildBroker
from brokerlet.transport.protocol import pb

__all__ = ["main", "measure"]

T = pb.BaseCommand
CONSUMERS = 20
KEYS = 1_000
_QUEUE = 1000
_ACK_GROUP = 100


def measure(broker: ChildBroker, messages: int) -> float:
    """Store ``messages`` keyed messages in a new topic, then consume them through 20
    Key_Shared consumers; the consume phase's CPU µs per message."""
    topic = f"persistent://public/default/ks-consume-{uuid.uuid4().hex[:8]}"
    consumers = RawConnection(broker.service_url, "cpu-bench")
    for consumer_id in range(1, CONSUMERS + 1):
        consumers.subscribe(topic, "bench", consumer_id, pb.CommandSubscribe.Key_Shared)
    produce(broker, messages, topic, keys=[f"key-{number:04d}" for number in range(KEYS)])
    before = broker.cpu_seconds()
    consume(consumers, range(1, CONSUMERS + 1), messages, queue=_QUEUE, ack_group=_ACK_GROUP)
    cpu = broker.cpu_seconds() - before
    consumers.close()
    return cpu / messages * 1e6


def main() -> None:
    run(
        "python -m bench.micro.key_shared_consume_cpu",
        "Key_Shared consume path",
        measure,
        f"unbatched 128 B messages, {KEYS:,} keys, {CONSUMERS} Key_Shared consumers on one "
        f"connection, queue {_QUEUE} each, acks grouped by {_ACK_GROUP}",
    )


if __name__ == "__main__":
    main()
