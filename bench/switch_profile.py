"""Where the broker's hub thread spends its CPU, by kind of greenlet, under a Locust scenario.

``python -m bench.switch_profile [--scenario telemetry-high-rate] [--rate 800] [--duration 35]``

Runs :class:`brokerlet.Broker` in this process (disk storage, sync policy ``never``, as
``make loadtest-compare`` runs it) and ``python -m loadtests run SCENARIO`` against it. After
a warm-up third of the run it traces greenlet switches on the broker's hub for the middle of
the run, and prints per published message: the thread CPU each kind of greenlet ran for
(between the switch into it and the switch out), how many runs that took, how many hub loop
iterations went by and how many of them waited for events, and which messages each kind of
actor handled. Below saturation this says how many steps a message takes and what each
costs; cProfile cannot (it charges a greenlet's waits to whatever it called last).

The tracing itself costs a microsecond or two per switch, so the totals are above the
untraced broker's; compare runs of this tool with each other. Prints figures, never asserts.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
import time
from typing import Any

import gevent
import greenlet
import pykka

from bench.stall_probe import greenlet_kind
from brokerlet import Broker
from brokerlet.cli import settle_heap

__all__ = ["main"]

_IDLE_WAIT_S = 20e-6  # a loop iteration that took longer between prepare and check polled


class SwitchProfile:
    """Counters filled on the broker's hub while ``on`` is set."""

    def __init__(self) -> None:
        self.on = False
        self.cpu: dict[str, float] = collections.defaultdict(float)
        self.runs: collections.Counter[str] = collections.Counter()
        self.handled: collections.Counter[tuple[str, str]] = collections.Counter()
        self.iterations = 0
        self.waits = 0
        self._since = time.thread_time()
        self._prepared = 0.0
        self._watchers: list[Any] = []

    def trace(self, event: str, args: tuple[Any, Any]) -> None:
        if event not in ("switch", "throw"):
            return
        now = time.thread_time()
        if self.on:
            kind = greenlet_kind(args[0])
            self.cpu[kind] += now - self._since
            self.runs[kind] += 1
        self._since = now

    def install(self) -> None:
        """On the broker's hub: trace switches, and stamp each loop iteration's poll."""
        greenlet.settrace(self.trace)
        loop = gevent.get_hub().loop
        prepare, check = loop.prepare(), loop.check()
        prepare.start(self._on_prepare)
        check.start(self._on_check)
        self._watchers = [prepare, check]
        original = pykka.Actor._handle_receive

        def counting(actor: pykka.Actor, message: Any) -> Any:
            if self.on:
                self.handled[(type(actor).__name__, type(message).__name__)] += 1
            return original(actor, message)

        pykka.Actor._handle_receive = counting  # type: ignore[method-assign,assignment]

    def _on_prepare(self) -> None:
        self._prepared = time.perf_counter()

    def _on_check(self) -> None:
        if self.on:
            self.iterations += 1
            if time.perf_counter() - self._prepared > _IDLE_WAIT_S:
                self.waits += 1


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.switch_profile")
    parser.add_argument("--scenario", default="telemetry-high-rate")
    parser.add_argument("--rate", type=float, default=800, help="aggregate publish rate, msg/s")
    parser.add_argument("--duration", type=float, default=35, help="seconds of publishing")
    args = parser.parse_args()
    profile = SwitchProfile()
    with tempfile.TemporaryDirectory(prefix="switch-profile-") as data_dir:
        broker = Broker(
            port=0,
            storage="disk",
            data_dir=data_dir,
            sync_policy="never",
            web_service_enabled=False,
        ).start()
        settle_heap()  # as `brokerlet serve` does once it is ready
        broker._hub.loop.run_callback_threadsafe(profile.install)
        command = [
            sys.executable,
            "-m",
            "loadtests",
            "run",
            args.scenario,
            "--rate",
            str(args.rate),
            "--duration",
            str(args.duration),
            "--service-url",
            broker.service_url,
            "--quiet",
            "--output",
            f"{data_dir}/run",
        ]
        load = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        try:
            time.sleep(args.duration / 3)  # set-up and warm-up stay out of the window
            profile.on = True
            started, cpu_started = time.monotonic(), time.process_time()
            time.sleep(args.duration / 3)
            profile.on = False
            window, cpu = time.monotonic() - started, time.process_time() - cpu_started
            load.wait(timeout=args.duration + 120)
        finally:
            if load.poll() is None:
                load.kill()
            broker.stop()
    published = args.rate * window
    per = 1e6 / published
    print(
        f"{args.scenario} at {args.rate:.0f} msg/s, {window:.1f} s traced: process CPU "
        f"{cpu * per:.0f} µs per published message; {sum(profile.runs.values()) / published:.1f} "
        f"greenlet runs, {profile.iterations / published:.2f} hub loop iterations "
        f"({profile.waits / published:.2f} of them waited for events)"
    )
    print("µs CPU per published message, runs, kind of greenlet:")
    for kind, seconds in sorted(profile.cpu.items(), key=lambda item: -item[1]):
        print(f"  {seconds * per:8.1f}  {profile.runs[kind] / published:6.2f}  {kind}")
    print("messages handled per published message:")
    for (actor, message), count in profile.handled.most_common(20):
        print(f"  {count / published:6.2f}  {actor} <- {message}")


if __name__ == "__main__":
    main()
