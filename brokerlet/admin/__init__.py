"""brokerlet's admin endpoint: topic stats over HTTP and as Prometheus metrics.

:class:`AdminServer` serves them on gevent's WSGI server; :class:`StatsCollector` is the
Prometheus collector behind its ``/metrics``, for programs that expose their own registry.
:class:`AdminClient` (:mod:`brokerlet.admin.client`) is a client for Pulsar's admin API.
"""

from brokerlet.admin._metrics import AllStats, StatsCollector, TopicStats
from brokerlet.admin.client import AdminClient, AdminError
from brokerlet.admin.http import AdminServer

__all__ = ["AdminClient", "AdminError", "AdminServer", "AllStats", "StatsCollector", "TopicStats"]
