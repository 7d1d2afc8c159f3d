"""brokerlet's admin endpoint: topic stats over HTTP and as Prometheus metrics.

:class:`AdminServer` serves them on gevent's WSGI server; :class:`StatsCollector` is the
Prometheus collector behind its ``/metrics``, for programs that expose their own registry.
:class:`AdminClient` (:mod:`brokerlet.admin.client`) is a client for Pulsar's admin API.

The names are imported on first use: the server side (Werkzeug, prometheus_client) and the
client (requests) took about 150 ms of start-up, which a broker without a web service and a
program that only embeds a broker should not pay.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from brokerlet.admin._metrics import AllStats, StatsCollector, TopicStats
    from brokerlet.admin.client import AdminClient, AdminError
    from brokerlet.admin.http import AdminServer

__all__ = ["AdminClient", "AdminError", "AdminServer", "AllStats", "StatsCollector", "TopicStats"]

_HOMES = {
    "AdminClient": "brokerlet.admin.client",
    "AdminError": "brokerlet.admin.client",
    "AdminServer": "brokerlet.admin.http",
    "AllStats": "brokerlet.admin._metrics",
    "StatsCollector": "brokerlet.admin._metrics",
    "TopicStats": "brokerlet.admin._metrics",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
