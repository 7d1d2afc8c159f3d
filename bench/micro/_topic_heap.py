"""Run by `bench.micro.open_topics.heap` as a script: ``python _topic_heap.py COUNT``.

An embedded in-memory broker in this interpreter opens COUNT topics, each with a durable
subscription whose consumer is then closed; prints one JSON line: GC-tracked objects per open
topic and the median full collection, ms, with none and with all of them open. It imports
only brokerlet, so ``PYTHONPATH`` picks the tree measured.
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
import time
import uuid

from brokerlet import Broker
from brokerlet.testing.rawclient import RawClient


def _open_topics(broker: Broker, count: int) -> None:
    with RawClient(broker.address) as client:
        client.handshake()
        for _ in range(count):
            client.subscribe(f"persistent://public/default/heap-{uuid.uuid4().hex[:12]}", "s", 1)
            client.close_consumer(1)


def _full_collection_ms() -> float:
    gc.collect()
    times = []
    for _ in range(5):
        started = time.perf_counter()
        gc.collect()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def main(count: int) -> None:
    with Broker(port=0, storage="memory", web_service_enabled=False) as broker:
        _open_topics(broker, 50)  # warm: the first topics' objects are not only theirs
        none_ms = _full_collection_ms()
        before = len(gc.get_objects())
        _open_topics(broker, count)
        all_ms = _full_collection_ms()
        per_topic = (len(gc.get_objects()) - before) / max(count, 1)
    result = {
        "tracked_per_topic": per_topic,
        "full_collection_ms_none": none_ms,
        "full_collection_ms": all_ms,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main(int(sys.argv[1]))
