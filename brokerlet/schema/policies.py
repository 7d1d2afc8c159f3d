"""The schema rules in force for a topic: namespace policies over broker settings.

Pulsar resolves, for each topic: the namespace's ``schema_compatibility_strategy`` unless
UNDEFINED, else its deprecated ``schema_auto_update_compatibility_strategy``, else the broker's
``schemaCompatibilityStrategy``; ``is_allow_auto_update_schema`` and
``schema_validation_enforced`` likewise fall back to ``isAllowAutoUpdateSchemaEnabled`` and
``isSchemaValidationEnforced`` (enforcement holds if either the namespace or the broker asks
for it). :func:`schema_policies` is that one rule; the metadata store
(namespaces) feeds it a namespace's policies document, or None where it has none.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from brokerlet.config import Settings
from brokerlet.schema.types import AutoUpdateStrategy, Strategy, parse_strategy

__all__ = ["NamespacePolicies", "SchemaPolicies", "namespace_of", "schema_policies"]

NamespacePolicies = Callable[[str], Mapping[str, object] | None]
"""``"tenant/namespace"`` -> that namespace's policies document (Pulsar's Policies JSON)."""


_LEGACY_DEFAULT = "Full"
"""Pulsar's Policies default of ``schema_auto_update_compatibility_strategy``: every namespace
document holds it, so only another value counts as set (else no broker setting would ever
apply; Pulsar's topics stopped reading the legacy field for the same reason)."""


@dataclass(frozen=True, slots=True)
class SchemaPolicies:
    """What governs schema changes on one topic."""

    compatibility: Strategy
    allow_auto_update: bool
    validation_enforced: bool


def _first(policies: Mapping[str, object], *keys: str) -> object:
    for key in keys:
        value = policies.get(key)
        if value is not None:
            return value
    return None


def schema_policies(
    settings: Settings, namespace_policies: Mapping[str, object] | None = None
) -> SchemaPolicies:
    """The schema policies of a namespace, falling back to the broker's settings.

    Args:
        settings: the broker settings (``schema_compatibility_strategy``,
            ``allow_auto_update_schema``, ``schema_validation_enforced``).
        namespace_policies: the namespace's policies as Pulsar's Policies JSON
            (``schema_compatibility_strategy``, ``schema_auto_update_compatibility_strategy``,
            ``is_allow_auto_update_schema``, ``schema_validation_enforced``; the REST
            sub-resource names are accepted too), or None.
    """
    strategy = parse_strategy(settings.schema_compatibility_strategy)
    allow_auto_update = settings.allow_auto_update_schema
    enforced = settings.schema_validation_enforced
    if namespace_policies:
        own = _first(
            namespace_policies, "schema_compatibility_strategy", "schemaCompatibilityStrategy"
        )
        legacy = _first(
            namespace_policies,
            "schema_auto_update_compatibility_strategy",
            "schemaAutoUpdateCompatibilityStrategy",
        )
        if isinstance(own, str) and parse_strategy(own) is not Strategy.UNDEFINED:
            strategy = parse_strategy(own)
        elif (
            isinstance(legacy, str)
            and legacy != _LEGACY_DEFAULT
            and legacy in AutoUpdateStrategy.__members__
        ):
            strategy = AutoUpdateStrategy[legacy].value
        auto = _first(namespace_policies, "is_allow_auto_update_schema", "isAllowAutoUpdateSchema")
        if isinstance(auto, bool):
            allow_auto_update = auto
        validation = _first(
            namespace_policies, "schema_validation_enforced", "schemaValidationEnforced"
        )
        if validation is True:  # the document's default False leaves the broker's setting
            enforced = True
    return SchemaPolicies(strategy, allow_auto_update, enforced)


def namespace_of(schema_id: str) -> str:
    """``"tenant/namespace"`` of a schema id ``"tenant/namespace/topic"``."""
    tenant, namespace, _ = schema_id.split("/", 2)
    return f"{tenant}/{namespace}"
