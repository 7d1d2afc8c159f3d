"""A broker in a child process of its own: spawn it, wait until it is ready, measure it, stop it.

:class:`ChildBroker` is the base every such harness shares (the bench's brokers, its stall
probe, the load tests' brokerlet and pulsar-lite): a fresh scratch directory, the child's
stderr (and its stdout, unless the harness reads it) in ``broker.log`` there, CPU and memory
figures, and a stop that interrupts, then kills. :class:`BrokerletProcess` runs
``python -m brokerlet serve`` and takes its address from the ready line.

These classes work with or without gevent's monkey patching (the load generator runs
patched).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Self

from brokerlet.testing.ports import free_port

__all__ = ["READY_LINE", "BrokerletProcess", "ChildBroker", "brokerlet_command"]

READY_LINE = re.compile(r"brokerlet ready on (pulsar://\S+)")
"""What ``brokerlet serve`` prints on stdout once it accepts connections."""


class ChildBroker:
    """A broker program as a child process. Subclasses say how to run it and when it is ready.

    Used as a context manager it stops the child and removes its directory on leaving; it
    does not start it.

    Attributes:
        name: what runs, for reports.
        directory: the child's scratch directory (its log, and its data unless told
            otherwise); removed by :meth:`close`.
        service_url: the ``pulsar://`` address, once ready.
        spawned_at: ``perf_counter`` time of the spawn.
        ready_at: ``perf_counter`` time the child was seen ready.
    """

    name = "broker"
    stop_signal = signal.SIGINT
    """How :meth:`stop` asks the child to end (SIGINT lets a cProfile run write its file)."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix=f"brokerlet-testing-{self.name}-"))
        self.service_url = ""
        self.spawned_at: float | None = None
        self.ready_at: float | None = None
        self._process: subprocess.Popen[str] | None = None
        self._log: IO[str] | None = None
        self._psutil: Any = None

    # -- lifecycle -----------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> Self:
        """Start the child and wait until it accepts connections.

        Raises:
            RuntimeError: it exited or did not become ready within ``timeout`` seconds.
        """
        raise NotImplementedError

    def _spawn(
        self,
        command: Sequence[str],
        *,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        stdin: int = subprocess.DEVNULL,
        stdout: int | None = None,
    ) -> subprocess.Popen[str]:
        """Run ``command``; its stderr, and its stdout unless ``stdout`` says otherwise, go to
        ``broker.log`` in :attr:`directory`."""
        if self._process is not None:
            raise RuntimeError(f"{self.name} already spawned")
        # Closed in close(): errors quote it after the process is gone.
        self._log = open(self.directory / "broker.log", "w+")  # noqa: SIM115
        self.spawned_at = time.perf_counter()
        self._process = subprocess.Popen(
            list(command),
            cwd=cwd if cwd is not None else self.directory,
            env=dict(env) if env is not None else None,
            stdin=stdin,
            stdout=self._log if stdout is None else stdout,
            stderr=self._log,
            text=True,
        )
        return self._process

    def _follow_stdout(self, on_line: Callable[[str], None], done: threading.Event) -> None:
        """Feed every stdout line to ``on_line`` on a thread; set ``done`` at its end.

        Reading to the end means the child can never block on a full pipe.
        """
        stdout = self._running().stdout
        if stdout is None:
            raise RuntimeError("stdout is not a pipe")

        def follow() -> None:
            for line in stdout:
                on_line(line)
            done.set()

        threading.Thread(target=follow, name=f"{self.name}-stdout", daemon=True).start()

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self._running().pid

    def alive(self) -> bool:
        """Whether the child has been spawned and is still running."""
        return self._process is not None and self._process.poll() is None

    def exited(self) -> bool:
        """Whether the spawned child has ended."""
        return self._running().poll() is not None

    def stop(self, timeout: float = 30.0) -> int | None:
        """Ask the child to end (:attr:`stop_signal`), kill it after ``timeout`` seconds.

        Returns:
            The exit code, or None if it had to be killed or never started.
        """
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(self.stop_signal)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                return None
        return process.returncode

    def kill(self) -> None:
        """SIGKILL the child and reap it: a crash, as far as the child can tell."""
        process = self._running()
        process.kill()
        process.wait()

    def close(self) -> None:
        """Stop the child, close its log and remove its directory."""
        self.stop()
        if self._log is not None:
            self._log.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _running(self) -> subprocess.Popen[str]:
        if self._process is None:
            raise RuntimeError(f"{self.name} not spawned")
        return self._process

    # -- figures -------------------------------------------------------------------------

    def cpu_seconds(self) -> float:
        """User plus system CPU seconds the child used so far (all of its threads)."""
        process = self._ps()
        if process is None:
            return 0.0
        try:
            times = process.cpu_times()
        except Exception:  # psutil.Error: the child is gone
            return 0.0
        return float(times.user + times.system)

    def rss_bytes(self) -> int:
        """The child's resident memory, in bytes (0 once it is gone)."""
        process = self._ps()
        if process is None:
            return 0
        try:
            return int(process.memory_info().rss)
        except Exception:  # psutil.Error: the child is gone
            return 0

    def _ps(self) -> Any:
        # psutil is a development dependency only; brokerlet itself runs without it.
        if self._psutil is None and self._process is not None:
            import psutil  # noqa: PLC0415

            self._psutil = psutil.Process(self._process.pid)
        return self._psutil

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the child's log, for error messages."""
        if self._log is None or self._log.closed:
            path = self.directory / "broker.log"
            text = path.read_text() if path.exists() else ""
        else:
            self._log.flush()
            self._log.seek(0)
            text = self._log.read()
        return "".join(text.splitlines(keepends=True)[-lines:])

    def describe(self) -> dict[str, object]:
        """What ran, for a report."""
        return {"name": self.name, "service_url": self.service_url}


