"""The storage section: produce rate and receipt latency per storage back-end, and hub stalls.

Four ``brokerlet serve`` brokers run side by side for the whole section, one per back-end
(``--storage memory`` and ``--storage disk`` with each ``--sync-policy``), each with a fresh
data directory. The produce runs go round the four in turn, so load from elsewhere on the
machine falls on all of them alike; each disk figure is compared with the memory run of the
same round.

The stall figures come from :mod:`bench.stall_probe`: a broker started in-process in a
subprocess of its own, with a ticker on its hub, loaded by the same producer processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Self

import psutil

from bench.clients.produce import LATENCY_EVERY, ProduceResult, run_produce_once
from bench.clients.workers import STOP_GRACE
from bench.plan import Plan, SectionResult, run_timeout
from bench.report import Row, StealMeter, Summary, format_rate, judge, latency_row, succeeded
from bench.stall_probe import READY_PREFIX, RUN_LIMIT_MS
from brokerlet.testing.process import BrokerletProcess, ChildBroker

__all__ = [
    "BACKENDS",
    "EVERY_BATCH_TARGET",
    "STALL_TARGET_MS",
    "StallProbeProcess",
    "measure_storage",
    "run_storage",
    "storage_flags",
]

BACKENDS = ("memory", "every_batch", "interval", "never")
EVERY_BATCH_TARGET = 0.70  # of the memory back-end's produce rate
STALL_TARGET_MS = 5.0
RUN_TARGET_MS = RUN_LIMIT_MS  # issue 19: the longest one greenlet may run without yielding
LOAD_NICE = 10  # niceness of the producer processes in the extra stall run
NICED = "+niced"  # suffix of that run's key in the stall figures
_PROBE_READY_TIMEOUT = 30.0
_REPO_ROOT = Path(__file__).resolve().parents[2]


def storage_flags(backend: str) -> list[str]:
    """The ``brokerlet serve`` flags for a back-end of :data:`BACKENDS`."""
    if backend == "memory":
        return ["--storage", "memory"]
    return ["--storage", "disk", "--sync-policy", backend]


def backend_label(backend: str) -> str:
    return "memory" if backend == "memory" else f"disk {backend}"


def run_storage(plan: Plan, producers: int) -> SectionResult:
    """The storage section, as the bench runs it."""
    data, rows, failed = measure_storage(
        plan.storage_rounds,
        plan.storage_messages,
        plan.storage_warmup,
        plan.stall_messages,
        producers,
    )
    return SectionResult(data=data, rows=rows, failed=failed)


def measure_storage(
    rounds: int, messages: int, warmup: int, stall_messages: int, producers: int
) -> tuple[dict[str, Any], list[Row], bool]:
    """Run the section; return its JSON data, its table rows and whether a run failed."""
    data: dict[str, Any] = {
        "messages": messages,
        "rounds": rounds,
        "producers": producers,
        "latency_every": LATENCY_EVERY,
    }
    runs: dict[str, list[ProduceResult]] = {backend: [] for backend in BACKENDS}
    print(
        f"storage: {producers} producer process{'es' if producers != 1 else ''}, unbatched "
        f"128-byte messages, {rounds} round{'s' if rounds != 1 else ''} of {messages:,} per "
        f"back-end, back-ends in turn; one send in {LATENCY_EVERY} timed to its receipt; "
        "brokers: " + ", ".join(" ".join(storage_flags(backend)) for backend in BACKENDS),
        flush=True,
    )
    with ExitStack() as stack:
        brokers: dict[str, tuple[str, psutil.Process]] = {}
        for backend in BACKENDS:
            broker = stack.enter_context(BrokerletProcess(flags=storage_flags(backend)))
            brokers[backend] = (broker.start().service_url, psutil.Process(broker.pid))
        for backend, (url, process) in brokers.items():
            warm = run_produce_once(url, warmup, run_timeout(warmup), process, producers)
            if warm.error is not None:
                print(f"  warm-up of {backend_label(backend)} failed: {warm.error}", flush=True)
        for index in range(rounds):
            for backend, (url, process) in brokers.items():
                result = run_produce_once(url, messages, run_timeout(messages), process, producers)
                runs[backend].append(result)
                print(
                    f"  round {index + 1}/{rounds}, {backend_label(backend)}: {_describe(result)}",
                    flush=True,
                )
    load = os.getloadavg()
    print(f"  load average after the produce runs: {_load(load)}", flush=True)
    data["load_average_after_produce"] = list(load)
    data["produce"] = {backend: _summarise(runs[backend], runs["memory"]) for backend in BACKENDS}
    rows = _produce_rows(runs)
    failed = any(run.error is not None for results in runs.values() for run in results)

    stalls: dict[str, dict[str, Any]] = {}
    print(
        f"storage, event-loop stalls: a 1 ms ticker on an in-process broker's hub "
        f"(bench/stall_probe.py), {stall_messages:,} messages from {producers} producer "
        f"process{'es' if producers != 1 else ''}",
        flush=True,
    )
    for backend in (*BACKENDS[1:], BACKENDS[0]):
        stalls[backend] = _measure_stalls(backend, stall_messages, producers)
        failed |= stalls[backend].get("error") is not None
    # Once more with the producer processes at a lower priority: on two cores shared with
    # the load generators, the OS descheduling the broker is most of every gap above.
    niced = f"every_batch{NICED}"
    stalls[niced] = _measure_stalls("every_batch", stall_messages, producers, nice=LOAD_NICE)
    failed |= stalls[niced].get("error") is not None
    load = os.getloadavg()
    print(f"  load average after the stall runs: {_load(load)}", flush=True)
    data["load_average_after_stalls"] = list(load)
    data["stalls"] = stalls
    rows.extend(_stall_rows(stalls))
    return data, rows, failed


def _describe(result: ProduceResult) -> str:
    text = (
        f"produce {format_rate(result.produce_rate)}, send-to-receipt p50 "
        f"{result.latency_p50_ms:.1f} ms p99 {result.latency_p99_ms:.1f} ms, "
        f"CPU broker {result.broker_cpu:.0%} machine {result.machine_cpu:.0%}"
    )
    return text if result.error is None else f"{text}; FAILED: {result.error}"


def _ratios(results: list[ProduceResult], memory: list[ProduceResult]) -> list[float]:
    """Each round's rate over the memory back-end's rate in the same round."""
    return [
        run.produce_rate / base.produce_rate
        for run, base in zip(results, memory, strict=True)
        if run.error is None and base.error is None and base.produce_rate > 0
    ]


def _summarise(results: list[ProduceResult], memory: list[ProduceResult]) -> dict[str, Any]:
    good = [run for run in results if run.error is None]
    return {
        "runs": [run.__dict__ for run in results],
        "produce_rate": Summary.of([run.produce_rate for run in good]).as_dict(),
        "latency_p50_ms": Summary.of([run.latency_p50_ms for run in good]).as_dict(),
        "latency_p99_ms": Summary.of([run.latency_p99_ms for run in good]).as_dict(),
        "broker_cpu": Summary.of([run.broker_cpu for run in good]).as_dict(),
        "ratio_to_memory": Summary.of(_ratios(results, memory)).as_dict(),
    }


def _produce_rows(runs: dict[str, list[ProduceResult]]) -> list[Row]:
    rows: list[Row] = []
    for backend in BACKENDS:
        results = runs[backend]
        good, failures, note = succeeded(results)
        produce = Summary.of([run.produce_rate for run in good])
        label = backend_label(backend)
        spread = f"{produce.low:,.0f}-{produce.high:,.0f}" if good else ""
        if backend == "memory":
            rows.append(
                Row(
                    f"produce, storage {label}",
                    format_rate(produce.median),
                    spread + note,
                    "reference",
                    "FAILED" if failures else "",
                )
            )
        else:
            ratio = Summary.of(_ratios(results, runs["memory"]))
            spread += f"; {ratio.median:.0%} of memory ({ratio.low:.0%}-{ratio.high:.0%})"
            target, status = "", "FAILED" if failures else ""
            if backend == "every_batch":
                target = f">= {EVERY_BATCH_TARGET:.0%} of memory"
                status = status or judge(ratio.median, at_least=EVERY_BATCH_TARGET)
            rows.append(
                Row(
                    f"produce, storage {label}",
                    format_rate(produce.median),
                    spread + note,
                    target,
                    status,
                )
            )
        rows.append(latency_row(f"  send-to-receipt p50 / p99, {label}", good))
    return rows


def _stall_label(key: str) -> str:
    backend, niced, _ = key.partition(NICED)
    return backend_label(backend) + (f", producers at nice {LOAD_NICE}" if niced else "")


def _measure_stalls(backend: str, messages: int, producers: int, nice: int = 0) -> dict[str, Any]:
    """Load a stall probe of one back-end with a produce run; its figures and the run's."""
    label = _stall_label(backend + (NICED if nice else ""))
    steal = StealMeter()

    def started() -> None:
        probe.reset()
        steal.start()

    try:
        with StallProbeProcess(backend) as probe:
            result = run_produce_once(
                probe.service_url,
                messages,
                run_timeout(messages),
                psutil.Process(probe.pid),
                producers,
                on_start=started,
                nice=nice,
            )
            figures = probe.report()
            figures["steal_share"] = steal.share()
    except (OSError, RuntimeError, ValueError) as error:
        print(f"  {label}: FAILED: {error}", flush=True)
        return {"error": repr(error)}
    figures["run"] = result.__dict__
    figures["error"] = result.error
    if "max_stall_ms" not in figures:
        print(f"  {label}: no tick was recorded; {_describe(result)}", flush=True)
        figures["error"] = figures["error"] or "no tick was recorded"
        return figures
    print(
        f"  {label}: largest stall {figures['max_stall_ms']:.2f} ms (gap "
        f"{figures['max_gap_ms']:.2f} ms; in it the hub's thread ran "
        f"{figures['max_stall_hub_cpu_ms']:.2f} ms, waited for a CPU "
        f"{figures.get('max_stall_run_queue_ms', 0.0):.2f} ms and GC took "
        f"{figures['max_stall_gc_ms']:.2f} ms), largest without GC "
        f"{figures['max_stall_without_gc_ms']:.2f} ms, p99.9 {figures['p999_stall_ms']:.2f} ms, "
        f"{figures['stalls_over_limit']} of {figures['ticks']:,} ticks over "
        f"{STALL_TARGET_MS:.0f} ms; GC {figures['gc_collections']:,} collections, largest "
        f"{figures['max_gc_pause_ms']:.2f} ms (generation "
        f"{figures['max_gc_pause_generation']}); {_describe(result)}",
        flush=True,
    )
    runs = ", ".join(
        f"{name or '?'} {cpu:.2f} ({wall:.2f})"
        for name, (wall, cpu) in figures["longest_runs_ms"].items()
    )
    print(
        f"    hub CPU within a gap: largest {figures['max_gap_hub_cpu_ms']:.2f} ms, p99.9 "
        f"{figures['p999_gap_hub_cpu_ms']:.2f} ms; longest runs without yielding, ms of CPU "
        f"(wall): {runs}; without a collection in it "
        f"{figures.get('max_run_without_gc_cpu_ms', 0.0):.2f} "
        f"({figures.get('max_run_without_gc_kind', '')}; {figures.get('runs_with_gc', 0)} runs "
        f"held one); {_run_spread(figures)}; {_steal(figures)}",
        flush=True,
    )
    for gap in figures.get("busiest_gaps", ()):
        made_of = ", ".join(
            f"{name} {int(count)}x {cpu:.2f}"
            for name, (count, cpu) in sorted(gap["runs"].items(), key=lambda kv: -kv[1][1])
        )
        print(
            f"    a busy gap: {gap['hub_cpu_ms']:.2f} ms of hub CPU in {gap['gap_ms']:.2f} ms: "
            f"{made_of} (runs, ms of CPU)",
            flush=True,
        )
    return figures


