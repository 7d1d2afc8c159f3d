"""Advertised listeners: Pulsar's ``advertisedListeners`` list and lookups by listener name.

The setting is ``name:pulsar://host:port[,name:pulsar+ssl://host:port,...]``; one name may
have one ``pulsar://`` and one ``pulsar+ssl://`` URL. A lookup naming a listener answers its
URLs; one naming an unknown listener fails as Pulsar's ``NamespaceService`` fails it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from brokerlet.config import SettingsError

__all__ = ["Listener", "UnknownListener", "parse_listeners", "pick_listener"]

_SCHEMES: Final = ("pulsar", "pulsar+ssl")


class UnknownListener(LookupError):  # noqa: N818
    """A lookup named a listener this broker does not advertise."""

    def __init__(self, name: str) -> None:
        # NamespaceService#createLookupResult's wording.
        super().__init__(f"the broker do not have {name} listener")


@dataclass(frozen=True, slots=True)
class Listener:
    name: str
    service_url: str | None = None  # pulsar://
    service_url_tls: str | None = None  # pulsar+ssl://


def parse_listeners(text: str) -> dict[str, Listener]:
    """The listeners of an ``advertisedListeners`` value, in the order given.

    Raises:
        SettingsError: naming ``advertised_listeners``, the bad item and the format.
    """
    listeners: dict[str, Listener] = {}
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        name, sep, url = item.partition(":")
        parts = urlsplit(url)
        if not sep or not name or parts.scheme not in _SCHEMES or not parts.hostname:
            raise SettingsError(
                f"advertised_listeners = {text!r}: item {item!r} must be "
                "name:pulsar://host:port or name:pulsar+ssl://host:port",
                key="advertised_listeners",
            )
        try:
            port = parts.port
        except ValueError:
            port = None
        if port is None:
            raise SettingsError(
                f"advertised_listeners = {text!r}: item {item!r} needs a port",
                key="advertised_listeners",
            )
        known = listeners.get(name, Listener(name))
        tls = parts.scheme == "pulsar+ssl"
        if (known.service_url_tls if tls else known.service_url) is not None:
            raise SettingsError(
                f"advertised_listeners = {text!r}: listener {name!r} has two "
                f"{parts.scheme}:// URLs",
                key="advertised_listeners",
            )
        if tls:
            listeners[name] = Listener(name, known.service_url, url)
        else:
            listeners[name] = Listener(name, url, known.service_url_tls)
    return listeners


def pick_listener(
    listeners: dict[str, Listener], requested: str | None, internal: str = ""
) -> Listener | None:
    """The listener a lookup answers: the one named, else the internal one (or the first).

    Returns None when no listeners are configured (the broker's own URL is answered).

    Raises:
        UnknownListener: ``requested`` names no configured listener.
    """
    if requested:
        listener = listeners.get(requested)
        if listener is None:
            raise UnknownListener(requested)
        return listener
    if not listeners:
        return None
    if internal and internal in listeners:
        return listeners[internal]
    return next(iter(listeners.values()))
