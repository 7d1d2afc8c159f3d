"""brokerlet's admin endpoint: topic stats over HTTP and as Prometheus metrics.

:class:`AdminServer` serves them on gevent's WSGI server; :class:`StatsCollector` is the
Prometheus collector behind its ``/metrics``, for programs that expose their own registry.
"""

from brokerlet.admin._metrics import AllStats, StatsCollector, TopicStats
from brokerlet.admin.http import AdminServer

__all__ = ["AdminServer", "AllStats", "StatsCollector", "TopicStats"]