def _stall_rows(stalls: dict[str, dict[str, Any]]) -> list[Row]:
    rows = []
    for backend, figures in stalls.items():
        label = _stall_label(backend)
        disk = backend != "memory"
        if "max_stall_ms" not in figures:
            rows.append(Row(f"event-loop stall, {label}", "n/a", "", "", "FAILED"))
            continue
        stall = float(figures["max_stall_ms"])
        spread = (
            f"without GC {figures['max_stall_without_gc_ms']:.1f} ms; "
            f"{figures['stalls_over_limit']}/{figures['ticks']:,} ticks over "
            f"{STALL_TARGET_MS:.0f} ms; GC max {figures['max_gc_pause_ms']:.1f} ms"
        )
        if figures.get("error"):
            status = "FAILED"
        elif disk:
            status = judge(stall, at_most=STALL_TARGET_MS)
        else:
            status = ""
        rows.append(
            Row(
                f"largest event-loop stall, {label}",
                f"{stall:.1f} ms",
                spread,
                f"<= {STALL_TARGET_MS:.0f} ms" if disk else "reference",
                status,
            )
        )
        rows.append(
            Row(
                f"  event-loop stall p99.9, {label}",
                f"{figures['p999_stall_ms']:.1f} ms",
                f"hub CPU in a gap p99.9 {figures['p999_gap_hub_cpu_ms']:.1f} ms, largest "
                f"{figures['max_gap_hub_cpu_ms']:.1f} ms; {_run_queue(figures)}; "
                f"{_steal(figures)}",
                f"<= {STALL_TARGET_MS:.0f} ms" if disk else "reference",
                _judged(figures, disk, float(figures["p999_stall_ms"]), STALL_TARGET_MS),
            )
        )
        slowest = next(iter(figures["longest_runs_ms"]), "")
        rows.append(
            Row(
                f"  longest run without yielding (CPU), {label}",
                f"{figures['max_run_cpu_ms']:.1f} ms",
                f"{slowest}; {figures['max_run_ms']:.1f} ms wall; without a collection in it "
                f"{figures.get('max_run_without_gc_cpu_ms', 0.0):.1f} ms "
                f"({figures.get('max_run_without_gc_kind', '')}); the ticker's longest "
                f"{figures.get('ticker_run_cpu_ms', 0.0):.1f} ms; {_run_spread(figures)}",
                f"<= {RUN_TARGET_MS:.0f} ms" if disk else "reference",
                _judged(figures, disk, float(figures["max_run_cpu_ms"]), RUN_TARGET_MS),
            )
        )
    return rows


