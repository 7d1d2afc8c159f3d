"""Counting the lines of Python a broker child runs, per function, over a measured window.

Callgrind counts instructions; this says which Python they belong to. The child runs
``brokerlet`` with a trace function on every thread (``sys.settrace`` for the hub's thread and
its greenlets, ``threading.settrace`` for the storage threads) that counts, per code object,
the lines run and the calls made. ``SIGUSR1`` writes the counts since the previous signal to
``OUT.1``, ``OUT.2``, ... and starts a new window; the counts since the last one go to ``OUT``
when the child exits. Tracing makes the broker several times slower, so read the counts and
never the times.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

from brokerlet._compiled import PURE_PYTHON_VARIABLE
from brokerlet.testing.process import BrokerletProcess

__all__ = ["LineCounts", "TracedBroker", "main"]

_ROOT = Path(__file__).resolve().parents[1]


class LineCounts:
    """What a window counted: ``(lines, calls)`` per ``"file:line(function)"``."""

    def __init__(self, functions: dict[str, tuple[int, int]]) -> None:
        self.functions = functions

    @classmethod
    def read(cls, path: Path) -> LineCounts:
        return cls({name: (lines, calls) for name, lines, calls in json.loads(path.read_text())})

    def __sub__(self, other: LineCounts) -> LineCounts:
        before = other.functions
        difference = {}
        for name, (lines, calls) in self.functions.items():
            lines_before, calls_before = before.get(name, (0, 0))
            difference[name] = (lines - lines_before, calls - calls_before)
        return LineCounts(difference)

    @property
    def lines(self) -> int:
        return sum(lines for lines, _calls in self.functions.values())

    @property
    def calls(self) -> int:
        return sum(calls for _lines, calls in self.functions.values())

    def report(self, per: int, top: int = 25) -> str:
        """The totals and the ``top`` functions by lines, each divided by ``per``."""
        rows = [f"{self.lines / per:,.1f} lines and {self.calls / per:,.1f} calls of Python each"]
        ranked = sorted(self.functions.items(), key=lambda item: -item[1][0])
        for name, (lines, calls) in ranked[:top]:
            rows.append(f"  {lines / per:8.1f} lines {calls / per:6.1f} calls  {_short(name)}")
        return "\n".join(rows)


def _short(name: str) -> str:
    """``name`` with the site-packages or source-tree prefix of its file dropped."""
    for marker in ("site-packages/", "/brokerlet/", "/bench/"):
        at = name.find(marker)
        if at >= 0:
            return name[at + len(marker) :] if marker == "site-packages/" else name[at + 1 :]
    return name


class TracedBroker(BrokerletProcess):
    """A broker child under the line tracer. ``cpu_seconds()`` closes a window (and returns
    0), so a micro-benchmark's measurement is exactly the newest window; `window` reads it."""

    def __init__(self, flags: list[str], out: Path, *, source: Path | None = None) -> None:
        super().__init__(flags, source=source)
        self.out = out
        self._windows = 0
        # Appended, so a --source tree's brokerlet still comes first on the path. Compiled
        # modules run no lines to count: every module runs from source here.
        bootstrap = (
            f"import os; os.environ[{PURE_PYTHON_VARIABLE!r}] = '1'; "
            f"import sys; sys.path.append({str(_ROOT)!r}); from bench.linetrace import main; main()"
        )
        python, _m, _brokerlet, *rest = self.command
        self.command = [python, "-c", bootstrap, str(out), *rest]

    def cpu_seconds(self) -> float:
        self._windows += 1
        dump = self.window_path(self._windows)
        os.kill(self.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 60
        while not dump.exists():  # written whole, then renamed into place
            if time.monotonic() > deadline or self.exited():
                raise RuntimeError(f"the traced broker wrote no {dump}:\n{self.log_tail()}")
            time.sleep(0.01)
        return 0.0

    def window_path(self, number: int) -> Path:
        return self.out.with_name(f"{self.out.name}.{number}")

    def window(self) -> LineCounts:
        """The newest window's counts."""
        return LineCounts.read(self.window_path(self._windows))


class _Tracer:
    def __init__(self) -> None:
        self.lines: Counter[CodeType] = Counter()
        self.calls: Counter[CodeType] = Counter()

    def on_call(self, frame: FrameType, _event: str, _arg: Any) -> Any:
        self.calls[frame.f_code] += 1
        return self.on_line

    def on_line(self, frame: FrameType, event: str, _arg: Any) -> Any:
        if event == "line":
            self.lines[frame.f_code] += 1
        return self.on_line

    def dump(self, path: Path) -> None:
        lines, calls = self.lines, self.calls
        self.lines, self.calls = Counter(), Counter()
        rows = [
            [f"{code.co_filename}:{code.co_firstlineno}({code.co_name})", lines[code], calls[code]]
            for code in lines.keys() | calls.keys()
        ]
        partial = path.with_name(path.name + ".part")
        partial.write_text(json.dumps(rows))
        partial.rename(path)


def main() -> None:
    """The child: ``python -c <bootstrap> OUT serve ...`` runs ``brokerlet serve ...`` traced."""
    out = Path(sys.argv[1])
    sys.argv = ["brokerlet", *sys.argv[2:]]
    tracer = _Tracer()
    windows = 0

    def close_window(_signum: int, _frame: object) -> None:
        nonlocal windows
        windows += 1
        tracer.dump(out.with_name(f"{out.name}.{windows}"))

    signal.signal(signal.SIGUSR1, close_window)
    atexit.register(tracer.dump, out)
    threading.settrace(tracer.on_call)
    sys.settrace(tracer.on_call)
    runpy.run_module("brokerlet", run_name="__main__", alter_sys=True)