# Off by default: the bench measures the Pulsar listener alone, and WARNING keeps
# per-connection log lines out of throughput and memory figures.
_QUIET = ("--log-level", "WARNING")


def brokerlet_command(
    port: int = 0,
    *,
    web_port: int | None = None,
    data_dir: str | Path | None = None,
    profile_path: Path | None = None,
    flags: Sequence[str] = (),
) -> list[str]:
    """The command line of ``python -m brokerlet serve`` on loopback, at log level WARNING.

    Args:
        port: the Pulsar port; 0 lets the broker pick.
        web_port: the admin HTTP port; None turns the web service off.
        data_dir: the ``--data-dir``; None passes none.
        profile_path: run under cProfile, writing the profile there when the broker stops.
        flags: more ``serve`` flags (``--storage memory``, ``--sync-policy interval``, ...).
    """
    python = [sys.executable]
    if profile_path is not None:
        python += ["-m", "cProfile", "-o", str(profile_path)]
    web = (
        ["--web-service-port", str(web_port)]
        if web_port is not None
        else ["--web-service-enabled", "false"]
    )
    data = ["--data-dir", str(data_dir)] if data_dir is not None else []
    return [*python, "-m", "brokerlet", "serve", "--port", str(port), *web, *_QUIET, *data, *flags]


class BrokerletProcess(ChildBroker):
    """``python -m brokerlet serve`` as a child process, ready once it prints its ready line.

    Each broker stores its topics in a data directory of its own (inside :attr:`directory`
    unless ``data_dir`` names one that outlives it, to restart a broker on the same data),
    so a run never recovers another run's topics nor writes into the repository.

    Args:
        flags: more ``serve`` flags, such as ``("--storage", "memory")``.
        port: the port to ask for; 0 lets the broker pick (read back from its ready line).
        web_service: run the admin HTTP service on a free port (:attr:`stats_url`).
        data_dir: the data directory; None makes one inside :attr:`directory`.
        profile_path: run the broker under cProfile, writing the profile there on stop.
        source: run brokerlet from this source tree instead of the installed one (to
            compare two versions, say).
    """

    name = "brokerlet"

    def __init__(
        self,
        flags: Sequence[str] = (),
        *,
        port: int = 0,
        web_service: bool = False,
        data_dir: Path | None = None,
        profile_path: Path | None = None,
        source: Path | None = None,
    ) -> None:
        super().__init__()
        self.flags = list(flags)
        self.data_dir = data_dir if data_dir is not None else self.directory / "data"
        self.profile_path = profile_path
        self.source = source
        # Both ports are chosen here when the web service runs: at WARNING the broker does
        # not log its stats URL, and with --port 0 it also picks an ephemeral web port.
        self._web_port = free_port() if web_service else None
        if self._web_port is not None and port == 0:
            port = free_port()
        self.stats_url = f"http://127.0.0.1:{self._web_port}" if self._web_port else ""
        self.command = brokerlet_command(
            port,
            web_port=self._web_port,
            data_dir=self.data_dir,
            profile_path=profile_path,
            flags=self.flags,
        )
        self._ready = threading.Event()

    @property
    def port(self) -> int:
        """The port the broker listens on, from its ready line."""
        if not self.service_url:
            raise RuntimeError("broker not ready")
        return int(self.service_url.rsplit(":", 1)[1])

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` of the Pulsar listener, for raw-socket clients."""
        host = self.service_url.removeprefix("pulsar://").rsplit(":", 1)[0]
        return host, self.port

    def spawn(self) -> float:
        """Start the process without waiting; return the ``perf_counter`` time of the spawn."""
        env = dict(os.environ)
        if self.source is not None:
            env["PYTHONPATH"] = os.pathsep.join(
                [str(self.source.resolve()), env.get("PYTHONPATH", "")]
            ).rstrip(os.pathsep)
        self._spawn(self.command, env=env, stdout=subprocess.PIPE)
        self._follow_stdout(self._on_line, self._ready)
        assert self.spawned_at is not None
        return self.spawned_at

    def wait_ready(self, timeout: float = 30.0) -> str:
        """Wait for the ready line; return the service URL.

        Raises:
            RuntimeError: the broker exited or stayed silent for ``timeout`` seconds.
        """
        if not self._ready.wait(timeout) or not self.service_url:
            self.stop()
            raise RuntimeError(f"brokerlet did not become ready:\n{self.log_tail()}")
        return self.service_url

    def start(self, timeout: float = 30.0) -> Self:
        self.spawn()
        self.wait_ready(timeout)
        return self

    def _on_line(self, line: str) -> None:
        match = READY_LINE.search(line)
        if match and not self._ready.is_set():
            self.ready_at = time.perf_counter()
            self.service_url = match.group(1)
            self._ready.set()

    def describe(self) -> dict[str, object]:
        return {
            **super().describe(),
            "stats_url": self.stats_url,
            "flags": self.flags,
            "source": str(self.source) if self.source else "installed",
        }
