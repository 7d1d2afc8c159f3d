"""One harness for brokerlet's tests, benchmark and load tests.

* :mod:`brokerlet.testing.rawclient`: a raw-socket Pulsar client for tests that control
  every byte.
* :mod:`brokerlet.testing.process`: a broker in a child process of its own
  (:class:`~brokerlet.testing.process.BrokerletProcess`, and the base other brokers and
  probes build on).
* :func:`free_port` and :func:`percentile`: the one way every harness picks a port and ranks
  a latency.

Importing this package pulls in nothing beyond the standard library; the submodules bring
what they need.
"""

from __future__ import annotations

from brokerlet.testing.figures import percentile
from brokerlet.testing.ports import free_port

__all__ = ["free_port", "percentile"]
