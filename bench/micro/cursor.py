"""Micro-benchmark of a subscription cursor: what a save costs behind unacknowledged entries.

A Shared subscription whose oldest entry stays unacknowledged (a consumer holding it) while
every later one is acknowledged keeps all of those acks above its mark-delete position, and
the dispatcher saves the cursor every ``cursor_flush_ms`` (100 ms) while acks flow. The
figures, side by side in one run, are the hub time of one save (the state handed to the
cursor store and its JSON) for `brokerlet.storage.cursor.Cursor`, which keeps runs of acked
ids, against the sorted set of ids it replaced (copied and folded into runs at every save),
and the cost of an acknowledgement either way. Prints figures, never asserts them. Run with
``python -m bench.micro.cursor`` (``--quick`` for fewer acks).
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from sortedcontainers import SortedSet

from brokerlet.storage.cursor import Cursor

MAX_RANGES = 10_000  # managedLedgerMaxUnackedRangesToPersist's default


class _IdSetCursor:
    """The cursor as it was: individually acked ids in a `SortedSet`, folded into runs at
    each save (kept here only to measure against)."""

    def __init__(self) -> None:
        self.mark_delete = -1
        self._acked: SortedSet = SortedSet()

    def ack(self, entry_id: int) -> None:
        if entry_id <= self.mark_delete:
            return
        if entry_id != self.mark_delete + 1:
            self._acked.add(entry_id)
            return
        self.mark_delete = entry_id
        acked = self._acked
        while acked and acked[0] == self.mark_delete + 1:
            self.mark_delete = acked.pop(0)

    def save(self) -> str:
        ids = list(self._acked)  # what Cursor.acked_ids() handed over
        kept = tuple(ids)  # CursorStore.save's copy
        runs: list[list[int]] = []
        for entry_id in sorted(kept):  # folded into runs when the file was encoded
            if runs and entry_id <= runs[-1][1] + 1:
                runs[-1][1] = max(runs[-1][1], entry_id)
            else:
                runs.append([entry_id, entry_id])
        return json.dumps({"mark_delete": self.mark_delete, "acked": runs})


def _save(cursor: Cursor) -> str:
    ranges = cursor.acked_ranges(MAX_RANGES)
    return json.dumps({"mark_delete": cursor.mark_delete, "acked": ranges})


def _best_ms(run: Callable[[], object], repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best * 1e3


def _acks_us(ack: Callable[[int], object], ids: Sequence[int]) -> float:
    started = time.perf_counter()
    for entry_id in ids:
        ack(entry_id)
    return (time.perf_counter() - started) / len(ids) * 1e6


def _shared_acks(rng: random.Random, consumers: int, count: int) -> list[int]:
    """Acks as a Shared subscription makes them: entries 1.. handed out round robin in
    batches of 50, each consumer acknowledging its own in order, the consumers interleaved
    at random (entry 0 is never acknowledged)."""
    queues: list[list[int]] = [[] for _ in range(consumers)]
    for start in range(1, count + 1, 50):
        queues[(start // 50) % consumers].extend(range(start, min(start + 50, count + 1)))
    for queue in queues:
        queue.reverse()
    acks: list[int] = []
    busy = [queue for queue in queues if queue]
    while busy:
        queue = rng.choice(busy)
        acks.append(queue.pop())
        if not queue:
            busy.remove(queue)
    return acks


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Print and return one dict per pattern: ``pattern``, ``acks``, ``runs``, ``save_ms``,
    ``before_save_ms``, ``ack_us``, ``before_ack_us``."""
    sizes = (10_000, 100_000) if quick else (10_000, 100_000, 1_000_000)
    rng = random.Random(19)
    patterns: list[tuple[str, list[int]]] = [
        (f"{n:,} acks behind one unacked entry", list(range(1, n + 1))) for n in sizes
    ]
    shuffled = list(range(1, 100_001))
    rng.shuffle(shuffled)
    patterns.append(("100,000 acks in random order", shuffled))
    patterns.append(("every other of 200,000 acked", list(range(1, 200_001, 2))))
    patterns.append(("10 Shared consumers, 100,000 acks", _shared_acks(rng, 10, 100_000)))
    print("cursor: one save (state + JSON) and one ack, runs of ids against a set of ids")
    header = f"{'pattern':<40}{'runs':>8}{'save ms':>10}{'before':>10}{'ack us':>8}{'before':>8}"
    print(header)
    print("-" * len(header))
    results = []
    for name, ids in patterns:
        cursor, before = Cursor(-1), _IdSetCursor()
        ack_us = _acks_us(cursor.ack, ids)
        before_ack_us = _acks_us(before.ack, ids)
        figures = {
            "pattern": name,
            "acks": len(ids),
            "runs": cursor.acked_runs,
            "save_ms": _best_ms(functools.partial(_save, cursor)),
            "before_save_ms": _best_ms(before.save),
            "ack_us": ack_us,
            "before_ack_us": before_ack_us,
        }
        print(
            f"{name:<40}{figures['runs']:>8,}{figures['save_ms']:>10.2f}"
            f"{figures['before_save_ms']:>10.2f}{ack_us:>8.2f}{before_ack_us:>8.2f}"
        )
        results.append(figures)
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer acks")
    run(quick=parser.parse_args(argv).quick)


if __name__ == "__main__":
    main()
