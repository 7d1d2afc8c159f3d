"""brokerlet: an embeddable Pulsar-compatible broker on Pykka actors and gevent."""

__version__ = "0.1.0"

from brokerlet.broker import Broker
from brokerlet.config import Settings, SettingsError, load_settings

__all__ = ["Broker", "Settings", "SettingsError", "__version__", "load_settings"]