def _run_spread(figures: dict[str, Any]) -> str:
    """How many runs were long, and what the machine charges a fixed piece of work: a
    slice that runs too long shows in many runs, the machine's own pauses (charged to
    whichever run they fall in) in a few."""
    return (
        f"{figures.get('runs_over_limit', 0):,} of {figures.get('runs', 0):,} runs over "
        f"{RUN_TARGET_MS:.0f} ms, p99.9 {figures.get('p999_run_cpu_ms', 0.0):.2f} ms; "
        f"a fixed {figures.get('floor_median_ms', 0.0):.2f} ms of work, idle machine: up to "
        f"{figures.get('floor_max_ms', 0.0):.2f} ms, {figures.get('floor_over_limit', 0)} of "
        f"{figures.get('floor_chunks', 0):,} over {RUN_TARGET_MS:.0f} ms"
    )


def _run_queue(figures: dict[str, Any]) -> str:
    """The hub thread's waits for a CPU: the part of a gap the OS's scheduler gave to other
    processes, which no broker change shortens on a saturated machine."""
    return (
        f"waiting for a CPU in a gap p99.9 {figures.get('p999_gap_run_queue_ms', 0.0):.1f} ms; "
        f"stall p99.9 less those waits {figures.get('p999_stall_off_run_queue_ms', 0.0):.1f} ms"
    )


