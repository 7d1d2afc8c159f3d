"""Typed broker settings: defaults, a TOML file, ``BROKERLET_*`` variables and flags.

Keys are snake_case; Pulsar's camelCase ``broker.conf`` names are accepted as aliases.
Every value is checked when settings are built, and a bad one raises :class:`SettingsError`
naming the key, the value and what is allowed.
"""

from brokerlet.config._fields import SettingsError
from brokerlet.config._loading import (
    add_arguments,
    describe_settings,
    load_settings,
    settings_from_args,
)
from brokerlet.config._settings import Settings

__all__ = [
    "Settings",
    "SettingsError",
    "add_arguments",
    "describe_settings",
    "load_settings",
    "settings_from_args",
]
