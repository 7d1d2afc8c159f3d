"""Running a broker child under valgrind's callgrind, and reading what it counted.

Instruction counts repeat to about a per cent where CPU time on a shared VM moves by a
third: the micro-benchmarks' ``--callgrind`` modes compare two trees by them.
"""

from __future__ import annotations

import re
from pathlib import Path

from brokerlet.testing.process import BrokerletProcess

__all__ = ["total_instructions", "under_callgrind"]


def under_callgrind(broker: BrokerletProcess, out: Path) -> None:
    """Make ``broker`` start under callgrind, writing its counts to ``out`` (and a dump asked
    for with ``callgrind_control -d`` to ``out.1``, ``out.2``, ...). Call before starting it."""
    callgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    broker.command = [*callgrind, *broker.command]


def total_instructions(dump: Path) -> int:
    """The instructions a callgrind output file counts (its ``summary:`` line)."""
    found = re.search(r"^summary: (\d+)", dump.read_text(), re.MULTILINE)
    if found is None:
        raise RuntimeError(f"no summary line in {dump}")
    return int(found.group(1))
