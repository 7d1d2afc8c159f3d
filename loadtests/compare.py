"""brokerlet against pulsar-lite: the same scenarios, client and load generator, interleaved.

For each scenario and load level, the runs alternate between the two brokers (brokerlet
first, then pulsar-lite first in the next repeat), so a noisy minute on the machine hits both.
Each run is a fresh ``python -m loadtests run`` process that starts its broker; the table
shows the median of the repeats and the ratio brokerlet / pulsar-lite.

Load levels:

* ``below``: the scenario's own rate cap (below saturation on a 2-core machine);
* ``saturation``: no rate cap, every producer keeping ``saturation_inflight`` sends in flight
  (closed loop). What saturates is whichever of the broker and the load generator runs out of
  CPU first; the table shows both processes' CPU so the reader can tell which.

A run that cannot start (a subscription type a broker refuses, say) or whose verdict fails
is shown as such in the table; only brokerlet's failures make the comparison exit non-zero.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from loadtests.brokers import BROKERS
from loadtests.cli import RESULTS_ROOT, run_in_subprocess
from loadtests.report import table
from loadtests.scenarios import get_scenario

__all__ = ["compare", "format_comparison", "render"]

_EXIT_TEXT = {2: "could not run", 3: "timed out"}
# Asking a broker for its stats costs it CPU and, on brokerlet, ~20 ms of its hub per call
# with 20 Key_Shared consumers; sampled every 5 s the comparison disturbs both brokers less.
STATS_INTERVAL = 5.0


def compare(
    *,
    scenarios: list[str],
    duration: float,
    repeats: int,
    saturation_inflight: int,
    output: Path | None,
    brokerlet_args: list[str],
) -> int:
    """Run the comparison, print and write its table; return the exit code."""
    root = output or RESULTS_ROOT / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    root.mkdir(parents=True, exist_ok=True)
    levels = {"below": [], "saturation": ["--rate", "0", "--inflight", str(saturation_inflight)]}
    runs: list[dict[str, Any]] = []
    for name in scenarios:
        scenario = get_scenario(name)
        for level, level_args in levels.items():
            for repeat in range(repeats):
                order = BROKERS if repeat % 2 == 0 else BROKERS[::-1]
                for broker in order:
                    runs.append(_one_run(root, name, level, level_args, broker, repeat,
                                         duration, scenario.drain_timeout, brokerlet_args))
    settings = {"scenarios": scenarios, "levels": list(levels), "duration": duration,
                "repeats": repeats, "saturation_inflight": saturation_inflight,
                "brokerlet_args": brokerlet_args}
    (root / "runs.json").write_text(
        json.dumps({"settings": settings, "runs": runs}, indent=1, default=str) + "\n"
    )
    text = format_comparison(runs, scenarios, list(levels), duration, repeats,
                             saturation_inflight, brokerlet_args)
    (root / "compare.txt").write_text(text + "\n")
    print(text)
    print(f"\nresults in {root}")
    brokerlet_failed = any(run["broker"] == "brokerlet" and run["code"] != 0 for run in runs)
    return 1 if brokerlet_failed else 0


def render(root: Path) -> int:
    """Print (and rewrite) the table of an earlier comparison from its ``runs.json``."""
    saved = json.loads((root / "runs.json").read_text())
    runs: list[dict[str, Any]] = saved["runs"]
    settings = saved["settings"]
    text = format_comparison(runs, settings["scenarios"], settings["levels"],
                             settings["duration"], settings["repeats"],
                             settings["saturation_inflight"], settings["brokerlet_args"])
    (root / "compare.txt").write_text(text + "\n")
    print(text)
    return 0


def _one_run(
    root: Path,
    scenario: str,
    level: str,
    level_args: list[str],
    broker: str,
    repeat: int,
    duration: float,
    drain_timeout: float,
    brokerlet_args: list[str],
) -> dict[str, Any]:
    output = root / f"{scenario}-{level}-{broker}-{repeat}"
    arguments = [scenario, "--broker", broker, "--duration", str(duration), "--output",
                 str(output), "--label", level, "--quiet", "--stats-interval",
                 str(STATS_INTERVAL), *level_args]
    if broker == "brokerlet":
        arguments += [f"--brokerlet-arg={flag}" for flag in brokerlet_args]
    print(f"== {scenario} / {level} / {broker} (repeat {repeat + 1}) ...", flush=True)
    load_before = os.getloadavg()[0]
    code = run_in_subprocess(arguments, output / "run.log", duration + drain_timeout + 180)
    summary_path = output / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    log_tail = (output / "run.log").read_text().strip().splitlines()[-3:]
    print("   " + (log_tail[-1] if log_tail else f"exit {code}"), flush=True)
    return {
        "scenario": scenario, "level": level, "broker": broker, "repeat": repeat,
        "code": code, "load_average_before": load_before, "summary": summary,
        "log_tail": log_tail,
    }


# -- the table -----------------------------------------------------------------------------

_METRICS: list[tuple[str, tuple[str, ...], bool]] = [
    # (label, path into summary.json, higher is better)
    ("published msg/s", ("throughput", "published_msg_s"), True),
    ("delivered msg/s", ("throughput", "delivered_msg_s"), True),
    ("publish p50 us", ("latency_us", "publish", "p50_us"), False),
    ("publish p99 us", ("latency_us", "publish", "p99_us"), False),
    ("e2e p50 us", ("latency_us", "e2e", "p50_us"), False),
    ("e2e p99 us", ("latency_us", "e2e", "p99_us"), False),
    ("e2e p99.9 us", ("latency_us", "e2e", "p99.9_us"), False),
    ("broker CPU us / delivered msg", ("cpu", "broker_cpu_us_per_delivered"), False),
    ("broker CPU % of one core", ("cpu", "broker_cpu_pct"), False),
    ("load generator CPU %", ("cpu", "loadgen_cpu_pct"), False),
    ("load generator loop lag p99 us", ("latency_us", "loadgen_loop_lag", "p99_us"), False),
]


def _get(summary: dict[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = summary
    for key in path:
        if not isinstance(value, dict) or value.get(key) is None:
            return None
        value = value[key]
    return float(value)


def _median(runs: list[dict[str, Any]], path: tuple[str, ...]) -> float | None:
    values = [v for run in runs if run["summary"] is not None
              and (v := _get(run["summary"], path)) is not None]
    return statistics.median(values) if values else None


def _verdict(runs: list[dict[str, Any]]) -> tuple[str, str | None]:
    """The verdict cell (``PASS 2/2``, ``FAIL 1/2``) and why the first failure failed."""
    if not runs:
        return "-", None
    failed = [run for run in runs if run["code"] != 0]
    if not failed:
        return f"PASS {len(runs)}/{len(runs)}", None
    run = failed[0]
    summary = run["summary"]
    if summary is not None:
        why = "; ".join(summary["verdict"]["violations"])
    else:
        why = _EXIT_TEXT.get(run["code"], f"exit {run['code']}")
        why += ": " + (run["log_tail"][-1] if run["log_tail"] else "")
    return f"FAIL {len(failed)}/{len(runs)}", why


def _delivered_share(runs: list[dict[str, Any]]) -> float | None:
    """Median share of (published x subscriptions) that was delivered by the end."""
    shares = []
    for run in runs:
        summary = run["summary"]
        if summary is None or not summary["verdict"]["published"]:
            continue
        verdict = summary["verdict"]
        expected = verdict["published"] * len(verdict["subscriptions"])
        delivered = sum(sub["unique"] for sub in verdict["subscriptions"].values())
        shares.append(delivered / expected)
    return statistics.median(shares) if shares else None


def _cell(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def format_comparison(
    runs: list[dict[str, Any]],
    scenarios: list[str],
    levels: list[str],
    duration: float,
    repeats: int,
    saturation_inflight: int,
    brokerlet_args: list[str],
) -> str:
    """The comparison table, with the targets checked, as plain text."""
    parts = [
        f"python -m loadtests compare --duration {duration:g} --repeats {repeats} "
        f"--saturation-inflight {saturation_inflight}"
        + "".join(f" --brokerlet-arg={flag}" for flag in brokerlet_args),
        "medians of the repeats; ratio = brokerlet / pulsar-lite; load average before the "
        "runs: " + ", ".join(f"{run['load_average_before']:.1f}" for run in runs),
    ]
    for scenario in scenarios:
        for level in levels:
            chosen = [run for run in runs if run["scenario"] == scenario and run["level"] == level]
            by_broker = {broker: [run for run in chosen if run["broker"] == broker]
                         for broker in BROKERS}
            rows = []
            for label, path, _higher in _METRICS:
                ours = _median(by_broker["brokerlet"], path)
                theirs = _median(by_broker["pulsar-lite"], path)
                ratio = f"{ours / theirs:.2f}" if ours is not None and theirs else "-"
                rows.append([label, _cell(ours), _cell(theirs), ratio])
            verdicts = {broker: _verdict(by_broker[broker]) for broker in BROKERS}
            rows.append(["verdict", verdicts["brokerlet"][0], verdicts["pulsar-lite"][0], ""])
            parts.append(f"\n{scenario} / {level}")
            parts.append(table(rows, ["measure", "brokerlet", "pulsar-lite", "ratio"]))
            parts += _notes(scenario, by_broker, verdicts)
            if level == "saturation" and _median(by_broker["brokerlet"],
                                                 ("cpu", "loadgen_cpu_pct")) is not None:
                parts.append(_bottleneck_note(by_broker))
        parts.append(_targets(runs, scenario))
    return "\n".join(parts)


def _notes(
    scenario: str,
    by_broker: dict[str, list[dict[str, Any]]],
    verdicts: dict[str, tuple[str, str | None]],
) -> list[str]:
    """Why runs failed, and a feature a broker lacks: a Key_Shared subscription that
    delivered under half of what was published stalled, rather than fell behind."""
    notes = []
    key_shared = get_scenario(scenario).subscription_type == "KeyShared"
    for broker in BROKERS:
        cell, why = verdicts[broker]
        if why is None:
            continue
        share = _delivered_share(by_broker[broker])
        if key_shared and share is not None and share < 0.5:
            notes.append(f"{broker}: Key_Shared does not work: its subscription received "
                         f"{share:.0%} of the published messages by the end of the drain "
                         "period (latency and CPU per message above measure a stall)")
        notes.append(f"{broker} {cell}: {why}")
    return notes


def _bottleneck_note(by_broker: dict[str, list[dict[str, Any]]]) -> str:
    notes = []
    for broker, runs in by_broker.items():
        loadgen = _median(runs, ("cpu", "loadgen_cpu_pct"))
        server = _median(runs, ("cpu", "broker_cpu_pct"))
        if loadgen is None or server is None:
            continue
        if loadgen >= 85 and loadgen > server:
            notes.append(f"{broker}: load generator bound (it used {loadgen:.0f}% of a core, "
                         f"the broker {server:.0f}%)")
        else:
            notes.append(f"{broker}: broker {server:.0f}% / load generator {loadgen:.0f}% "
                         "of a core")
    return "saturation: " + "; ".join(notes)


def _targets(runs: list[dict[str, Any]], scenario: str) -> str:
    def median(level: str, broker: str, path: tuple[str, ...]) -> float | None:
        return _median([run for run in runs if run["scenario"] == scenario
                        and run["level"] == level and run["broker"] == broker], path)

    def failed(level: str) -> str:
        brokers = [broker for broker in BROKERS if any(
            run["code"] != 0 for run in runs
            if run["scenario"] == scenario and run["level"] == level and run["broker"] == broker
        )]
        return f" [{' and '.join(brokers)} failed the verdict at {level}]" if brokers else ""

    checks = []
    ours = median("saturation", "brokerlet", ("throughput", "delivered_msg_s"))
    theirs = median("saturation", "pulsar-lite", ("throughput", "delivered_msg_s"))
    checks.append(_check("delivered throughput at saturation >= pulsar-lite's", ours, theirs,
                         lambda a, b: a >= b) + failed("saturation"))
    ours = median("below", "brokerlet", ("latency_us", "e2e", "p99_us"))
    theirs = median("below", "pulsar-lite", ("latency_us", "e2e", "p99_us"))
    checks.append(_check("e2e p99 below saturation <= pulsar-lite's", ours, theirs,
                         lambda a, b: a <= b) + failed("below"))
    for level in ("below", "saturation"):
        ours = median(level, "brokerlet", ("cpu", "broker_cpu_us_per_delivered"))
        theirs = median(level, "pulsar-lite", ("cpu", "broker_cpu_us_per_delivered"))
        checks.append(_check(f"CPU per delivered msg ({level}) <= 2x pulsar-lite's", ours,
                             theirs, lambda a, b: a <= 2 * b) + failed(level))
    return f"targets for {scenario}:\n" + "\n".join(f"  {check}" for check in checks)


def _check(name: str, ours: float | None, theirs: float | None, rule: Any) -> str:
    if ours is None or theirs is None:
        return f"{name}: not measured (a broker's runs did not produce the figure)"
    met = "met" if rule(ours, theirs) else "NOT met"
    return f"{name}: {met} ({_cell(ours)} vs {_cell(theirs)})"
