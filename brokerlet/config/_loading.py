"""Settings sources: a TOML file, ``BROKERLET_*`` variables, overrides and command-line flags."""

from __future__ import annotations

import argparse
import logging
import os
import tomllib
from collections.abc import Mapping
from typing import Any, Final

from brokerlet._compiled import PURE_PYTHON_VARIABLE
from brokerlet.config._fields import FieldSpec, SettingsError
from brokerlet.config._pulsar import read_pulsar_config
from brokerlet.config._settings import SPECS, Entry, Settings, collect, entries_from_mapping

__all__ = [
    "CONFIG_ENV",
    "ENV_PREFIX",
    "add_arguments",
    "describe_settings",
    "load_settings",
    "settings_from_args",
]

log = logging.getLogger("brokerlet.config")

ENV_PREFIX: Final = "BROKERLET_"
# Names the TOML file when no path is passed in; it is not a setting itself.
CONFIG_ENV: Final = "BROKERLET_CONFIG"
# Variables of the prefix that are not settings: the file, and running from source.
_NOT_SETTINGS: Final = frozenset((CONFIG_ENV, PURE_PYTHON_VARIABLE))


def load_settings(
    *,
    toml_path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
    pulsar_config: str | os.PathLike[str] | None = None,
) -> Settings:
    """Build settings from every source; each one overrides those before it.

    The order, weakest first: defaults, a Pulsar ``broker.conf``/``standalone.conf``, the
    TOML file, ``BROKERLET_<KEY>`` environment
    variables, then ``overrides``. Keys may be snake_case names or Pulsar aliases, in any
    case (``BROKERLET_PORT``, ``BROKERLET_BROKERSERVICEPORT``, ``maxMessageSize = ...``).

    Args:
        toml_path: A TOML file of top-level ``key = value`` pairs. When None, the file named
            by ``BROKERLET_CONFIG`` is read, if that is set.
        env: Environment variables; only those starting with ``BROKERLET_`` are read.
            Defaults to ``os.environ``.
        overrides: Values for embedded use, e.g. ``{"port": 0}``; strings are parsed.
        pulsar_config: A Pulsar configuration file (:mod:`brokerlet.config._pulsar`); the
            keys brokerlet does not implement are logged once, at INFO.

    Returns:
        The checked settings.

    Raises:
        SettingsError: A source names an unknown setting, gives a value that is not allowed,
            or the result breaks a cross-field rule; or the TOML file cannot be read.
    """
    environ = os.environ if env is None else env
    return _merge(toml_path, environ, entries_from_mapping(overrides or {}), None, pulsar_config)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--config PATH`` and one flag per setting (``--max-message-size N``, ...).

    Flags left out do not appear in the parsed namespace, so they never hide the file or
    environment. Boolean flags take a value (``--tcp-nodelay false``); alone they mean true.
    Values stay text until :func:`settings_from_args` checks them.
    """
    group = parser.add_argument_group(
        "settings", f"Each flag overrides the TOML file and {ENV_PREFIX}* variables."
    )
    group.add_argument(
        "--config",
        metavar="PATH",
        default=None,
        help=f"TOML settings file (default: ${CONFIG_ENV}, if set)",
    )
    group.add_argument(
        "--pulsar-config",
        metavar="PATH",
        default=None,
        help="a Pulsar broker.conf or standalone.conf, weaker than every other source",
    )
    for spec in SPECS:
        extra: dict[str, Any] = {}
        if spec.kind is bool:
            extra = {"nargs": "?", "const": "true"}
        help_text = f"{spec.rule.help} (default: {spec.default_text})"
        group.add_argument(
            spec.flag,
            dest=spec.name,
            metavar=_metavar(spec),
            default=argparse.SUPPRESS,
            help=help_text.replace("%", "%%"),  # argparse expands % in help
            **extra,
        )


def settings_from_args(
    ns: argparse.Namespace,
    env: Mapping[str, str] | None = None,
    defaults: Mapping[str, object] | None = None,
) -> Settings:
    """Build settings from flags parsed with a parser set up by :func:`add_arguments`.

    Sources as in :func:`load_settings`, with the flags strongest and ``--config`` naming
    the TOML file.

    Args:
        ns: The parsed namespace.
        env: Environment variables; defaults to ``os.environ``.
        defaults: Values that replace the built-in defaults, weaker than every source
            (``brokerlet serve`` stores on disk unless told otherwise).

    Raises:
        SettingsError: As for :func:`load_settings`; a bad flag value names the flag.
    """
    flags = [
        Entry(spec.name, getattr(ns, spec.name), f"from {spec.flag}")
        for spec in SPECS
        if hasattr(ns, spec.name)
    ]
    environ = os.environ if env is None else env
    weakest = entries_from_mapping(defaults or {})
    pulsar_config = getattr(ns, "pulsar_config", None)
    return _merge(getattr(ns, "config", None), environ, flags, weakest, pulsar_config)


def describe_settings() -> str:
    """A plain-text table of every setting: key, Pulsar alias, default and what is allowed."""
    header = ("key", "alias", "default", "allowed")
    rows = [(s.name, s.rule.alias or "-", s.default_text, s.allowed) for s in SPECS]
    widths = [max(len(row[column]) for row in [header, *rows]) for column in range(4)]
    underline = tuple("-" * width for width in widths)
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, underline, *rows]
    ]
    return "\n".join(lines) + "\n"


def _merge(
    toml_path: str | os.PathLike[str] | None,
    env: Mapping[str, str],
    strongest: list[Entry],
    weakest: list[Entry] | None = None,
    pulsar_config: str | os.PathLike[str] | None = None,
) -> Settings:
    if toml_path is None:
        toml_path = env.get(CONFIG_ENV) or None
    values: dict[str, Any] = collect(weakest or [])
    if pulsar_config is not None:
        pulsar = read_pulsar_config(pulsar_config)
        values.update(collect(pulsar.entries))
        if pulsar.unimplemented:
            log.info(
                "%s: %d Pulsar setting(s) that brokerlet does not implement are ignored: %s",
                os.fspath(pulsar_config),
                len(pulsar.unimplemented),
                ", ".join(pulsar.unimplemented),
            )
    if toml_path is not None:
        values.update(collect(_toml_entries(toml_path)))
    values.update(collect(_env_entries(env)))
    values.update(collect(strongest))
    return Settings(**values)


def _toml_entries(path: str | os.PathLike[str]) -> list[Entry]:
    shown = os.fspath(path)
    try:
        with open(path, "rb") as file:
            document = tomllib.load(file)
    except OSError as exc:
        raise SettingsError(f"cannot read settings file {shown!r}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"settings file {shown!r} is not valid TOML: {exc}") from exc
    origin = f"from {shown}"
    return [Entry(key, value, origin) for key, value in document.items()]


def _env_entries(env: Mapping[str, str]) -> list[Entry]:
    # Sorted so that, with several mistakes, the same one is reported every time.
    return [
        Entry(name.removeprefix(ENV_PREFIX).lower(), value, f"from {name}")
        for name, value in sorted(env.items())
        if name.startswith(ENV_PREFIX) and name not in _NOT_SETTINGS
    ]


def _metavar(spec: FieldSpec) -> str:
    if spec.rule.choices:
        return "{" + ",".join(spec.rule.choices) + "}"
    return {bool: "BOOL", int: "N", float: "X"}.get(spec.kind, "TEXT")
