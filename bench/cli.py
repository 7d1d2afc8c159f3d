"""``python -m bench``: options, the order of the sections, and the final report."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.plan import FULL, QUICK, SectionResult
from bench.report import Row, print_header, print_table, system_info, write_json
from bench.sections.backpressure import run_backpressure
from bench.sections.compaction import run_compaction
from bench.sections.consumer_semantics import run_consumer_semantics
from bench.sections.cursor import run_cursor
from bench.sections.dedup import run_dedup
from bench.sections.flow import run_flow
from bench.sections.keyshared import run_keyshared
from bench.sections.latency import run_latency
from bench.sections.memory import raise_file_limit, run_memory
from bench.sections.open_topics import run_open_topics
from bench.sections.partitions import run_partitions
from bench.sections.schema import run_schema
from bench.sections.selector import run_selector
from bench.sections.startup import run_startup
from bench.sections.storage import run_storage
from bench.sections.throughput import DEFAULT_PRODUCERS, run_throughput
from bench.sections.tls import run_tls
from brokerlet.testing.process import brokerlet_command

__all__ = ["main"]

# Client-process sections first; those that run a broker or actors in this process last.
SECTIONS = (
    "throughput",
    "tls",
    "keyshared",
    "storage",
    "partitions",
    "compaction",
    "dedup",
    "startup",
    "memory",
    "topics",
    "backpressure",
    "flow",
    "selector",
    "cursor",
    "schema",
    "latency",
    "consumer",
)
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; return 0, or 1 if a measurement failed (a missed target is not)."""
    if argv is None:
        argv = sys.argv[1:]
        command = list(sys.orig_argv)
    else:
        command = [sys.executable, "-m", "bench", *argv]
    args = _parser().parse_args(argv)
    plan = QUICK if args.quick else FULL
    chosen = args.only or list(SECTIONS)
    profile_path = RESULTS_DIR / "broker-unbatched.prof" if args.profile else None
    if args.profile and "throughput" not in chosen:
        print("note: --profile profiles the throughput section, which is not selected")

    raise_file_limit()  # before any broker is spawned: children inherit it
    clients = None
    if "throughput" in chosen:
        clients = _clients_line(args.producers, plan.compare_single_producer)
    info = system_info(
        command, brokerlet_command(0, data_dir="<fresh temp dir per broker>"), clients
    )
    print_header(info)

    runners: dict[str, Callable[[], SectionResult]] = {
        "throughput": lambda: run_throughput(plan, profile_path, args.producers),
        "tls": lambda: run_tls(plan, args.producers),
        "keyshared": lambda: run_keyshared(plan, args.producers),
        "storage": lambda: run_storage(plan, args.producers),
        "partitions": lambda: run_partitions(plan, args.producers, args.quick),
        "compaction": lambda: run_compaction(plan, args.producers, args.quick),
        "dedup": lambda: run_dedup(plan, args.producers),
        "startup": lambda: run_startup(plan),
        "memory": lambda: run_memory(plan),
        "topics": lambda: run_open_topics(plan),
        "backpressure": lambda: run_backpressure(plan),
        "flow": lambda: run_flow(plan),
        "selector": lambda: run_selector(plan),
        "cursor": lambda: run_cursor(plan),
        "schema": lambda: run_schema(plan),
        "latency": lambda: run_latency(args.quick),
        "consumer": lambda: run_consumer_semantics(plan),
    }
    results: dict[str, object] = {"header": info, "quick": args.quick}
    rows: list[Row] = []
    failed = False
    for name in SECTIONS:
        if name not in chosen:
            continue
        try:
            section = runners[name]()
        except Exception as error:  # one broken section must not hide the rest
            traceback.print_exc()
            section = SectionResult(
                data={"error": repr(error)},
                rows=[Row(name, "n/a", status="FAILED")],
                failed=True,
            )
        # Other work on the machine moves the figures: say how busy it was.
        load = os.getloadavg()
        load_text = " / ".join(f"{value:.2f}" for value in load)
        print(f"  load average after {name}: {load_text} (1 / 5 / 15 min)")
        print()
        results[name] = {**section.data, "load_average_after_section": list(load)}
        rows.extend(section.rows)
        rows.append(Row(f"  load average after {name}", load_text, "1 / 5 / 15 min"))
        failed |= section.failed

    print("results" + (" (--quick: small runs, indicative only)" if args.quick else ""))
    print_table(rows)
    results["table"] = [_row_dict(row) for row in rows]
    write_json(args.json, results)
    print(f"written to {args.json}")
    return 1 if failed else 0


def _clients_line(producers: int, compare: bool) -> str:
    """What drives the throughput runs, for the header."""
    line = (
        f"{producers} producer process{'es' if producers != 1 else ''} + 1 consumer "
        f"process ({producers + 1} processes of pulsar-client, spawned per run; this one "
        "only coordinates)"
    )
    if compare and producers != 1:
        line += "; each timed run is paired with a 1-producer run for comparison"
    return line


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _row_dict(row: Row) -> dict[str, str]:
    return {
        "figure": row.figure.strip(),
        "value": row.value,
        "range": row.spread,
        "target": row.target,
        "status": row.status,
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Measure brokerlet against its targets: throughput, Key_Shared, storage, "
        "start-up time, memory, backpressure, FLOW latency and Key_Shared selection.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small runs (a smoke test of the bench, figures indicative only)",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=SECTIONS,
        metavar="SECTION",
        help=f"run only this section ({', '.join(SECTIONS)}); repeatable",
    )
    parser.add_argument(
        "--producers",
        type=_positive,
        default=DEFAULT_PRODUCERS,
        metavar="N",
        help="producer processes per throughput, keyshared and storage run, "
        f"each sending its share (default: {DEFAULT_PRODUCERS})",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="add an unbatched run against a broker under cProfile and print its top functions",
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=RESULTS_DIR / "latest.json",
        metavar="PATH",
        help="where to write the results (default: bench/results/latest.json)",
    )
    return parser
