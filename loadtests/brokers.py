"""Brokers under test, each in a process of its own on loopback ephemeral ports.

Both build on :class:`brokerlet.testing.process.ChildBroker`, the harness the tests and the
bench share:

* :class:`BrokerletProcess` runs ``python -m brokerlet serve``; its topic stats come from the
  admin endpoint ``/admin/v2/persistent/public/default/<topic>/stats``.
* :class:`PulsarLiteProcess` runs the ``pulsar-lite`` binary that the pulsar-lite package
  ships (found with the package's own ``binary_finder``), in a temporary directory; its
  stats come from its Prometheus endpoint, mapped onto the same field names.

pulsar-lite's ``start_broker()`` is not used: it takes ports from 6650 upwards rather than an
ephemeral one, leaves its metrics endpoint on ``0.0.0.0:8080``, appends to
``/tmp/pulsar-lite.log`` and hides the process id that CPU accounting needs.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Self

from brokerlet.testing import free_port
from brokerlet.testing import process as harness

__all__ = [
    "BROKERS",
    "BrokerProcess",
    "BrokerletProcess",
    "PulsarLiteProcess",
    "make_broker",
]

_STATS_TIMEOUT = 2.0


class BrokerProcess(harness.ChildBroker):
    """A broker child process that can also report a topic's stats in Pulsar's shape."""

    def topic_stats(self, topic: str) -> dict[str, Any] | None:
        """The topic's stats in Pulsar's shape (see :func:`normalize_stats`), or None."""
        raise NotImplementedError


class BrokerletProcess(harness.BrokerletProcess, BrokerProcess):
    """``python -m brokerlet serve`` on ephemeral ports with its admin service, at WARNING.

    Args:
        extra_args: more ``serve`` flags (``--storage disk``, ``--event-loops 2``, ...).
        source: run brokerlet from this source tree instead of the installed one.
    """

    def __init__(self, extra_args: list[str] | None = None, source: Path | None = None) -> None:
        super().__init__(extra_args or (), web_service=True, source=source)

    def topic_stats(self, topic: str) -> dict[str, Any] | None:
        url = f"{self.stats_url}/admin/v2/persistent/public/default/{topic}/stats"
        try:
            with urllib.request.urlopen(url, timeout=_STATS_TIMEOUT) as response:
                raw: dict[str, Any] = json.load(response)
        except (OSError, ValueError, urllib.error.URLError):
            return None
        return normalize_stats(raw)


class PulsarLiteProcess(BrokerProcess):
    """pulsar-lite's broker binary on loopback ports in a temporary directory."""

    name = "pulsar-lite"
    stop_signal = signal.SIGTERM

    def __init__(self) -> None:
        super().__init__()
        self.metrics_url = ""

    def start(self, timeout: float = 30.0) -> Self:
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
                self.stop()
                raise RuntimeError(f"pulsar-lite did not become ready:\n{self.log_tail()}")
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
