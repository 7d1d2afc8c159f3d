"""The command line shared by the micro-benchmarks that count a broker's CPU per message."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path

from bench.profiling import print_top, top_entries
from brokerlet.testing.process import BrokerletProcess, ChildBroker

__all__ = ["run"]

Measure = Callable[[ChildBroker, int], float]
"""Runs ``messages`` through a broker; returns the broker's CPU µs per message."""


def run(prog: str, path: str, measure: Measure, setup: str) -> None:
    """Parse the command line, measure each storage back-end and print one line each.

    Args:
        prog: the module's ``python -m`` name, for ``--help``.
        path: what is measured (``"produce path"``), the line's label.
        measure: the measurement.
        setup: how each round runs, printed after the figures.
    """
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--storage", choices=("memory", "disk"), action="append")
    parser.add_argument(
        "--source",
        type=Path,
        metavar="DIR",
        help="run the broker from this source tree (to compare two versions)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="PATH",
        help="run the broker under cProfile (one file per storage, named after "
        "PATH) and print its top own-time lines",
    )
    args = parser.parse_args()
    for storage in args.storage or ["memory", "disk"]:
        profile = None
        if args.profile is not None:
            profile = args.profile.with_name(f"{args.profile.stem}-{storage}{args.profile.suffix}")
        with BrokerletProcess(
            ["--storage", storage], profile_path=profile, source=args.source
        ) as broker:
            broker.start()
            measure(broker, 2000)  # warm-up: imports, first topic
            figures = [measure(broker, args.messages) for _ in range(args.rounds)]
        load = " / ".join(f"{value:.2f}" for value in os.getloadavg())
        text = ", ".join(f"{figure:.2f}" for figure in figures)
        print(
            f"{path}, {storage:6}: broker CPU µs per message {min(figures):.2f} "
            f"(rounds {text}; {args.messages} {setup}; load {load}; "
            f"{time.strftime('%H:%M:%S')})"
        )
        if profile is not None:
            print_top(top_entries(profile, "tottime"), f"broker own time, {storage} ({profile})")