def _steal(figures: dict[str, Any]) -> str:
    """The hypervisor's share of the machine during the run: wall-clock gaps hold it."""
    steal = figures.get("steal_share")
    return "steal n/a" if steal is None else f"steal {steal:.1%} of the machine's CPU time"


def _judged(figures: dict[str, Any], disk: bool, value: float, target: float) -> str:
    if figures.get("error"):
        return "FAILED"
    return judge(value, at_most=target) if disk else ""


def _load(load: tuple[float, float, float]) -> str:
    return " / ".join(f"{value:.2f}" for value in load) + " (1 / 5 / 15 min)"


class StallProbeProcess(ChildBroker):
    """``python -m bench.stall_probe`` for one back-end, driven through its stdin and stdout.

    Used as a context manager: it starts on entering and stops (and deletes its directory)
    on leaving.
    """

    name = "stall-probe"

    def __init__(self, backend: str) -> None:
        super().__init__()
        self.backend = backend
        self.command = [
            sys.executable,
            "-m",
            "bench.stall_probe",
            "--data-dir",
            str(self.directory / "data"),
            *storage_flags(backend),
        ]

    def start(self, timeout: float = _PROBE_READY_TIMEOUT) -> Self:
        # From the repository root, where ``bench`` is importable.
        self._spawn(self.command, cwd=_REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        line = self._read_line(timeout)
        if not line.startswith(READY_PREFIX):
            self.stop()
            raise RuntimeError(f"stall probe did not start: {line!r}\n{self.log_tail()}")
        self.service_url = line[len(READY_PREFIX) :].strip()
        return self

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def stop(self, timeout: float = STOP_GRACE) -> int | None:
        """End of input: the probe stops its broker and exits (killed after ``timeout``)."""
        process = self._process
        if process is None:
            return None
        if process.stdin is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        if process.stdout is not None:
            process.stdout.close()
        return process.returncode

    def reset(self) -> None:
        """Start the probe's window now."""
        self._command("reset")

    def report(self) -> dict[str, Any]:
        """The figures of the window since the last reset."""
        self._command("report")
        figures: dict[str, Any] = json.loads(self._read_line(STOP_GRACE))
        return figures

    def _command(self, command: str) -> None:
        stdin = self._running().stdin
        assert stdin is not None
        stdin.write(command + "\n")
        stdin.flush()

    def _read_line(self, timeout: float) -> str:
        """The probe's next line of output, or an error after ``timeout`` seconds."""
        stdout = self._running().stdout
        assert stdout is not None
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        if not lines or not lines[0]:
            raise RuntimeError(f"no answer from the stall probe:\n{self.log_tail()}")
        return lines[0]
