"""Brokers under test, each in a process of its own on loopback ephemeral ports.

* :class:`BrokerletProcess` runs ``python -m brokerlet serve``; its topic stats come from the
  admin endpoint ``/admin/v2/persistent/public/default/<topic>/stats``.
* :class:`PulsarLiteProcess` runs the ``pulsar-lite`` binary that the pulsar-lite package
  ships (found with the package's own ``binary_finder``), in a temporary directory; its
  stats come from its Prometheus endpoint, mapped onto the same field names.

pulsar-lite's ``start_broker()`` is not used: it takes ports from 6650 upwards rather than an
ephemeral one, leaves its metrics endpoint on ``0.0.0.0:8080``, appends to
``/tmp/pulsar-lite.log`` and hides the process id that CPU accounting needs.

Both classes work with or without gevent's monkey patching (the load generator runs patched).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import psutil

__all__ = [
    "BROKERS",
    "BrokerProcess",
    "BrokerletProcess",
    "PulsarLiteProcess",
    "free_port",
    "make_broker",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
_READY = re.compile(r"brokerlet ready on (pulsar://\S+)")
_STATS_TIMEOUT = 2.0


def free_port() -> int:
    """A loopback port that was free a moment ago (for programs that cannot take port 0)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class BrokerProcess:
    """A broker child process: start, stats, CPU time, stop. Subclasses say how to run it.

    Used as a context manager it stops the broker (and removes its directory) on leaving.
    """

    name = "broker"

    def __init__(self) -> None:
        self.service_url = ""
        self.directory = Path(tempfile.mkdtemp(prefix=f"loadtest-{self.name}-"))
        self._process: subprocess.Popen[str] | None = None
        self._log: IO[str] | None = None
        self._psutil: psutil.Process | None = None

    # -- lifecycle -----------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> BrokerProcess:
        """Start the broker and wait until it accepts connections.

        Raises:
            RuntimeError: it exited or did not become ready within ``timeout`` seconds.
        """
        raise NotImplementedError

    def _spawn(self, command: list[str], *, env: dict[str, str] | None = None,
               stdout_to_log: bool = True) -> subprocess.Popen[str]:
        # Closed in stop(): errors quote it after the process is gone.
        self._log = open(self.directory / "broker.log", "w+")  # noqa: SIM115
        process = subprocess.Popen(
            command,
            cwd=self.directory,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log if stdout_to_log else subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        self._process = process
        self._psutil = psutil.Process(process.pid)
        return process

    @property
    def pid(self) -> int:
        """The broker's process id."""
        if self._process is None:
            raise RuntimeError("broker not started")
        return self._process.pid

    def alive(self) -> bool:
        """Whether the process is still running."""
        return self._process is not None and self._process.poll() is None

    def cpu_seconds(self) -> float:
        """User plus system CPU seconds the broker used so far (all of its threads)."""
        if self._psutil is None:
            return 0.0
        try:
            times = self._psutil.cpu_times()
        except psutil.Error:
            return 0.0
        return float(times.user + times.system)

    def rss_bytes(self) -> int:
        """The broker's resident memory."""
        if self._psutil is None:
            return 0
        try:
            rss: int = self._psutil.memory_info().rss
        except psutil.Error:
            return 0
        return rss

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the broker's log, for error messages."""
        if self._log is None or self._log.closed:
            path = self.directory / "broker.log"
            text = path.read_text() if path.exists() else ""
        else:
            self._log.flush()
            self._log.seek(0)
            text = self._log.read()
        return "".join(text.splitlines(keepends=True)[-lines:])

    def stop(self, timeout: float = 15.0) -> int | None:
        """Stop the broker (SIGINT, then SIGKILL after ``timeout``) and remove its directory.

        Returns:
            The exit code, or None if it had to be killed or never started.
        """
        process = self._process
        code: int | None = None
        if process is not None:
            if process.poll() is None:
                process.send_signal(self._stop_signal)
                try:
                    process.wait(timeout)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            code = process.returncode
        if self._log is not None:
            self._log.close()
        shutil.rmtree(self.directory, ignore_errors=True)
        return code

    _stop_signal = signal.SIGINT

    def __enter__(self) -> BrokerProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- stats ---------------------------------------------------------------------------

    def topic_stats(self, topic: str) -> dict[str, Any] | None:
        """The topic's stats in Pulsar's shape (see :func:`normalize_stats`), or None."""
        raise NotImplementedError

    def describe(self) -> dict[str, object]:
        """What ran, for the summary."""
        return {"name": self.name, "service_url": self.service_url}


class BrokerletProcess(BrokerProcess):
    """``python -m brokerlet serve`` on ephemeral ports, at log level WARNING.

    Args:
        extra_args: more ``serve`` flags (``--storage disk``, ``--event-loops 2``, ...).
        source: run brokerlet from this source tree instead of the installed one (to compare
            two versions, say).
    """

    name = "brokerlet"

    def __init__(self, extra_args: list[str] | None = None, source: Path | None = None) -> None:
        super().__init__()
        self.extra_args = list(extra_args or [])
        self.source = source
        self.stats_url = ""
        self._ready = threading.Event()

    def start(self, timeout: float = 30.0) -> BrokerletProcess:
        # Both ports are chosen here: at WARNING the broker does not log its stats URL, and
        # with --port 0 it also replaces --web-service-port with an ephemeral port.
        port, web_port = free_port(), free_port()
        command = [
            sys.executable, "-m", "brokerlet", "serve", "--port", str(port),
            "--web-service-port", str(web_port), "--log-level", "WARNING", *self.extra_args,
        ]
        env = dict(os.environ)
        if self.source is not None:
            env["PYTHONPATH"] = os.pathsep.join(
                [str(self.source.resolve()), env.get("PYTHONPATH", "")]
            ).rstrip(os.pathsep)
        process = self._spawn(command, env=env, stdout_to_log=False)
        threading.Thread(target=self._read_stdout, args=(process,), daemon=True,
                         name="brokerlet-stdout").start()
        if not self._ready.wait(timeout) or not self.service_url:
            tail = self.log_tail()
            self.stop()
            raise RuntimeError(f"brokerlet did not become ready:\n{tail}")
        self.stats_url = f"http://127.0.0.1:{web_port}"
        return self

    def _read_stdout(self, process: subprocess.Popen[str]) -> None:
        # Reads to the end, so the broker never blocks on a full pipe.
        assert process.stdout is not None
        for line in process.stdout:
            match = _READY.search(line)
            if match and not self._ready.is_set():
                self.service_url = match.group(1)
                self._ready.set()
        self._ready.set()

    def topic_stats(self, topic: str) -> dict[str, Any] | None:
        url = f"{self.stats_url}/admin/v2/persistent/public/default/{topic}/stats"
        try:
            with urllib.request.urlopen(url, timeout=_STATS_TIMEOUT) as response:
                raw: dict[str, Any] = json.load(response)
        except (OSError, ValueError, urllib.error.URLError):
            return None
        return normalize_stats(raw)

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "stats_url": self.stats_url,
                "extra_args": self.extra_args,
                "source": str(self.source) if self.source else "installed"}


