"""The command line shared by the micro-benchmarks that count a broker's CPU per message.

``--callgrind`` counts instead the instructions the broker runs per message under valgrind's
callgrind (needs Debian's valgrind): the broker's ``cpu_seconds()`` then dumps the counts
since its previous call, so the newest dump holds exactly the last measurement's window.
CPU time per message moves by a third between runs on a shared VM; this count repeats to
about a per cent, so it is the figure to compare two trees by (``--source``).

``--lines`` counts the lines of Python the broker runs per message instead, per function
(`bench.linetrace`): where the instructions go, in the code's own terms.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.callgrind import total_instructions, under_callgrind
from bench.linetrace import LineCounts, TracedBroker
from bench.profiling import print_top, top_entries
from brokerlet.testing.process import BrokerletProcess, ChildBroker

__all__ = ["instructions_per_message", "run"]

Measure = Callable[[ChildBroker, int], float]
"""Runs ``messages`` through a broker; returns the broker's CPU µs per message."""

_CALLGRIND_MESSAGES = 10_000


def run(prog: str, path: str, measure: Measure, setup: str) -> None:
    """Parse the command line, measure each storage back-end and print one line each.

    Args:
        prog: the module's ``python -m`` name, for ``--help``.
        path: what is measured (``"produce path"``), the line's label.
        measure: the measurement.
        setup: how each round runs, printed after the figures.
    """
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument(
        "--messages",
        type=int,
        help=f"per round (default 50,000; under --callgrind {_CALLGRIND_MESSAGES:,}, one round)",
    )
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
    parser.add_argument(
        "--callgrind",
        action="store_true",
        help="count the broker's instructions per message under valgrind instead",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="PATH",
        help="with --callgrind: copy the measured window's dump here (one file per storage, "
        "named after PATH), for callgrind_annotate",
    )
    parser.add_argument(
        "--lines",
        action="store_true",
        help="count the lines of Python the broker runs per message, per function, instead",
    )
    args = parser.parse_args()
    if args.callgrind:
        messages = args.messages or _CALLGRIND_MESSAGES
        for storage in args.storage or ["memory", "disk"]:
            keep = None
            if args.keep is not None:
                keep = args.keep.with_name(f"{args.keep.stem}-{storage}{args.keep.suffix}")
            count = instructions_per_message(
                ["--storage", storage], args.source, measure, messages, keep
            )
            print(
                f"{path}, {storage:6}: {count:,.0f} instructions per message (callgrind; "
                f"{messages} {setup}; {time.strftime('%H:%M:%S')})"
            )
        return
    args.messages = args.messages or 50_000
    if args.lines:
        for storage in args.storage or ["memory", "disk"]:
            counts = lines_of(["--storage", storage], args.source, measure, args.messages)
            print(f"{path}, {storage}, per message ({args.messages} {setup}):")
            print(counts.report(args.messages))
        return
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


def lines_of(flags: list[str], source: Path | None, measure: Measure, messages: int) -> LineCounts:
    """The lines of Python of ``measure``'s window for ``messages``, per function."""
    with (
        tempfile.TemporaryDirectory() as directory,
        TracedBroker(flags, Path(directory) / "lines.json", source=source) as broker,
    ):
        broker.start(timeout=300)
        measure(broker, 2000)  # warm-up: imports, first topic
        measure(broker, messages)
        return broker.window()


class _CountedBroker(BrokerletProcess):
    """A broker under callgrind whose ``cpu_seconds()`` dumps the instructions counted since
    its previous call (and returns 0): a measurement's window is then the newest dump."""

    def cpu_seconds(self) -> float:
        subprocess.run(["callgrind_control", "-d", str(self.pid)], check=True, capture_output=True)
        return 0.0


def instructions_per_message(
    flags: list[str],
    source: Path | None,
    measure: Measure,
    messages: int = _CALLGRIND_MESSAGES,
    keep: Path | None = None,
) -> float:
    """Instructions per message of ``measure``'s window of ``messages``, on a broker under
    callgrind (its dump copied to ``keep`` if given)."""
    with tempfile.TemporaryDirectory() as directory:
        out = Path(directory) / "callgrind.out"
        broker = _CountedBroker(flags, source=source)
        under_callgrind(broker, out)
        with broker:
            broker.start(timeout=300)
            measure(broker, 2000)  # warm-up: imports, first topic
            measure(broker, messages)
            broker.stop(timeout=300)
        dumps = sorted(out.parent.glob(f"{out.name}.*"), key=lambda dump: int(dump.suffix[1:]))
        if not dumps:
            raise RuntimeError(f"callgrind wrote no dump in {directory}")
        if keep is not None:
            shutil.copyfile(dumps[-1], keep)
        return total_instructions(dumps[-1]) / messages
