"""Micro-benchmark of Key_Shared consumer selection.

Compares, side by side in one run, a selection from the published snapshot (its
per-slot owner table) with the same lookup on the authoritative `SortedDict`, for 2,
10 and 50 consumers, and measures `select_batch` per entry against the binary search
on the snapshot's range ends it replaced. Then the whole per-entry path from a stored
entry to its owner for read batches of 100 and 500 entries, 50 consumers, consistent
hashing, 1,000 distinct keys: with the hash the SEND's check kept (plus that hashing),
from the entry's bytes (key read, hashing, selection: an entry read back from a
segment), and the protobuf-and-bisect path both replaced, all in this run. Also the
owner table's build time per membership change and its size. Prints figures next to
their targets and never asserts them. Run with
``python bench/micro/selector.py`` (or ``-m bench.micro.selector``); ``--quick``
shortens every measurement.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from brokerlet.config import Settings
from brokerlet.dispatch.key_shared import KeySharedRules, protobuf_key_hash
from brokerlet.keyshared import (
    AutoSplitSelector,
    ConsistentHashingSelector,
    KeySharedMeta,
    Selector,
    StickySelector,
    plain_key_hash,
    sticky_key_hash,
)
from brokerlet.keyshared.snapshot import HashRange, Snapshot
from brokerlet.producers.appends import plain_appends
from brokerlet.storage.ledger import Entry
from brokerlet.transport.protocol import (
    Frame,
    FrameDecoder,
    build_entry,
    encode_send,
    parse_metadata,
    pb,
    plain_key,
)

SNAPSHOT_SPEEDUP_TARGET = 5.0
BATCH_NS_TARGET = 100.0
CONSUMER_COUNTS = (2, 10, 50)
BATCH_SIZE = 500
ENTRY_BATCH_SIZES = (100, 500)
ENTRY_CONSUMERS = 50
DISTINCT_KEYS = 1_000
ENTRY_PAYLOAD = b"x" * 128


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


def _bisect_batch(selector: Selector[Any]) -> Callable[[Sequence[int]], list[Any]]:
    """`select_batch` as it was before the owner table: a binary search on the range ends."""
    snapshot = selector.snapshot
    ends, owners = snapshot.ends, snapshot.owners
    if isinstance(selector, ConsistentHashingSelector):
        modulus = 65535
        return lambda hashes: [owners[bisect_right(ends, h % modulus)] for h in hashes]
    return lambda hashes: [owners[bisect_left(ends, h % 65536 or 1)] for h in hashes]


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

    bisect_batch = _bisect_batch(selector)

    def by_bisect_batch() -> None:
        for _ in range(len(hashes) // BATCH_SIZE):
            bisect_batch(batch)

    ops = len(hashes)
    return {
        "ranges": len(snapshot.ends),
        "snapshot": _best_ns_per_op(by_snapshot, ops, repeats),
        "sorted": _best_ns_per_op(by_sorted_dict, ops, repeats),
        "select": _best_ns_per_op(by_select, ops, repeats),
        "batch": _best_ns_per_op(by_batch, (ops // BATCH_SIZE) * BATCH_SIZE, repeats),
        "bisect": _best_ns_per_op(by_bisect_batch, (ops // BATCH_SIZE) * BATCH_SIZE, repeats),
    }


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Print per-selection and per-batch-entry costs for each selector; return them too."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer, shorter runs")
    args = parser.parse_args(argv)
    results = run(quick=args.quick)
    run_entries(quick=args.quick)
    run_table_build(quick=args.quick)
    return results


def _stored_entries(count: int, rng: random.Random) -> list[Entry]:
    """Entries whose metadata is laid out as pulsar-client 3.x writes a keyed message."""
    keys = [f"key-{rng.getrandbits(48):012x}" for _ in range(DISTINCT_KEYS)]
    entries = []
    for entry_id in range(count):
        metadata = pb.MessageMetadata(
            producer_name="standalone-0-17",
            sequence_id=entry_id,
            publish_time=1_796_130_223_052 + entry_id,
            partition_key=rng.choice(keys),
        )
        entries.append(Entry(1, entry_id, build_entry(metadata, ENTRY_PAYLOAD), 0, 1))
    return entries


def run_entries(quick: bool = False) -> list[dict[str, Any]]:
    """Per entry, from a stored entry to its owner, for each read batch size.

    The dispatcher's path (`KeySharedRules.key_hashes`, then `select_batch` on the owner
    table) for entries as a topic stores a keyed SEND (the hash taken as the SEND was
    checked, kept with the entry in memory and the tail cache), plus that hashing per
    message; the same path for entries read back from a segment file, which carry no hash
    (key read off the wire format, each distinct key of a read hashed once); and the path
    those replaced (a protobuf decode and hash per entry, then a binary search).

    Returns:
        One dict per batch size: ``batch``, ``consumers``, ``keys``; ``kept_ns`` (the
        dispatcher's per entry with kept hashes), ``send_path_ns`` (what a keyed SEND adds
        to the per-SEND loop: its key read past and hashed) and their sum ``after_ns``;
        ``send_hash_ns`` (the hash called from Python, an upper bound); ``bytes_ns`` for
        entries without a kept hash, with its parts ``hash_ns`` and ``select_ns``;
        ``before_ns``.
    """
    repeats, rounds = (3, 4) if quick else (7, 20)
    rng = random.Random(19)
    selector = _populated("consistent(100)", ENTRY_CONSUMERS)
    rules = KeySharedRules(KeySharedMeta(), Settings(), lambda: None)
    rules.selector = selector
    print(
        f"Key_Shared per entry from a stored entry to its owner, {ENTRY_CONSUMERS} consumers, "
        f"consistent hashing, {DISTINCT_KEYS} distinct keys (best of {repeats}), ns"
    )
    print(f"target: <= {BATCH_NS_TARGET:.0f} ns/entry incl. hashing")
    header = (
        f"{'batch':>6}{'kept':>7}{'+ SEND hash':>13}{'= all':>8}{'(hash from Python':>19}"
        f"{'= all)':>8}{'no kept hash':>14}{'(hash':>8}{'+ select)':>11}{'before':>9}"
    )
    print(header)
    print("-" * len(header))
    results: list[dict[str, Any]] = []
    for size in ENTRY_BATCH_SIZES:
        figures = _measure_entries(_stored_batches(size, rounds, rng), rules, repeats)
        after = figures["kept"] + figures["send_path"]
        from_python = figures["kept"] + figures["send_hash"]
        print(
            f"{size:>6}{figures['kept']:>7.0f}{figures['send_path']:>13.0f}{after:>8.0f}"
            f"{figures['send_hash']:>19.0f}{from_python:>8.0f}{figures['bytes']:>14.0f}"
            f"{figures['hash']:>8.0f}{figures['select']:>11.0f}"
            f"{figures['before']:>9.0f}"
        )
        results.append(
            {
                "batch": size,
                "consumers": ENTRY_CONSUMERS,
                "keys": DISTINCT_KEYS,
                "after_ns": after,
                "kept_ns": figures["kept"],
                "send_path_ns": figures["send_path"],
                "send_hash_ns": figures["send_hash"],
                "bytes_ns": figures["bytes"],
                "hash_ns": figures["hash"],
                "select_ns": figures["select"],
                "before_ns": figures["before"],
            }
        )
    return results


def _sends(batch: list[Entry], keyless: bool = False) -> list[Frame]:
    """SEND frames of ``batch``'s messages (without their partition keys if ``keyless``), as
    the connection hands them to its per-SEND loop."""
    stream = []
    for entry in batch:
        data = entry.data
        if keyless:
            metadata = parse_metadata(data)
            metadata.ClearField("partition_key")
            data = build_entry(metadata, ENTRY_PAYLOAD)
        header, body = encode_send(1, entry.entry_id, 1, data)
        stream.append(header + body)
    frames = FrameDecoder(8 << 20).feed(b"".join(stream))
    if len(frames) != len(batch) or any(frame.send is None for frame in frames):
        raise AssertionError("the fast decoder did not take every SEND")
    return frames


def _afresh(rules: KeySharedRules) -> None:
    """Forget the hashes a tree before the seventeenth pass of issue 19 cached between reads
    (later trees keep none)."""
    cache = getattr(rules, "_key_hashes", None)
    if cache is not None:
        cache.clear()


def _stored_batches(size: int, rounds: int, rng: random.Random) -> list[list[Entry]]:
    return [_stored_entries(size, rng) for _ in range(rounds)]


def _measure_entries(
    batches: list[list[Entry]], rules: KeySharedRules, repeats: int
) -> dict[str, float]:
    """ns per entry of the dispatcher's paths, their parts, and the path they replaced."""
    selector = rules.selector
    bisect_batch = _bisect_batch(selector)
    hashes_of = [rules.key_hashes(batch) for batch in batches]
    kept = [
        [entry._replace(key_hash=plain_key_hash(plain_key(entry.data) or b"")) for entry in batch]
        for batch in batches
    ]
    if [rules.key_hashes(batch) for batch in kept] != hashes_of:
        raise AssertionError("a hash kept at SEND differs from the dispatcher's own")
    keys = [[plain_key(entry.data) or b"" for entry in batch] for batch in batches]

    keyed_sends = [_sends(batch) for batch in batches]
    keyless_sends = [_sends(batch, keyless=True) for batch in batches]

    def with_kept() -> None:
        for batch in kept:
            selector.select_batch(rules.key_hashes(batch))

    def send_hashing() -> None:
        # The hash called from Python: an upper bound of what a keyed SEND adds, since the
        # SEND path (compiled) calls it natively.
        for batch in keys:
            list(map(plain_key_hash, batch))

    def keyed_appends() -> None:
        for frames in keyed_sends:
            plain_appends(frames, 5 << 20)

    def keyless_appends() -> None:
        for frames in keyless_sends:
            plain_appends(frames, 5 << 20)

    def from_bytes() -> None:
        for batch in batches:
            _afresh(rules)  # each read is hashed afresh, as in dispatch
            selector.select_batch(rules.key_hashes(batch))

    def hashing() -> None:
        for batch in batches:
            _afresh(rules)
            rules.key_hashes(batch)

    def selecting() -> None:
        for hashes in hashes_of:
            selector.select_batch(hashes)

    def before() -> None:
        for batch in batches:
            bisect_batch([protobuf_key_hash(entry) for entry in batch])

    ops = sum(len(batch) for batch in batches)
    _afresh(rules)
    return {
        "kept": _best_ns_per_op(with_kept, ops, repeats),
        "send_hash": _best_ns_per_op(send_hashing, ops, repeats),
        # What a keyed SEND adds in the SEND path itself (its key read past, and hashed):
        # the per-SEND loop over the same messages with a key and without.
        "send_path": _best_ns_per_op(keyed_appends, ops, repeats)
        - _best_ns_per_op(keyless_appends, ops, repeats),
        "bytes": _best_ns_per_op(from_bytes, ops, repeats),
        "hash": _best_ns_per_op(hashing, ops, repeats),
        "select": _best_ns_per_op(selecting, ops, repeats),
        "before": _best_ns_per_op(before, ops, repeats),
    }


