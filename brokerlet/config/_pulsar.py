"""Reading a Pulsar ``broker.conf`` / ``standalone.conf`` as a settings source.

The file is Java-properties style as Pulsar writes it: ``key=value`` lines, ``#`` and ``!``
comments, blank lines. An empty value means "unset" in Pulsar, so it leaves brokerlet's
default alone. Every key brokerlet knows (by its Pulsar alias or its own name) is applied;
the others are returned so start-up can list them once. A few keys that change what a
client may do and that brokerlet cannot honour stop start-up instead of being ignored.

Relative file paths resolve against the working directory, as Pulsar's do.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from brokerlet.config._fields import SettingsError
from brokerlet.config._settings import _KEY_INDEX, Entry

__all__ = ["PulsarConfig", "read_pulsar_config"]

# Settings whose value is a file path (or a key/URL that may be one).
_PATH_SETTINGS: Final = frozenset(
    {
        "tls_certificate_file_path",
        "tls_key_file_path",
        "tls_trust_certs_file_path",
        "data_dir",
    }
)
_KEY_SETTINGS: Final = frozenset({"token_secret_key", "token_public_key", "basic_auth_conf"})

_PULSAR_AUTHORIZATION_PROVIDER: Final = (
    "org.apache.pulsar.broker.authorization.PulsarAuthorizationProvider"
)


def _truthy(value: str) -> bool:
    return value.strip().lower() == "true"


# Keys brokerlet does not implement whose setting would leave a client with more access, or
# a different security model, than the operator asked for: (key, refused when, why).
_DANGEROUS: Final[tuple[tuple[str, Callable[[str], bool], str], ...]] = (
    ("tlsEnabledWithKeyStore", _truthy, "Java key stores are not supported; use PEM files"),
    (
        "authorizationProvider",
        lambda v: v.strip() not in ("", _PULSAR_AUTHORIZATION_PROVIDER),
        f"only {_PULSAR_AUTHORIZATION_PROVIDER} is supported",
    ),
    ("tokenSettingPrefix", lambda v: bool(v.strip()), "prefixed token settings are not supported"),
    (
        "authenticateOriginalAuthData",
        _truthy,
        "proxied original credentials are not checked by brokerlet",
    ),
)


@dataclass(frozen=True, slots=True)
class PulsarConfig:
    """What a Pulsar configuration file gave.

    Attributes:
        entries: The values of settings brokerlet knows, in file order.
        unimplemented: Keys with a value that brokerlet does not implement, in file order.
    """

    entries: list[Entry]
    unimplemented: list[str]


def read_pulsar_config(path: str | os.PathLike[str]) -> PulsarConfig:
    """Read a Pulsar configuration file.

    Raises:
        SettingsError: The file cannot be read, a line has no ``=``, or it sets a key that
            brokerlet cannot honour safely (named with its value and why).
    """
    shown = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as file:
            lines = file.read().splitlines()
    except OSError as exc:
        raise SettingsError(f"cannot read Pulsar config {shown!r}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise SettingsError(f"Pulsar config {shown!r} is not UTF-8 text: {exc}") from exc
    entries: list[Entry] = []
    unimplemented: list[str] = []
    dangerous = {key.lower(): (key, refused, why) for key, refused, why in _DANGEROUS}
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        key, separator, value = line.partition("=")
        if not separator:
            raise SettingsError(f"{shown}:{number}: expected key=value, got {line!r}")
        key, value = key.strip(), value.strip()
        origin = f"from {shown}:{number}"
        known = _KEY_INDEX.get(key.lower())
        if known is None:
            check = dangerous.get(key.lower())
            if check is not None:
                if check[1](value):
                    raise SettingsError(f"{key} = {value!r} ({origin}): {check[2]}")
                continue  # the value asks for what brokerlet does anyway
            if value:
                unimplemented.append(key)
            continue
        if not value:
            continue  # unset in Pulsar: brokerlet's default stands
        name = known[0].name
        if name in _PATH_SETTINGS:
            value = os.path.abspath(value)
        elif name in _KEY_SETTINGS:
            value = _resolve_key_path(value)
        entries.append(Entry(key, value, origin))
    return PulsarConfig(entries, unimplemented)


def _resolve_key_path(value: str) -> str:
    """An existing relative path becomes absolute; URLs and base64 stay as they are."""
    if value.startswith(("data:", "file:")) or os.path.isabs(value):
        return value
    if os.path.exists(value):
        return os.path.abspath(value)
    return value
