"""What the bench prints and saves: the header, per-figure summaries and the targets table."""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import resource
import shlex
import statistics
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol, TypeVar

from brokerlet import _compiled

__all__ = [
    "Row",
    "StealMeter",
    "Summary",
    "format_bytes",
    "format_rate",
    "format_seconds",
    "judge",
    "print_header",
    "print_table",
    "system_info",
    "write_json",
]

_PACKAGES = ("brokerlet", "gevent", "pykka", "pulsar-client", "protobuf")


@dataclass(frozen=True)
class Summary:
    """Median and range of repeated measurements."""

    median: float
    low: float
    high: float
    count: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary:
        """Summarise ``values``; all NaN when there are none."""
        if not values:
            return cls(math.nan, math.nan, math.nan, 0)
        return cls(statistics.median(values), min(values), max(values), len(values))

    def as_dict(self) -> dict[str, float | int]:
        """The summary for JSON; NaN becomes None there (see :func:`write_json`)."""
        return {"median": self.median, "min": self.low, "max": self.high, "n": self.count}


@dataclass(frozen=True)
class Row:
    """One line of the final table.

    Attributes:
        figure: What was measured.
        value: The median (or single value), formatted.
        spread: The range over repeats, formatted; empty if not repeated.
        target: The target, formatted; empty for figures without one.
        status: ``MET``, ``MISSED``, ``FAILED`` (not measured), or empty.
    """

    figure: str
    value: str
    spread: str = ""
    target: str = ""
    status: str = ""


def judge(
    value: float,
    *,
    at_least: float | None = None,
    at_most: float | None = None,
    below: float | None = None,
) -> str:
    """``MET`` or ``MISSED`` for one target; ``FAILED`` if the value was not measured."""
    if math.isnan(value):
        return "FAILED"
    missed = (
        (at_least is not None and value < at_least)
        or (at_most is not None and value > at_most)
        or (below is not None and value >= below)
    )
    return "MISSED" if missed else "MET"


def format_rate(rate: float) -> str:
    """``23,148 msg/s``."""
    return "n/a" if math.isnan(rate) else f"{rate:,.0f} msg/s"


def format_seconds(seconds: float) -> str:
    """Milliseconds below a second, seconds above."""
    if math.isnan(seconds):
        return "n/a"
    if seconds < 1.0:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds:.2f} s"


def format_bytes(count: float) -> str:
    """Decimal units (1 KB = 1000 bytes), as the targets are stated."""
    if math.isnan(count):
        return "n/a"
    for unit, size in (("MB", 1e6), ("KB", 1e3)):
        if abs(count) >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count:.0f} B"


def system_info(
    command: Sequence[str], broker_command: Sequence[str], clients: str | None = None
) -> dict[str, Any]:
    """Everything the header reports, as plain data.

    Args:
        command: The bench's own command line.
        broker_command: The command line that starts a broker.
        clients: What drives the throughput runs (processes and roles); None if none run.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return {
        "command": shlex.join(command),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "load_average": [round(load, 2) for load in os.getloadavg()],
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "hot_modules": _compiled.STATUS,
        "versions": {name: _version(name) for name in _PACKAGES},
        "git": _git_revision(),
        "broker_command": shlex.join(broker_command),
        "clients": clients,
        "nofile_limit": [soft, hard],
    }


class StealMeter:
    """The share of the machine's CPU time the hypervisor took (``steal`` in /proc/stat)
    between `start` and `share`: on a VM, time its CPUs had work but the host ran something
    else, which wall-clock gaps include. None where the kernel does not report it."""

    def __init__(self) -> None:
        self._begin: tuple[int, int] | None = None

    def start(self) -> None:
        self._begin = _cpu_ticks()

    def share(self) -> float | None:
        end = _cpu_ticks()
        if self._begin is None or end is None:
            return None
        steal, total = (after - before for after, before in zip(end, self._begin, strict=True))
        return steal / total if total > 0 else None


def _cpu_ticks() -> tuple[int, int] | None:
    """(steal, all) ticks of the machine since boot, from /proc/stat's ``cpu`` line."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal [guest guest_nice, counted in user]
    ticks = [int(value) for value in fields[1:9]]
    return ticks[7], sum(ticks)


def print_header(info: dict[str, Any]) -> None:
    """Print the run's provenance."""
    versions = ", ".join(f"{name} {version}" for name, version in info["versions"].items())
    load = " ".join(str(value) for value in info["load_average"])
    lines = [
        ("command", info["command"]),
        ("date", info["date"]),
        ("machine", f"{info['platform']}; {info['cpu_model']}"),
        (
            "cores",
            f"{info['cpu_count']} (usable here: {info['cpus_usable']}; nothing pinned); "
            f"load average {load}",
        ),
        ("python", info["python"]),
        ("hot modules", info.get("hot_modules")),
        ("versions", versions),
        ("git", info["git"]),
        ("broker", info["broker_command"]),
        ("clients", info.get("clients")),
        ("open files", "soft {} / hard {}".format(*info["nofile_limit"])),
    ]
    print("brokerlet benchmark")
    for label, value in lines:
        if value is not None:
            print(f"  {label:<10} {value}")
    print(flush=True)


def print_table(rows: Sequence[Row]) -> None:
    """Print the figures with their targets, aligned."""
    header = Row("figure", "median", "range", "target", "")
    widths = [
        max(len(getattr(row, field)) for row in [header, *rows])
        for field in ("figure", "value", "spread", "target")
    ]
    for row in [header, *rows]:
        cells = (row.figure, row.value, row.spread, row.target)
        line = "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True))
        print(f"  {line}  {row.status}".rstrip())
    print(flush=True)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write the results as JSON (NaN as null), creating the directory if needed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_without_nan(data), indent=2) + "\n")


def _without_nan(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: _without_nan(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_without_nan(item) for item in value]
    return value


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _git_revision() -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        revision = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
            timeout=5,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{revision} (with uncommitted changes)" if dirty else revision


def rate_range(summary: Summary) -> str:
    """``low-high`` of a rate summary, for a row's range column; empty without figures."""
    if math.isnan(summary.median):
        return ""
    return f"{summary.low:,.0f}-{summary.high:,.0f}"


class _Run(Protocol):
    """A timed run's result: its figures, and an error when it failed."""

    @property
    def error(self) -> str | None: ...

    @property
    def latency_p50_ms(self) -> float: ...

    @property
    def latency_p99_ms(self) -> float: ...


RunT = TypeVar("RunT", bound=_Run)


def succeeded(runs: Sequence[RunT]) -> tuple[list[RunT], int, str]:
    """The runs without an error, how many failed, and a note saying so ("" if none did)."""
    good = [run for run in runs if run.error is None]
    failures = len(runs) - len(good)
    return good, failures, f" ({failures} of {len(runs)} runs failed)" if failures else ""


def latency_row(label: str, good: Sequence[_Run]) -> Row:
    """The median p50 / p99 row of the successful runs, with the range of their p99s."""
    p50 = Summary.of([run.latency_p50_ms for run in good])
    p99 = Summary.of([run.latency_p99_ms for run in good])
    return Row(
        label,
        f"{p50.median:.1f} / {p99.median:.1f} ms",
        f"p99 {p99.low:.1f}-{p99.high:.1f} ms" if good else "",
    )
