"""Printed tables of a run's summary (the dict also written to ``summary.json``).

Pure formatting: no Locust, no gevent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loadtests.profile import top_functions

__all__ = ["format_header", "format_profile", "format_samples", "format_summary", "table"]

_MAX_SAMPLE_ROWS = 16


def table(rows: list[list[str]], header: list[str], left: int = 1) -> str:
    """A plain text table, columns padded to their widest cell; the first ``left`` columns
    are left-aligned, the rest right-aligned."""
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        padded = [
            str(cell).ljust(widths[i]) if i < left else str(cell).rjust(widths[i])
            for i, cell in enumerate(cells)
        ]
        return "  ".join(padded).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([line(header), rule, *(line(row) for row in rows)])


def _value(value: object, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def format_header(scenario: dict[str, Any], broker: dict[str, Any]) -> str:
    """The configuration printed at the start of a run."""
    lines = [f"scenario {scenario['name']}: {scenario['summary']}"]
    keys = ["producers", "subscriptions", "consumers_per_subscription", "consumers",
            "subscription_type", "rate", "inflight", "message_size", "keys", "duration",
            "drain_timeout", "receiver_queue_size"]
    if scenario.get("pause_seconds"):
        keys += ["pause_at", "pause_seconds"]
    if scenario.get("churn_interval"):
        keys += ["churn_interval"]
    lines.append("  " + ", ".join(f"{key}={scenario[key]}" for key in keys))
    lines.append("  broker: " + ", ".join(f"{key}={value}" for key, value in broker.items()))
    return "\n".join(lines)


def format_summary(summary: dict[str, Any]) -> str:
    """The end-of-run table: throughput, latency percentiles, CPU, verdict, extras."""
    throughput = summary["throughput"]
    latency = summary["latency_us"]
    cpu = summary["cpu"]
    verdict = summary["verdict"]
    rows = [
        ["published msg/s", _value(throughput["published_msg_s"], 1)],
        ["delivered msg/s (all subscriptions)", _value(throughput["delivered_msg_s"], 1)],
    ]
    for kind in ("publish", "e2e"):
        stats = latency[kind]
        rows.append([
            f"{kind} latency p50 / p99 / p99.9 / max (us)",
            " / ".join(_value(stats[key]) for key in ("p50_us", "p99_us", "p99.9_us", "max_us")),
        ])
    lag = latency.get("loadgen_loop_lag") or {}
    rows.append([
        "load generator loop lag p50 / p99 / max (us)",
        " / ".join(_value(lag.get(key)) for key in ("p50_us", "p99_us", "max_us")),
    ])
    rows += [
        ["broker CPU s (us per delivered msg)",
         f"{_value(cpu['broker_cpu_s'], 2)} ({_value(cpu['broker_cpu_us_per_delivered'], 1)})"],
        ["load generator CPU % of one core", _value(cpu["loadgen_cpu_pct"], 0)],
        ["sent / published / failed",
         f"{verdict['sent']:,} / {verdict['published']:,} / {verdict['publish_failed']:,}"],
        ["in flight at end", _value(verdict["in_flight"])],
        ["duplicates / redelivered", f"{verdict['duplicates']:,} / {verdict['redelivered']:,}"],
        ["per-key order violations",
         _value(verdict["order_violations"]) if summary["scenario"]["ordered"]
         else "n/a (Shared does not order keys)"],
    ]
    for name, report in summary.get("reports", {}).items():
        rows += [[f"{name}: {key}", _value(value, 2)] for key, value in report.items()]
    rows.append(["verdict", "PASS" if verdict["passed"] else
                 "FAIL: " + "; ".join(verdict["violations"])])
    text = table(rows, ["measure", "value"], left=2)
    examples = [example for sub in verdict["subscriptions"].values() for example in sub["examples"]]
    if examples:
        text += "\nexamples: " + "; ".join(examples[:10])
    return text


def format_samples(samples: list[dict[str, Any]]) -> str:
    """Broker stats sampled during the run, thinned to at most 16 rows."""
    samples = [sample for sample in samples if sample["t"] is not None]
    if not samples:
        return "(no broker stats samples)"
    step = max(1, -(-len(samples) // _MAX_SAMPLE_ROWS))
    chosen = samples[::step]
    if chosen[-1] is not samples[-1]:
        chosen.append(samples[-1])
    rows = []
    for sample in chosen:
        broker = sample.get("broker") or {}
        subs = broker.get("subscriptions") or {}
        rows.append([
            _value(sample["t"], 1),
            _value(broker.get("msgRateIn"), 0),
            _value(broker.get("msgRateOut"), 0),
            _value(_sum(subs, "msgBacklog")),
            _value(_sum(subs, "unackedMessages")),
            _value(_sum(subs, "consumers")),
            _value(_sum(subs, "unwritableConsumers")),
            _value(max((s.get("pendingOutboundBytes") or 0 for s in subs.values()), default=None)),
            _value(sample["in_flight"]),
            _value(sample["broker_cpu_pct"], 0),
            _value(sample["loadgen_cpu_pct"], 0),
        ])
    return table(rows, ["t s", "rate in", "rate out", "backlog", "unacked", "consumers",
                        "unwritable", "max pending B", "in flight", "broker cpu%",
                        "loadgen cpu%"])


def _sum(subscriptions: dict[str, dict[str, Any]], key: str) -> int | None:
    values = [sub[key] for sub in subscriptions.values() if sub.get(key) is not None]
    return int(sum(values)) if values else None


def format_profile(collapsed: Path, limit: int = 15) -> str:
    """The broker's top functions from a py-spy raw file: by own time, then inclusive."""
    parts = []
    for by in ("own", "inclusive"):
        total, rows = top_functions(collapsed, limit, by=by)
        parts.append(f"broker profile, top {limit} by {by} samples ({total:,} samples)")
        parts.append(table([[name, f"{own:.1%}", f"{inclusive:.1%}"]
                            for name, own, inclusive in rows],
                           ["function", "own", "inclusive"]))
    return "\n".join(parts)
