"""Sampling the broker under load with py-spy, and reading the samples.

``py-spy record --format raw`` writes collapsed stacks: one line per distinct stack,
``frame;frame;...;leaf count``, outermost frame first, each frame ``function (file:line)``.
Idle samples (the hub waiting in epoll) are left out by py-spy, so the counts are CPU.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

__all__ = ["Profiler", "top_functions"]

_FRAME = re.compile(r"^(?P<function>.*?) \((?P<file>[^:()]*)(?::\d+)?\)$")
_SAMPLE_RATE = 200


class Profiler:
    """``py-spy record`` attached to a running process until :meth:`stop`.

    Args:
        pid: the process to sample.
        output: where to write the collapsed stacks.
    """

    def __init__(self, pid: int, output: Path) -> None:
        self.output = output
        # py-spy installs next to the virtualenv's python, which need not be on PATH.
        beside_python = Path(sys.executable).parent / "py-spy"
        executable = str(beside_python) if beside_python.exists() else shutil.which("py-spy")
        if executable is None:
            raise RuntimeError("py-spy is not installed (pip install py-spy)")
        self._process = subprocess.Popen(
            [executable, "record", "--pid", str(pid), "--format", "raw", "--rate",
             str(_SAMPLE_RATE), "--output", str(output), "--nonblocking"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True,
        )

    def stop(self, timeout: float = 30.0) -> str:
        """Stop sampling (py-spy writes its file on SIGINT); return py-spy's error output."""
        process = self._process
        if process.poll() is None:
            process.send_signal(2)
        try:
            _, errors = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            _, errors = process.communicate()
        return errors or ""


def _function(frame: str) -> str:
    match = _FRAME.match(frame.strip())
    if match is None:
        return frame.strip()
    path = match.group("file")
    for marker in ("site-packages/", "brokerlet/", "python3.11/"):
        if marker in path:
            path = (marker if marker == "brokerlet/" else "") + path.split(marker, 1)[1]
            break
    return f"{match.group('function')} ({path})"


def top_functions(
    collapsed: Path, limit: int = 15, *, by: str = "own"
) -> tuple[int, list[tuple[str, float, float]]]:
    """The functions with the most samples in a py-spy raw file.

    Args:
        collapsed: the file py-spy wrote.
        limit: rows to return.
        by: ``"own"`` (samples where the function was running) or ``"inclusive"`` (samples
            where it was anywhere on the stack).

    Returns:
        The total number of samples, and up to ``limit`` rows of
        ``(function (file), own share, inclusive share)``, largest first.
    """
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_function(frame) for frame in stack.split(";")]
        total += count
        own[frames[-1]] += count
        for function in set(frames):
            inclusive[function] += count
    if not total:
        return 0, []
    ranking = own if by == "own" else inclusive
    rows = [(name, own[name] / total, inclusive[name] / total)
            for name, _ in ranking.most_common(limit)]
    return total, rows
