"""Namespace policies: Pulsar's ``Policies`` document, checks of each policy, broker defaults.

The store keeps only what was set (keys as in Pulsar's ``Policies`` JSON); :func:`full`
fills in the rest as Pulsar reports it. Each ``check_*`` returns the value to store or raises
:class:`PolicyError` with Pulsar's HTTP status and reason.

Honoured now: ``autoTopicCreationOverride`` (see :func:`auto_creation`). Stored and
reported for the areas that use them: ``message_ttl_in_seconds``, ``retention_policies``,
``deduplicationEnabled``, ``schema_compatibility_strategy``, ``backlog_quota_map`` (not
enforced yet) and ``auth_policies``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "AUTO_UPDATE_STRATEGIES",
    "BACKLOG_QUOTA_POLICIES",
    "BACKLOG_QUOTA_TYPES",
    "SCHEMA_STRATEGIES",
    "AutoCreation",
    "PolicyError",
    "auto_creation",
    "check_auto_topic_creation",
    "check_auto_update_strategy",
    "check_backlog_quota",
    "check_flag",
    "check_retention",
    "check_schema_strategy",
    "full",
]

SCHEMA_STRATEGIES: Final = (
    "UNDEFINED",
    "ALWAYS_INCOMPATIBLE",
    "ALWAYS_COMPATIBLE",
    "BACKWARD",
    "FORWARD",
    "FULL",
    "BACKWARD_TRANSITIVE",
    "FORWARD_TRANSITIVE",
    "FULL_TRANSITIVE",
)
BACKLOG_QUOTA_TYPES: Final = ("destination_storage", "message_age")
BACKLOG_QUOTA_POLICIES: Final = (
    "producer_request_hold",
    "producer_exception",
    "consumer_backlog_eviction",
)
TOPIC_TYPES: Final = ("partitioned", "non-partitioned")

_MIB: Final = 1024 * 1024
_INT_MAX: Final = 2**31 - 1
_LONG_MAX: Final = 2**63 - 1


class PolicyError(Exception):
    """A policy value Pulsar refuses: ``status`` is the HTTP status it answers."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def full(stored: Mapping[str, Any], cluster: str) -> dict[str, Any]:
    """The namespace's policies as Pulsar's GET ``/namespaces/{t}/{ns}`` reports them."""
    document: dict[str, Any] = {
        "auth_policies": {
            "namespace_auth": {},
            "destination_auth": {},
            "subscription_auth_roles": {},
        },
        "replication_clusters": [cluster],
        "bundles": {"boundaries": ["0x00000000", "0xffffffff"], "numBundles": 1},
        "backlog_quota_map": {},
        "clusterDispatchRate": {},
        "topicDispatchRate": {},
        "subscriptionDispatchRate": {},
        "replicatorDispatchRate": {},
        "clusterSubscribeRate": {},
        "publishMaxMessageRate": {},
        "latency_stats_sample_rate": {},
        "persistence": None,
        "deduplicationEnabled": None,
        "autoTopicCreationOverride": None,
        "autoSubscriptionCreationOverride": None,
        "message_ttl_in_seconds": None,
        "retention_policies": None,
        "deleted": False,
        "encryption_required": False,
        "subscription_auth_mode": "None",
        "max_producers_per_topic": None,
        "max_consumers_per_topic": None,
        "max_consumers_per_subscription": None,
        "compaction_threshold": None,
        "schema_compatibility_strategy": "UNDEFINED",
        "schema_auto_update_compatibility_strategy": "Full",
        "is_allow_auto_update_schema": None,
        "schema_validation_enforced": False,
        "properties": {},
    }
    document.update(copy.deepcopy(dict(stored)))
    return document


# Checks, one per policy endpoint.