class PulsarLiteProcess(BrokerProcess):
    """pulsar-lite's broker binary on loopback ports in a temporary directory."""

    name = "pulsar-lite"
    _stop_signal = signal.SIGTERM

    def __init__(self) -> None:
        super().__init__()
        self.metrics_url = ""

    def start(self, timeout: float = 30.0) -> PulsarLiteProcess:
        from pulsar_lite.binary_finder import find_pulsar_lite_binary  # noqa: PLC0415

        port, metrics_port = free_port(), free_port()
        config = self.directory / "pulsar-lite.toml"
        # Keep the metrics endpoint on loopback and off the fixed default port 8080.
        config.write_text(f'[metrics]\nenabled = true\naddr = "127.0.0.1:{metrics_port}"\n')
        command = [
            find_pulsar_lite_binary(), "--config", str(config), "--addr", f"127.0.0.1:{port}",
            "--db-path", str(self.directory / "data"), "--log-level", "warn",
        ]
        self._spawn(command)
        deadline = time.monotonic() + timeout
        while not _accepts(port):
            if not self.alive() or time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                raise RuntimeError(f"pulsar-lite did not become ready:\n{tail}")
            time.sleep(0.05)  # polling another program's listener: there is nothing to wait on
        self.service_url = f"pulsar://127.0.0.1:{port}"
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        return self

    def topic_stats(self, topic: str) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=_STATS_TIMEOUT) as response:
                text = response.read().decode()
        except (OSError, urllib.error.URLError):
            return None
        return stats_from_prometheus(text, topic)

    def describe(self) -> dict[str, object]:
        from importlib.metadata import version  # noqa: PLC0415

        return {**super().describe(), "metrics_url": self.metrics_url,
                "version": version("pulsar-lite")}


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
        return True
    return False


