"""What one setting accepts, and how a raw value becomes a checked one.

A setting is a dataclass field whose metadata holds a :class:`Rule`. :class:`FieldSpec`
pairs the rule with the field's name, type and default, and does all parsing and checking,
so the settings table in ``_settings.py`` needs no hand-written validators.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Final, TypeVar

__all__ = ["FieldSpec", "Rule", "SettingsError", "setting"]

_T = TypeVar("_T")

RULE_KEY: Final = "brokerlet.config.rule"

_TRUE_WORDS: Final = frozenset({"true", "1", "yes"})
_FALSE_WORDS: Final = frozenset({"false", "0", "no"})

# Marks a value that failed to parse or to pass its rule; None cannot, since it is a value too.
_INVALID: Final = object()


class SettingsError(ValueError):
    """A setting is unknown, malformed, out of range or inconsistent with another.

    The message names the key, the value given and what is allowed.

    Attributes:
        key: The setting concerned (snake_case), or None when the error is not about one
            setting, such as an unreadable TOML file.
    """

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True, slots=True)
class Rule:
    """The constraints and documentation of one setting, beyond its Python type.

    Attributes:
        help: One line, shown by ``--help``.
        alias: The name Pulsar's ``broker.conf`` uses for the same setting, if any.
        minimum: Inclusive lower bound for numbers.
        maximum: Inclusive upper bound for numbers.
        choices: For strings, the only values allowed (matched ignoring case).
        non_empty: For strings, whether blank is refused.
        url_scheme: For strings, a prefix (or prefixes) the value must start with unless it
            is empty.
    """

    help: str
    alias: str | None = None
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    non_empty: bool = False
    url_scheme: str | tuple[str, ...] | None = None


def setting(
    default: _T,
    help: str,
    *,
    alias: str | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    choices: tuple[str, ...] = (),
    non_empty: bool = False,
    url_scheme: str | tuple[str, ...] | None = None,
    secret: bool = False,
) -> _T:
    """Declare a settings field: its default plus the :class:`Rule` it obeys.

    A ``secret`` field (a key that may be given inline) is left out of the settings' repr,
    so logging a Settings object never shows it.
    """
    rule = Rule(help, alias, minimum, maximum, choices, non_empty, url_scheme)
    return dataclasses.field(default=default, metadata={RULE_KEY: rule}, repr=not secret)


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One setting: name, Python type (bool, int, float or str), default and rule."""

    name: str
    kind: type
    default: object
    rule: Rule

    @property
    def flag(self) -> str:
        """The command-line flag, e.g. ``--max-message-size``."""
        return "--" + self.name.replace("_", "-")

    @property
    def default_text(self) -> str:
        """The default as it would be written in TOML."""
        return _toml_text(self.default)

    @property
    def allowed(self) -> str:
        """What the setting accepts, phrased to follow "must be"."""
        rule = self.rule
        if self.kind is bool:
            return "a boolean (true/false, 1/0, yes/no)"
        if self.kind in (int, float):
            noun = "an integer" if self.kind is int else "a number"
            low, high = rule.minimum, rule.maximum
            if low is not None and high is not None:
                return f"{noun} in {_number_text(low)}..{_number_text(high)}"
            if low is not None:
                return f"{noun} >= {_number_text(low)}"
            if high is not None:
                return f"{noun} <= {_number_text(high)}"
            return noun
        if rule.choices:
            return "one of " + ", ".join(repr(choice) for choice in rule.choices)
        if rule.url_scheme is not None:
            schemes = rule.url_scheme if isinstance(rule.url_scheme, tuple) else (rule.url_scheme,)
            return "'' or a URL starting with " + " or ".join(schemes)
        return "a non-empty string" if rule.non_empty else "a string"

    def convert(self, raw: object, origin: str | None = None) -> object:
        """Parse (if a string) and check one value for this setting.

        Strings are parsed per type, since environment variables and flags only carry text;
        other values must already have the right type.

        Args:
            raw: The value as given.
            origin: Where it came from, e.g. ``"from BROKERLET_PORT"``, for the message.

        Returns:
            The checked value, normalised (a choice in its canonical case, an int as float).

        Raises:
            SettingsError: The value cannot be parsed or breaks the rule.
        """
        parsed = _parse_text(self.kind, raw) if isinstance(raw, str) else raw
        value = self._check(parsed)
        if value is _INVALID:
            shown = raw if parsed is _INVALID else parsed
            where = f" ({origin})" if origin else ""
            message = f"{self.name} = {shown!r}: must be {self.allowed}{where}"
            raise SettingsError(message, key=self.name)
        return value

    def _check(self, value: object) -> object:
        if self.kind is bool:
            return value if isinstance(value, bool) else _INVALID
        if isinstance(value, bool):
            # bool subclasses int, but `port = true` is a mistake, not port 1.
            return _INVALID
        if self.kind is int:
            return value if isinstance(value, int) and self._in_range(value) else _INVALID
        if self.kind is float:
            if not isinstance(value, int | float) or not math.isfinite(value):
                return _INVALID
            return float(value) if self._in_range(value) else _INVALID
        if not isinstance(value, str):
            return _INVALID
        return self._check_text(value)

    def _check_text(self, value: str) -> object:
        rule = self.rule
        if rule.choices:
            for choice in rule.choices:
                if choice.lower() == value.lower():
                    return choice
            return _INVALID
        if rule.non_empty and not value.strip():
            return _INVALID
        if rule.url_scheme is not None and value and not value.startswith(rule.url_scheme):
            return _INVALID
        return value

    def _in_range(self, value: float) -> bool:
        low, high = self.rule.minimum, self.rule.maximum
        return (low is None or value >= low) and (high is None or value <= high)


def _parse_text(kind: type, text: str) -> object:
    """Turn text from an environment variable or flag into a value of ``kind``."""
    if kind is str:
        return text
    word = text.strip()
    if kind is bool:
        lowered = word.lower()
        if lowered in _TRUE_WORDS:
            return True
        return False if lowered in _FALSE_WORDS else _INVALID
    try:
        return int(word, 10) if kind is int else float(word)
    except ValueError:
        return _INVALID


def _number_text(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else str(number)


def _toml_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a basic TOML string for anything we ship as a default
    return str(value)
