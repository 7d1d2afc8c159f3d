"""brokerlet: an embeddable Pulsar-compatible broker on Pykka actors and gevent.

``Broker`` runs a broker (embedded, or as ``brokerlet serve``); ``Client`` is brokerlet's
gevent-native Pulsar client, for gevent programs and Locust load tests where the official
C++-based client would block the hub. Its other names (producers, consumers, errors) live in
:mod:`brokerlet.client`.
"""

__version__ = "0.1.0"

# First: the compiled hot modules, when built and current, replace their source (see there).
from brokerlet import _compiled as _compiled
from brokerlet.broker import Broker
from brokerlet.client import Client, ConsumerType, InitialPosition, MessageId
from brokerlet.config import Settings, SettingsError, load_settings

__all__ = [
    "Broker",
    "Client",
    "ConsumerType",
    "InitialPosition",
    "MessageId",
    "Settings",
    "SettingsError",
    "__version__",
    "load_settings",
]