def _whole(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PolicyError(400, f"{name}: must be an integer, got {value!r}")
    return value


def check_retention(body: object) -> dict[str, int]:
    """``{"retentionTimeInMinutes": int, "retentionSizeInMB": long}``; -1 is unlimited."""
    if not isinstance(body, dict):
        raise PolicyError(400, "Retention policies must be a JSON object")
    minutes = _whole(body.get("retentionTimeInMinutes", 0), "retentionTimeInMinutes")
    size = _whole(body.get("retentionSizeInMB", 0), "retentionSizeInMB")
    # RetentionPolicies checks in NamespacesBase: below -1 means nothing; Pulsar's fields are
    # an int (minutes) and a long (MB), so larger values cannot be what was meant.
    for field, value, most in (
        ("retentionTimeInMinutes", minutes, _INT_MAX),
        ("retentionSizeInMB", size, _LONG_MAX // _MIB),
    ):
        if not -1 <= value <= most:
            raise PolicyError(
                412, f"Invalid retention policy: {field} must be -1 or in 0..{most}, got {value}"
            )
    return {"retentionTimeInMinutes": minutes, "retentionSizeInMB": size}


def retention_covers_quota(retention: Mapping[str, int], quotas: Mapping[str, Any]) -> bool:
    """Pulsar's ``checkQuotas``: a size-limited retention must exceed the storage quota."""
    size_mb = retention.get("retentionSizeInMB", 0)
    storage = quotas.get("destination_storage")
    if storage is None or size_mb == -1:
        return True
    limit = int(storage.get("limitSize", -1))
    return limit == -1 or limit < size_mb * _MIB


def check_message_ttl(body: object) -> int:
    ttl = _whole(body, "messageTTL")
    if ttl < 0:
        raise PolicyError(412, "Invalid value for message TTL, message TTL must >= 0")
    if ttl > _INT_MAX:  # Pulsar's field is an int of seconds
        raise PolicyError(412, f"Invalid value for message TTL: messageTTL must be <= {_INT_MAX}")
    return ttl


def check_deduplication(body: object) -> bool:
    if not isinstance(body, bool):
        raise PolicyError(400, f"deduplication: must be true or false, got {body!r}")
    return body


def check_schema_strategy(body: object) -> str:
    if not isinstance(body, str) or body.upper() not in SCHEMA_STRATEGIES:
        allowed = ", ".join(SCHEMA_STRATEGIES)
        raise PolicyError(400, f"schemaCompatibilityStrategy: must be one of {allowed}")
    return body.upper()


AUTO_UPDATE_STRATEGIES = (
    "AutoUpdateDisabled", "Backward", "Forward", "Full", "AlwaysCompatible",
    "BackwardTransitive", "ForwardTransitive", "FullTransitive",
)  # fmt: skip
"""Pulsar's deprecated SchemaAutoUpdateCompatibilityStrategy values."""


def check_auto_update_strategy(body: object) -> str:
    if not isinstance(body, str) or body not in AUTO_UPDATE_STRATEGIES:
        allowed = ", ".join(AUTO_UPDATE_STRATEGIES)
        raise PolicyError(400, f"schemaAutoUpdateCompatibilityStrategy: must be one of {allowed}")
    return body


def check_flag(name: str) -> Callable[[object], bool]:
    """A policy that is a bare JSON ``true`` / ``false``."""

    def check(body: object) -> bool:
        if not isinstance(body, bool):
            raise PolicyError(400, f"{name}: must be true or false, got {body!r}")
        return body

    return check


def check_backlog_quota(body: object) -> dict[str, Any]:
    """``{"limitSize": long, "limitTime": int, "policy": str}`` (``limit`` = ``limitSize``)."""
    if not isinstance(body, dict):
        raise PolicyError(400, "Backlog quota must be a JSON object")
    size = _whole(body.get("limitSize", body.get("limit", -1)), "limitSize")
    seconds = _whole(body.get("limitTime", -1), "limitTime")
    policy = body.get("policy", "producer_request_hold")
    if policy not in BACKLOG_QUOTA_POLICIES:
        allowed = ", ".join(BACKLOG_QUOTA_POLICIES)
        raise PolicyError(400, f"policy: must be one of {allowed}, got {policy!r}")
    return {"limitSize": size, "limitTime": seconds, "policy": policy}


def check_auto_topic_creation(body: object, max_partitions: int) -> dict[str, Any]:
    """AutoTopicCreationOverride, as ``NamespacesBase.internalSetAutoTopicCreation`` checks it."""
    if not isinstance(body, dict):
        raise PolicyError(400, "autoTopicCreation: must be a JSON object")
    allow = body.get("allowAutoTopicCreation")
    if not isinstance(allow, bool):
        raise PolicyError(400, "allowAutoTopicCreation: must be true or false")
    topic_type = body.get("topicType")
    partitions = body.get("defaultNumPartitions")
    document: dict[str, Any] = {"allowAutoTopicCreation": allow}
    if topic_type is None and not allow:
        return document
    invalid = "Invalid configuration for autoTopicCreationOverride. the detail is "
    if topic_type not in TOPIC_TYPES:
        raise PolicyError(400, invalid + "[topicType] must be partitioned or non-partitioned")
    document["topicType"] = topic_type
    if topic_type == "partitioned":
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions <= 0:
            raise PolicyError(
                400, invalid + "[defaultNumPartitions] cannot be less than 1 for partition type."
            )
        if max_partitions > 0 and partitions > max_partitions:
            raise PolicyError(
                406,
                f"Number of partitions should be less than or equal to {max_partitions}",
            )
        document["defaultNumPartitions"] = partitions
    elif partitions is not None:
        raise PolicyError(
            400, invalid + "[defaultNumPartitions] cannot be set if the type is non-partitioned."
        )
    return document


# What the broker does with them.


@dataclass(frozen=True, slots=True)
class AutoCreation:
    """Whether a missing topic is created on use, and how."""

    allow: bool
    partitioned: bool
    partitions: int


def deduplication(policies: Mapping[str, Any] | None) -> bool | None:
    """The namespace's ``deduplicationEnabled``; None leaves it to the broker's setting."""
    enabled: bool | None = (policies or {}).get("deduplicationEnabled")
    return enabled


def auto_creation(policies: Mapping[str, Any] | None, settings: Any) -> AutoCreation:
    """The namespace's ``autoTopicCreationOverride``, else the broker's settings."""
    override = (policies or {}).get("autoTopicCreationOverride")
    if override is not None:
        allow = bool(override.get("allowAutoTopicCreation"))
        partitioned = override.get("topicType") == "partitioned"
        partitions = int(override.get("defaultNumPartitions") or 0)
        if partitioned and partitions <= 0:
            partitions = settings.default_num_partitions
        return AutoCreation(allow, partitioned, partitions)
    partitioned = settings.allow_auto_topic_creation_type == "partitioned"
    return AutoCreation(
        settings.allow_auto_topic_creation, partitioned, settings.default_num_partitions
    )
