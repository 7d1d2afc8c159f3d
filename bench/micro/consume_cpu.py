"""The broker's CPU per message on the consume path alone, driven by a raw-socket consumer.

``python -m bench.micro.consume_cpu [--messages N] [--storage memory|disk] [--rounds R]
[--batch B]``

Each round stores N unbatched 128 B messages in a new topic (bench.micro.produce_cpu's
raw-socket producer, not counted), then one Shared consumer on a plain blocking socket reads
them all back: a receiver queue of 1,000 permits refilled by half as the client does, and
individual acks grouped 1,000 to an ACK frame as the client's ack grouping sends them. The
figure is the broker's CPU (user + system) over the consume phase divided by the messages:
dispatch, reading, MESSAGE encoding, socket writes, FLOW and ACK handling. Prints figures,
never asserts them. ``--source DIR`` runs the broker from another tree; ``--batch B`` stores
and consumes batches of B messages (a batch's acks then count as one, its entry's).
"""

from __future__ import annotations

import argparse
import sys
import uuid
from functools import partial

from bench.micro.broker_cpu import run
from bench.micro.produce_cpu import measure as produce
from bench.rawsocket import RawConnection, consume
from brokerlet.testing.process import ChildBroker
from brokerlet.transport.protocol import pb

__all__ = ["main", "measure"]

T = pb.BaseCommand
_QUEUE = 1000
_ACK_GROUP = 1000


def measure(broker: ChildBroker, messages: int, batch: int = 1) -> float:
    """Store ``messages`` in a new topic, ``batch`` to an entry, then consume them; the
    consume phase's CPU µs each."""
    topic = f"persistent://public/default/consume-{uuid.uuid4().hex[:8]}"
    connection = RawConnection(broker.service_url, "cpu-bench")
    connection.subscribe(topic, "bench")
    messages = -(-messages // batch) * batch
    produce(broker, messages, topic, batch=batch)
    before = broker.cpu_seconds()
    consume(connection, [1], messages, queue=_QUEUE, ack_group=_ACK_GROUP, batch=batch)
    cpu = broker.cpu_seconds() - before
    connection.close()
    return cpu / messages * 1e6


def main() -> None:
    # --batch is this benchmark's own; everything else is the shared runner's.
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--batch", type=int, default=1)
    known, sys.argv[1:] = parser.parse_known_args()
    shape = (
        "unbatched 128 B messages" if known.batch == 1 else f"128 B messages {known.batch} an entry"
    )
    run(
        "python -m bench.micro.consume_cpu",
        "consume path",
        partial(measure, batch=known.batch),
        f"{shape}, Shared, queue {_QUEUE}, acks grouped by {_ACK_GROUP}",
    )


if __name__ == "__main__":
    main()
