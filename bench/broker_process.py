"""A broker in a subprocess of its own: spawn it, wait until it is ready, measure it, stop it."""

from __future__ import annotations

import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

import psutil

__all__ = ["REPO_ROOT", "BrokerProcess", "broker_command", "free_port"]

REPO_ROOT = Path(__file__).resolve().parent.parent

# The web service is off so the bench measures the Pulsar listener alone; WARNING keeps
# per-connection log lines out of the throughput and memory figures.
BROKER_FLAGS = ("--web-service-enabled", "false", "--log-level", "WARNING")

_READY = re.compile(r"brokerlet ready on (pulsar://\S+)")


def broker_command(
    port: int,
    profile_path: Path | None = None,
    *,
    data_dir: str | None = None,
    flags: Sequence[str] = (),
) -> list[str]:
    """The command line that runs a broker on ``port``, optionally under cProfile.

    Args:
        port: The port to ask for; 0 lets the broker pick.
        profile_path: Where cProfile writes the profile; None runs without it.
        data_dir: The ``--data-dir`` to pass; None passes none.
        flags: More ``brokerlet serve`` flags (``--storage``, ``--sync-policy``, ...).
    """
    python = [sys.executable]
    if profile_path is not None:
        python += ["-m", "cProfile", "-o", str(profile_path)]
    data = ["--data-dir", data_dir] if data_dir is not None else []
    return [*python, "-m", "brokerlet", "serve", "--port", str(port), *BROKER_FLAGS, *data,
            *flags]


def free_port() -> int:
    """A loopback port that was free a moment ago (the usual small race applies)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class BrokerProcess:
    """``python -m brokerlet serve`` as a child process.

    Used as a context manager, it stops the broker on leaving; it does not start it::

        with BrokerProcess() as broker:
            url = broker.start().service_url

    ``brokerlet serve`` stores topics on disk (in ``./data`` unless told otherwise), so each
    broker gets a fresh temporary data directory of its own, deleted on leaving: a run never
    recovers another run's topics at start-up, nor writes into the repository.

    Args:
        port: Port to ask for; 0 lets the broker pick one (read back from its ready line).
        profile_path: If given, run the broker under cProfile and write the profile there
            when it is stopped.
        flags: More ``brokerlet serve`` flags, such as ``("--storage", "memory")``.
    """

    def __init__(
        self, port: int = 0, profile_path: Path | None = None, flags: Sequence[str] = ()
    ) -> None:
        self.data_dir = tempfile.mkdtemp(prefix="brokerlet-bench-data-")
        self.command = broker_command(port, profile_path, data_dir=self.data_dir, flags=flags)
        self.profile_path = profile_path
        self.spawned_at: float | None = None
        self.ready_at: float | None = None
        self._service_url: str | None = None
        self._process: subprocess.Popen[str] | None = None
        self._stderr: IO[str] | None = None
        self._ready = threading.Event()

    @property
    def pid(self) -> int:
        """Process id of the broker."""
        return self._running().pid

    @property
    def service_url(self) -> str:
        """The ``pulsar://`` URL from the ready line."""
        if self._service_url is None:
            raise RuntimeError("broker not ready")
        return self._service_url

    @property
    def port(self) -> int:
        """The port the broker listens on, from its ready line."""
        return int(self.service_url.rsplit(":", 1)[1])

    def spawn(self) -> float:
        """Start the process without waiting; return the ``perf_counter`` time of the spawn."""
        if self._process is not None:
            raise RuntimeError("broker already spawned")
        # Closed in __exit__: it must outlive this call so errors can quote it.
        self._stderr = tempfile.TemporaryFile(  # noqa: SIM115
            "w+", prefix="brokerlet-bench-", suffix=".err"
        )
        self.spawned_at = time.perf_counter()
        self._process = subprocess.Popen(
            self.command,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        threading.Thread(target=self._read_stdout, name="broker-stdout", daemon=True).start()
        return self.spawned_at

    def wait_ready(self, timeout: float = 30.0) -> str:
        """Wait for the ready line; return the service URL.

        Raises:
            RuntimeError: The broker exited or stayed silent for ``timeout`` seconds.
        """
        if not self._ready.wait(timeout) or self._service_url is None:
            self.stop()
            raise RuntimeError(f"broker did not become ready:\n{self.stderr_tail()}")
        return self.service_url

    def start(self, timeout: float = 30.0) -> BrokerProcess:
        """Spawn and wait until ready."""
        self.spawn()
        self.wait_ready(timeout)
        return self

    def exited(self) -> bool:
        """Whether the process has ended."""
        return self._running().poll() is not None

    def rss(self) -> int:
        """Resident set size of the broker process, in bytes."""
        rss: int = psutil.Process(self.pid).memory_info().rss
        return rss

    def stop(self, timeout: float = 30.0) -> int | None:
        """Interrupt the broker (SIGINT, so a profile gets written) and wait for it.

        Returns:
            The exit code, or None if the broker had to be killed.
        """
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                return None
        return process.returncode

    def stderr_tail(self, lines: int = 20) -> str:
        """The last lines the broker wrote to stderr, for error messages."""
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return "".join(self._stderr.readlines()[-lines:])

    def __enter__(self) -> BrokerProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        if self._stderr is not None:
            self._stderr.close()
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def _running(self) -> subprocess.Popen[str]:
        if self._process is None:
            raise RuntimeError("broker not spawned")
        return self._process

    def _read_stdout(self) -> None:
        # Drains stdout to its end so the broker can never block on a full pipe.
        stdout = self._running().stdout
        assert stdout is not None
        for line in stdout:
            match = _READY.search(line)
            if match and not self._ready.is_set():
                self.ready_at = time.perf_counter()
                self._service_url = match.group(1)
                self._ready.set()
        self._ready.set()
