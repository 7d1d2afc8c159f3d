"""Micro-benchmark of the Key_Shared dispatcher's per-entry work, in-process.

For read batches of 100 and 500 stored entries (keyed as the official client writes
them, 1,000 distinct keys) and 20 consistent-hashing consumers with room for all:
`KeySharedRules.assign` (key read, hashing, selection, replay and draining checks, and in
older versions the delivered hook), then one release per entry as its ack comes back.
Prints nanoseconds per entry, best of 9; never asserts.

It uses only what every version of the rules has, so the same file measures another
checkout side by side: ``PYTHONPATH=<checkout> python bench/micro/key_shared_dispatch.py``.
"""

from __future__ import annotations

import random
import time
from typing import Any

from brokerlet.config import Settings
from brokerlet.dispatch.key_shared import KeySharedRules
from brokerlet.dispatch.replay import ReplaySet
from brokerlet.keyshared import KeySharedMeta
from brokerlet.storage.ledger import Entry
from brokerlet.transport.protocol import build_entry, pb

CONSUMERS = 20
DISTINCT_KEYS = 1_000
ROUNDS = 20


class _Consumer:
    def __init__(self, name: str) -> None:
        self.name = name
        self.pending: dict[int, int] = {}


def _reads(size: int, rng: random.Random, keys: list[str]) -> list[list[Entry]]:
    reads = []
    for first in range(0, size * ROUNDS, size):
        read = []
        for entry_id in range(first, first + size):
            metadata = pb.MessageMetadata(
                producer_name="standalone-0-17",
                sequence_id=entry_id,
                publish_time=1_796_130_223_052 + entry_id,
                partition_key=rng.choice(keys),
            )
            read.append(Entry(1, entry_id, build_entry(metadata, b"x" * 128), 0, 1))
        reads.append(read)
    return reads


def _one_pass(rules: Any, consumers: list[Any], reads: list[list[Entry]]) -> None:
    replay = ReplaySet()
    # Versions before issue 19's seventeenth pass took the delivered batches and the held
    # entries back through hooks; later ones record pending hashes in assign.
    delivered_batch = getattr(rules, "delivered_batch", None)
    delivered = getattr(rules, "delivered", None)
    forget_read = getattr(rules, "forget_read", None)
    for read in reads:
        budgets = dict.fromkeys(consumers, 1 << 30)
        batches, held = rules.assign(read, budgets, replay, from_replay=False)
        for consumer, batch in batches.items():
            if delivered_batch is not None:
                delivered_batch(consumer, batch)
            elif delivered is not None:
                for entry in batch:
                    delivered(consumer, entry)
        if forget_read is not None:
            forget_read(entry for entry, _ in held)
        for consumer, batch in batches.items():
            for entry in batch:
                rules.released(consumer, entry.entry_id)


def run() -> dict[int, float]:
    """ns per entry for each read batch size."""
    rng = random.Random(19)
    keys = [f"key-{rng.getrandbits(48):012x}" for _ in range(DISTINCT_KEYS)]
    rules = KeySharedRules(KeySharedMeta(), Settings(), lambda: None)
    consumers: list[Any] = [_Consumer(f"consumer-{i}") for i in range(CONSUMERS)]
    for consumer in consumers:
        rules.add_consumer(consumer, KeySharedMeta())
    results = {}
    for size in (100, 500):
        reads = _reads(size, rng, keys)
        best = float("inf")
        for _ in range(9):
            started = time.perf_counter_ns()
            _one_pass(rules, consumers, reads)
            best = min(best, time.perf_counter_ns() - started)
        results[size] = best / (size * ROUNDS)
        print(
            f"read batch {size}: {results[size]:.0f} ns per entry "
            f"(assign + delivered + released, {CONSUMERS} consumers, {DISTINCT_KEYS:,} keys)"
        )
    return results


if __name__ == "__main__":
    run()
