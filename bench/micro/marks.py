"""Micro-benchmark of a topic's retention point: the slowest durable mark-delete position.

Every move of a subscription's mark-delete position asks the topic for the slowest durable
one (``storage.marks.MarkDeletes``). Side by side in one run: that structure against the walk
of every subscription it replaced, for topics of 1 to 500 subscriptions whose marks move in
turn, as a fan-out's do. Prints figures, never asserts them. Run with
``python -m bench.micro.marks``.
"""

from __future__ import annotations

import argparse
import time

from brokerlet.storage.marks import MarkDeletes

__all__ = ["main"]


def _walk(marks: dict[str, int], released: set[str]) -> int | None:
    holding = [mark for name, mark in marks.items() if name not in released]
    return min(holding) if holding else None


def _per_move(subscriptions: int, moves: int, *, walk: bool) -> float:
    """CPU ns per move and retention-point read, marks moving forward in turn."""
    names = [f"sub-{index}" for index in range(subscriptions)]
    plain: dict[str, int] = dict.fromkeys(names, 0)
    released: set[str] = set()
    kept = MarkDeletes()
    for name in names:
        kept[name] = 0
    start = time.process_time()
    if walk:
        for index in range(moves):
            plain[names[index % subscriptions]] = index // subscriptions + 1
            _walk(plain, released)
    else:
        for index in range(moves):
            kept[names[index % subscriptions]] = index // subscriptions + 1
            kept.slowest()
    return (time.process_time() - start) / moves * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.micro.marks")
    parser.add_argument("--moves", type=int, default=50_000)
    args = parser.parse_args()
    print("retention point per mark-delete move (CPU ns; MarkDeletes vs a walk of every mark)")
    for subscriptions in (1, 5, 50, 500):
        kept = min(_per_move(subscriptions, args.moves, walk=False) for _ in range(3))
        walked = min(_per_move(subscriptions, args.moves, walk=True) for _ in range(3))
        print(
            f"  {subscriptions:4} subscriptions: {kept:8.0f} vs {walked:8.0f} ns "
            f"({kept / walked:.2f}x)"
        )


if __name__ == "__main__":
    main()