def run_table_build(quick: bool = False) -> dict[str, Any]:
    """What the owner table costs per membership change, 50 consistent-hashing consumers.

    Returns:
        ``ranges``, ``build_us`` (a Snapshot with its table), ``ends_only_us`` (the range
        tuples alone, as before the table), ``change_us`` (one add or remove, all in), and
        ``table_bytes`` / ``owners`` of the table.
    """
    repeats = 3 if quick else 7
    selector = _populated("consistent(100)", ENTRY_CONSUMERS)
    snapshot = selector.snapshot
    ends, owners = snapshot.ends, snapshot.owners

    def build() -> None:
        Snapshot(snapshot.start, ends, owners)

    def ends_only() -> None:
        tuple(ends), tuple(owners)

    def change() -> None:
        extra = _Consumer("consumer-extra")
        selector.add(extra)
        selector.remove(extra)

    figures = {
        "ranges": len(ends),
        "build_us": _best_ns_per_op(build, 1, repeats) / 1000,
        "ends_only_us": _best_ns_per_op(ends_only, 1, repeats) / 1000,
        "change_us": _best_ns_per_op(change, 2, repeats) / 1000,
        "table_bytes": sys.getsizeof(snapshot.slot_index),
        "owners": len(snapshot.slot_owners),
    }
    print(
        f"owner table, {ENTRY_CONSUMERS} consistent-hashing consumers ({figures['ranges']} "
        f"ranges): snapshot built in {figures['build_us']:.0f} us (range tuples alone "
        f"{figures['ends_only_us']:.0f} us); one membership change {figures['change_us']:.0f} "
        f"us all in; table {figures['table_bytes'] / 1024:.0f} KiB for {figures['owners']} owners"
    )
    return figures


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Measure every selector at every consumer count and print the table.

    Returns:
        One dict per selector and consumer count: ``selector``, ``consumers``, ``ranges``,
        and nanoseconds per lookup or entry: ``snapshot_ns``, ``sorted_dict_ns``,
        ``select_ns``, ``batch_ns``, ``bisect_ns`` (the binary-search batch it replaced);
        with ``ratio`` (SortedDict over snapshot).
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
        f"{'ratio':>8}{'select(h)':>11}{'batch/entry':>13}{'bisect/entry':>14}"
    )
    print(header)
    print("-" * len(header))
    print("(batch/entry: the snapshot's per-slot owner table; bisect/entry: the binary search")
    print(" on its range ends that select_batch used before, for comparison)")
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
                f"{figures['batch']:>13.1f}{figures['bisect']:>14.1f}{ratio_mark}{batch_mark}"
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
                    "bisect_ns": figures["bisect"],
                }
            )
    return results


if __name__ == "__main__":
    main()
