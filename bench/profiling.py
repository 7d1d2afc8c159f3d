"""Reading a broker profile written by ``python -m cProfile -o``.

cProfile times wall clock per function on the thread it was started on. Under gevent every
greenlet runs on that thread, so a function that waits in a greenlet switch is charged for
whatever other greenlets ran meanwhile: trust ``tottime`` for where CPU goes, and read
``cumtime`` as "time spent inside, including waiting".
"""

from __future__ import annotations

import pstats
import sys
import sysconfig
from pathlib import Path
from typing import Any

__all__ = ["own_time_by_package", "print_packages", "print_top", "top_entries"]

_SITE_PACKAGES = sysconfig.get_paths()["purelib"] + "/"
_STDLIB = sysconfig.get_paths()["stdlib"] + "/"
_REPO = str(Path(__file__).resolve().parent.parent) + "/"
_PREFIXES = sorted({_SITE_PACKAGES, _STDLIB, _REPO, sys.prefix + "/"}, key=len, reverse=True)

_Raw = dict[tuple[str, int, str], tuple[int, int, float, float, Any]]


def _raw_stats(path: Path) -> _Raw:
    # ``Stats.stats`` is pstats' raw table, {(file, line, name): (primitive calls, calls,
    # tottime, cumtime, callers)}; typeshed does not declare it.
    raw: _Raw = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    return raw


def top_entries(path: Path, sort: str, limit: int = 25) -> list[dict[str, Any]]:
    """The ``limit`` functions first by ``sort`` (``"cumulative"`` or ``"tottime"``).

    Returns:
        Rows with ``function`` (``path:line(name)``, path trimmed), ``calls``,
        ``tottime_s`` and ``cumtime_s``.
    """
    rows: list[dict[str, Any]] = []
    for (filename, line, name), (_primitive, calls, tottime, cumtime, _callers) in _raw_stats(
        path
    ).items():
        rows.append(
            {
                "function": f"{_trim(filename)}:{line}({name})",
                "calls": calls,
                "tottime_s": tottime,
                "cumtime_s": cumtime,
            }
        )
    key = "cumtime_s" if sort == "cumulative" else "tottime_s"
    rows.sort(key=lambda row: float(row[key]), reverse=True)
    return rows[:limit]


def own_time_by_package(path: Path) -> dict[str, float]:
    """Own (``tottime``) seconds summed per package, largest first.

    Packages are top-level names under site-packages or this repository (``brokerlet``,
    ``gevent``, ``pykka``, ``google``), ``stdlib``, and ``built-ins`` for C functions called
    from Python.
    """
    totals: dict[str, float] = {}
    for (filename, _line, _name), (_primitive, _calls, tottime, _cumtime, _callers) in _raw_stats(
        path
    ).items():
        package = _package(filename)
        totals[package] = totals.get(package, 0.0) + tottime
    return dict(sorted(totals.items(), key=lambda item: item[1], reverse=True))


def print_packages(totals: dict[str, float]) -> None:
    """Print :func:`own_time_by_package` as shares of the whole."""
    whole = sum(totals.values()) or 1.0
    shares = ", ".join(
        f"{name} {seconds / whole:.0%}"
        for name, seconds in totals.items()
        if seconds / whole >= 0.005
    )
    print(f"own time by package ({whole:.2f} s profiled): {shares}\n", flush=True)


def print_top(rows: list[dict[str, Any]], title: str) -> None:
    """Print rows from :func:`top_entries` under ``title``."""
    print(title)
    print(f"  {'calls':>10}  {'tottime s':>9}  {'cumtime s':>9}  function")
    for row in rows:
        print(
            f"  {row['calls']:>10,}  {row['tottime_s']:>9.3f}  {row['cumtime_s']:>9.3f}  "
            f"{row['function']}"
        )
    print(flush=True)


def _trim(filename: str) -> str:
    """A path from the package name on (``brokerlet/...``, ``gevent/...``)."""
    for prefix in _PREFIXES:
        if filename.startswith(prefix):
            return filename[len(prefix) :]
    return filename


def _package(filename: str) -> str:
    if filename == "~":
        return "built-ins"
    for root in (_SITE_PACKAGES, _REPO):
        if filename.startswith(root):
            return filename[len(root) :].split("/", 1)[0].removesuffix(".py")
    if filename.startswith(_STDLIB) or filename.startswith("<frozen"):
        return "stdlib"
    return "other"
