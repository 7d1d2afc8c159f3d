"""``python -m loadtests``: list, run one scenario, run them all briefly, or compare brokers.

Only ``run`` imports Locust (which monkey-patches the process); ``all`` and ``compare`` start
one ``run`` subprocess per scenario and broker, so every run gets a fresh process.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from loadtests.brokers import BROKERS
from loadtests.report import table
from loadtests.scenarios import SCENARIOS, get_scenario

__all__ = ["RESULTS_ROOT", "main", "run_in_subprocess"]

RESULTS_ROOT = Path(__file__).resolve().parent / "results"
QUICK_DURATION = 15.0  # seconds of publishing per scenario in ``all`` (``make loadtest``)
# pulsar-lite writes to RocksDB without fsync (no fsync/fdatasync under load, by strace);
# brokerlet's matching durability is disk storage that leaves syncing to the kernel.
COMPARE_BROKERLET_ARGS = ["--storage=disk", "--sync-policy=never"]


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and run the command; returns the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "list":
        return _list()
    if args.command == "run":
        return _run(args)
    if args.command == "all":
        return _all(args)
    from loadtests.compare import compare, render  # noqa: PLC0415 -- only this command

    if args.render is not None:
        return render(args.render)
    return compare(
        scenarios=args.scenario or ["telemetry-high-rate", "key-shared-500x20"],
        duration=args.duration,
        repeats=args.repeats,
        saturation_inflight=args.saturation_inflight,
        output=args.output,
        brokerlet_args=args.brokerlet_arg or COMPARE_BROKERLET_ARGS,
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m loadtests", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="print every scenario's configuration")

    run = commands.add_parser("run", help="run one scenario")
    run.add_argument("scenario", choices=sorted(SCENARIOS))
    run.add_argument("--smoke", action="store_true",
                     help="the scenario's small smoke version (fewer users, lower rate)")
    run.add_argument("--duration", type=float, help="seconds of publishing")
    run.add_argument("--rate", type=float, help="aggregate publish cap, msg/s; 0 = unlimited")
    run.add_argument("--producers", type=int)
    run.add_argument("--subscriptions", type=int)
    run.add_argument("--consumers-per-subscription", type=int)
    run.add_argument("--inflight", type=int, help="sends per producer before waiting")
    run.add_argument("--message-size", type=int)
    run.add_argument("--keys", type=int, help="size of the key space")
    run.add_argument("--drain-timeout", type=float)
    run.add_argument("--pause-at", type=float)
    run.add_argument("--pause-seconds", type=float)
    run.add_argument("--churn-interval", type=float)
    run.add_argument("--broker", choices=BROKERS, default="brokerlet")
    run.add_argument("--service-url", help="use this running broker instead of starting one")
    run.add_argument("--brokerlet-arg", action="append", default=[], metavar="FLAG",
                     help="extra 'brokerlet serve' flag (repeat; use --brokerlet-arg=--x)")
    run.add_argument("--brokerlet-src", type=Path,
                     help="run brokerlet from this source tree instead of the installed one")
    run.add_argument("--profile", action="store_true",
                     help="sample the broker with py-spy and print its top functions")
    run.add_argument("--stats-interval", type=float, default=1.0,
                     help="seconds between broker stats samples; 0 = do not ask the broker")
    run.add_argument("--output", type=Path, help="directory for this run's files")
    run.add_argument("--label", default="")
    run.add_argument("--seed", type=int, default=1)
    run.add_argument("--quiet", action="store_true", help="print only the verdict line")

    every = commands.add_parser("all", help="run every scenario briefly, one after another")
    every.add_argument("--duration", type=float, default=QUICK_DURATION)
    every.add_argument("--smoke", action="store_true")

    compare = commands.add_parser(
        "compare", help="the same scenarios against brokerlet and pulsar-lite, interleaved"
    )
    compare.add_argument("--scenario", action="append", choices=sorted(SCENARIOS),
                         help="scenario to compare (repeat); default: telemetry-high-rate "
                         "and key-shared-500x20")
    compare.add_argument("--duration", type=float, default=20.0)
    compare.add_argument("--repeats", type=int, default=2)
    compare.add_argument("--saturation-inflight", type=int, default=8,
                         help="sends per producer in flight at saturation")
    compare.add_argument("--output", type=Path)
    compare.add_argument("--render", type=Path, metavar="DIR",
                         help="only print the table of an earlier comparison in DIR")
    compare.add_argument("--brokerlet-arg", action="append", default=[], metavar="FLAG",
                         help="'brokerlet serve' flag (repeat); default: "
                         + " ".join(COMPARE_BROKERLET_ARGS) + ", pulsar-lite's durability")
    return parser


def _list() -> int:
    for scenario in SCENARIOS.values():
        described = scenario.describe()
        print(f"{scenario.name}: {scenario.summary}")
        print("  " + ", ".join(f"{key}={value}" for key, value in described.items()
                               if key not in ("name", "summary")))
    return 0


def _run(args: argparse.Namespace) -> int:
    scenario = get_scenario(args.scenario)
    if args.smoke:
        scenario = scenario.smoke()
    scenario = scenario.with_overrides(
        duration=args.duration, rate=args.rate, producers=args.producers,
        subscriptions=args.subscriptions,
        consumers_per_subscription=args.consumers_per_subscription, inflight=args.inflight,
        message_size=args.message_size, keys=args.keys, drain_timeout=args.drain_timeout,
        pause_at=args.pause_at, pause_seconds=args.pause_seconds,
        churn_interval=args.churn_interval,
    )
    output = args.output or RESULTS_ROOT / f"{scenario.name}-{_timestamp()}"
    from loadtests.runner import RunOptions, run  # noqa: PLC0415 -- imports (and patches) Locust

    return run(scenario, RunOptions(
        output=output, broker=args.broker, service_url=args.service_url,
        brokerlet_args=args.brokerlet_arg, brokerlet_source=args.brokerlet_src,
        seed=args.seed, label=args.label, quiet=args.quiet, profile=args.profile,
        stats_interval=args.stats_interval,
    ))


def run_in_subprocess(arguments: list[str], log_path: Path, timeout: float) -> int:
    """Run ``python -m loadtests run ...`` in a fresh process, output to ``log_path``.

    Returns:
        Its exit code; 3 if it had to be killed after ``timeout`` seconds.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "loadtests", "run", *arguments],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            return 3


def _all(args: argparse.Namespace) -> int:
    root = RESULTS_ROOT / f"all-{_timestamp()}"
    rows: list[list[str]] = []
    failed = 0
    for name, scenario in SCENARIOS.items():
        output = root / name
        arguments = [name, "--duration", str(args.duration), "--output", str(output)]
        if args.smoke:
            arguments.append("--smoke")
        timeout = args.duration + scenario.drain_timeout + 120
        print(f"== {name} ({args.duration:g} s) ...", flush=True)
        started = time.monotonic()
        code = run_in_subprocess(arguments, output / "run.log", timeout)
        print((output / "run.log").read_text(), flush=True)
        failed += code != 0
        rows.append([name, {0: "PASS", 1: "FAIL", 2: "ERROR", 3: "TIMEOUT"}.get(code, str(code)),
                     f"{time.monotonic() - started:.0f}"])
    print(table(rows, ["scenario", "verdict", "wall s"], left=2))
    print(f"results in {root}/<scenario>/")
    return 1 if failed else 0


def _timestamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")