def normalize_stats(raw: dict[str, Any]) -> dict[str, Any]:
    """The fields the reports use from a Pulsar-shaped topic stats document.

    Returns:
        ``msgRateIn``, ``msgRateOut``, ``msgInCounter``, and per subscription ``msgBacklog``,
        ``unackedMessages``, ``msgRateOut``, ``consumers``, ``availablePermits`` (summed),
        ``unwritableConsumers`` and ``pendingOutboundBytes`` (the largest of its consumers).
    """
    subscriptions: dict[str, dict[str, Any]] = {}
    for name, sub in (raw.get("subscriptions") or {}).items():
        consumers = sub.get("consumers") or []
        subscriptions[name] = {
            "msgBacklog": sub.get("msgBacklog"),
            "unackedMessages": sub.get("unackedMessages"),
            "msgRateOut": sub.get("msgRateOut"),
            "consumers": len(consumers),
            "availablePermits": sum(c.get("availablePermits", 0) for c in consumers),
            "unwritableConsumers": sum(1 for c in consumers if c.get("writable") is False),
            "pendingOutboundBytes": max(
                (c.get("pendingOutboundBytes", 0) for c in consumers), default=0
            ),
        }
    return {
        "msgRateIn": raw.get("msgRateIn"),
        "msgRateOut": raw.get("msgRateOut"),
        "msgInCounter": raw.get("msgInCounter"),
        "subscriptions": subscriptions,
    }


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}\s+(\S+)')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_SUBSCRIPTION_METRICS = {
    "pulsar_subscription_back_log": "msgBacklog",
    "pulsar_subscription_unacked_messages": "unackedMessages",
    "pulsar_subscription_msg_rate_out": "msgRateOut",
    "pulsar_subscription_consumers_count": "consumers",
}
_TOPIC_METRICS = {
    "pulsar_rate_in": "msgRateIn",
    "pulsar_in_messages_total": "msgInCounter",
}


def stats_from_prometheus(text: str, topic: str) -> dict[str, Any]:
    """Map a Prometheus exposition onto :func:`normalize_stats`' fields for one topic.

    Args:
        text: the exposition.
        topic: the topic's short name (pulsar-lite labels ``topic`` with it and puts
            ``public/default`` in ``namespace``); a fully qualified name also matches.

    Fields the exposition does not carry (permits, writability) are left out.
    """
    wanted = {topic, f"persistent://public/default/{topic}"}
    stats: dict[str, Any] = {"subscriptions": {}}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        metric, labels_text, value_text = match.groups()
        labels = dict(_LABEL.findall(labels_text))
        if labels.get("topic") not in wanted:
            continue
        try:
            value = float(value_text)
        except ValueError:
            continue
        if metric in _TOPIC_METRICS and "subscription" not in labels:
            stats[_TOPIC_METRICS[metric]] = value
        elif metric in _SUBSCRIPTION_METRICS and "subscription" in labels:
            sub = stats["subscriptions"].setdefault(labels["subscription"], {})
            sub[_SUBSCRIPTION_METRICS[metric]] = value
    if "msgRateOut" not in stats and stats["subscriptions"]:
        stats["msgRateOut"] = sum(
            sub.get("msgRateOut", 0.0) for sub in stats["subscriptions"].values()
        )
    return stats


BROKERS = ("brokerlet", "pulsar-lite")


def make_broker(
    name: str, *, brokerlet_args: list[str] | None = None, brokerlet_source: Path | None = None
) -> BrokerProcess:
    """A not yet started broker of kind ``name`` (one of :data:`BROKERS`)."""
    if name == "brokerlet":
        return BrokerletProcess(brokerlet_args, brokerlet_source)
    if name == "pulsar-lite":
        return PulsarLiteProcess()
    raise ValueError(f"unknown broker {name!r}; known: {', '.join(BROKERS)}")
