"""Micro-benchmark of Key_Shared consumer selection.

Compares, side by side in one run, a selection from the published snapshot (binary
search on a tuple of range ends) with the same lookup on the authoritative
`SortedDict`, for 2, 10 and 50 consumers, and measures `select_batch` per entry.
Prints figures next to their targets and never asserts them. Run with
``python bench/micro/selector.py`` (or ``-m bench.micro.selector``); ``--quick``
shortens every measurement.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from brokerlet.keyshared import (
    AutoSplitSelector,
    ConsistentHashingSelector,
    Selector,
    StickySelector,
    sticky_key_hash,
)
from brokerlet.keyshared.snapshot import HashRange

SNAPSHOT_SPEEDUP_TARGET = 5.0
BATCH_NS_TARGET = 100.0
CONSUMER_COUNTS = (2, 10, 50)
BATCH_SIZE = 500


@dataclass(eq=False)
class _Consumer:
    name: str


def _best_ns_per_op(run: Callable[[], object], ops: int, repeats: int) -> float:
    """The fastest of `repeats` timings of `run`, in nanoseconds per operation."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter_ns()
        run()
        best = min(best, time.perf_counter_ns() - started)
    return best / ops


def _dense_table(selector: Selector[Any]) -> tuple[bytes, tuple[Any, ...], int]:
    """The selector unrolled into one owner index per hash remainder (comparison only).

    One byte per slot, 64 KiB per snapshot, so at most 255 owners. Returns the
    table, the owners it indexes and the modulus that maps a hash to its index.
    """
    modulus = 65535 if isinstance(selector, ConsistentHashingSelector) else 65536
    selected = selector.snapshot.select_many([selector.slot(r) for r in range(modulus)])
    distinct = list({id(owner): owner for owner in selected}.values())
    index_of = {id(owner): i for i, owner in enumerate(distinct)}
    return bytes(index_of[id(owner)] for owner in selected), tuple(distinct), modulus


def _populated(kind: str, count: int) -> Selector[Any]:
    consumers = [_Consumer(f"consumer-{i}") for i in range(count)]
    if kind == "consistent(100)":
        selector: Selector[Any] = ConsistentHashingSelector(100)
        for consumer in consumers:
            selector.add(consumer)
    elif kind == "auto-split":
        selector = AutoSplitSelector()
        for consumer in consumers:
            selector.add(consumer)
    else:
        selector = StickySelector()
        width = 65536 // count
        for i, consumer in enumerate(consumers):
            selector.add(consumer, [HashRange(i * width, (i + 1) * width - 1)])
    return selector


def _measure(kind: str, count: int, hashes: Sequence[int], repeats: int) -> dict[str, float]:
    selector = _populated(kind, count)
    slots = [selector.slot(h) for h in hashes]
    snapshot = selector.snapshot
    lookup = selector.lookup_authoritative
    select_slot = snapshot.select
    select_hash = selector.select
    batch = hashes[:BATCH_SIZE]

    def by_snapshot() -> None:
        for slot in slots:
            select_slot(slot)

    def by_sorted_dict() -> None:
        for slot in slots:
            lookup(slot)

    def by_select() -> None:
        for key_hash in hashes:
            select_hash(key_hash)

    def by_batch() -> None:
        for _ in range(len(hashes) // BATCH_SIZE):
            selector.select_batch(batch)

    table, owners, modulus = _dense_table(selector)

    def by_dense_table() -> None:
        for _ in range(len(hashes) // BATCH_SIZE):
            [owners[table[h % modulus]] for h in batch]

    ops = len(hashes)
    return {
        "ranges": len(snapshot.ends),
        "snapshot": _best_ns_per_op(by_snapshot, ops, repeats),
        "sorted": _best_ns_per_op(by_sorted_dict, ops, repeats),
        "select": _best_ns_per_op(by_select, ops, repeats),
        "batch": _best_ns_per_op(by_batch, (ops // BATCH_SIZE) * BATCH_SIZE, repeats),
        "dense": _best_ns_per_op(by_dense_table, (ops // BATCH_SIZE) * BATCH_SIZE, repeats),
    }


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Print per-selection and per-batch-entry costs for each selector; return them too."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer, shorter runs")
    args = parser.parse_args(argv)
    return run(quick=args.quick)


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Measure every selector at every consumer count and print the table.

    Returns:
        One dict per selector and consumer count: ``selector``, ``consumers``, ``ranges``,
        and nanoseconds per lookup or entry: ``snapshot_ns``, ``sorted_dict_ns``,
        ``select_ns``, ``batch_ns``, ``dense_ns``; with ``ratio`` (SortedDict over
        snapshot).
    """
    ops, repeats = (5_000, 3) if quick else (50_000, 7)

    rng = random.Random(42)
    hashes = [sticky_key_hash(f"key-{rng.getrandbits(64)}".encode()) for _ in range(ops)]

    print(f"Key_Shared selection, ns per lookup (best of {repeats}, {ops} lookups)")
    print(
        f"targets: snapshot >= {SNAPSHOT_SPEEDUP_TARGET:.0f}x faster than SortedDict; "
        f"select_batch < {BATCH_NS_TARGET:.0f} ns/entry"
    )
    header = (
        f"{'selector':<16}{'consumers':>10}{'ranges':>8}{'snapshot':>10}{'SortedDict':>12}"
        f"{'ratio':>8}{'select(h)':>11}{'batch/entry':>13}{'dense/entry':>13}"
    )
    print(header)
    print("-" * len(header))
    print("(dense/entry: a 64 KiB per-slot owner table, measured for comparison, not used)")
    results: list[dict[str, Any]] = []
    for kind in ("consistent(100)", "auto-split", "sticky"):
        for count in CONSUMER_COUNTS:
            figures = _measure(kind, count, hashes, repeats)
            ratio = figures["sorted"] / figures["snapshot"]
            ratio_mark = "" if ratio >= SNAPSHOT_SPEEDUP_TARGET else " (below target)"
            batch_mark = "" if figures["batch"] < BATCH_NS_TARGET else " (above target)"
            print(
                f"{kind:<16}{count:>10}{figures['ranges']:>8.0f}{figures['snapshot']:>10.1f}"
                f"{figures['sorted']:>12.1f}{ratio:>7.1f}x{figures['select']:>11.1f}"
                f"{figures['batch']:>13.1f}{figures['dense']:>13.1f}{ratio_mark}{batch_mark}"
            )
            results.append(
                {
                    "selector": kind,
                    "consumers": count,
                    "ranges": int(figures["ranges"]),
                    "snapshot_ns": figures["snapshot"],
                    "sorted_dict_ns": figures["sorted"],
                    "ratio": ratio,
                    "select_ns": figures["select"],
                    "batch_ns": figures["batch"],
                    "dense_ns": figures["dense"],
                }
            )
    return results


if __name__ == "__main__":
    main()
