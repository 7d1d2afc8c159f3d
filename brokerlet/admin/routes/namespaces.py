"""Namespaces and their policies (``admin/v2/Namespaces.java``, ``NamespacesBase``).

Each policy has the GET / set / DELETE endpoint ``pulsar-admin namespaces get-*, set-*,
remove-*`` call; a GET of an unset policy answers ``null``. Values are checked by
:mod:`brokerlet.metadata.policies` and stored under Pulsar's ``Policies`` keys.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from brokerlet.admin.rest import (
    AdminRequest,
    Reply,
    RestError,
    Route,
    json_object,
    query_bool,
)
from brokerlet.admin.routes._common import (
    metadata_errors,
    namespace_of,
    store_of,
    tenant_of,
)
from brokerlet.metadata import policies as checks
from brokerlet.metadata.naming import check_entity_name
from brokerlet.metadata.policies import PolicyError, full
from brokerlet.metadata.topics import MODE_ALL, MODE_NON_PERSISTENT, MODE_PERSISTENT, topic_names

__all__ = ["routes"]

NAMESPACE = "/admin/v2/namespaces/<seg:tenant>/<seg:namespace>"
_MODES = {"PERSISTENT": MODE_PERSISTENT, "NON_PERSISTENT": MODE_NON_PERSISTENT, "ALL": MODE_ALL}


def list_namespaces(request: AdminRequest, tenant: str) -> object:
    tenant_of(request, tenant)
    return store_of(request).namespaces_of(tenant)


def _initial_policies(request: AdminRequest) -> dict[str, Any]:
    """The optional Policies body of a namespace creation, keeping what brokerlet knows."""
    body = json_object(request, default={})
    max_partitions = request.context.settings.max_num_partitions_per_partitioned_topic
    policies: dict[str, Any] = {}
    setters: dict[str, Callable[[Any], Any]] = {
        "message_ttl_in_seconds": checks.check_message_ttl,
        "retention_policies": checks.check_retention,
        "deduplicationEnabled": checks.check_deduplication,
        "schema_compatibility_strategy": checks.check_schema_strategy,
        "autoTopicCreationOverride": lambda v: checks.check_auto_topic_creation(v, max_partitions),
    }
    for key, check in setters.items():
        if body.get(key) is not None:
            policies[key] = check(body[key])
    quotas = body.get("backlog_quota_map")
    if quotas:
        if not isinstance(quotas, dict) or any(k not in checks.BACKLOG_QUOTA_TYPES for k in quotas):
            raise RestError(
                400, "backlog_quota_map: keys must be destination_storage or message_age"
            )
        policies["backlog_quota_map"] = {
            k: checks.check_backlog_quota(v) for k, v in quotas.items()
        }
    if isinstance(body.get("auth_policies"), dict):
        policies["auth_policies"] = full({"auth_policies": body["auth_policies"]}, "")[
            "auth_policies"
        ]
    return policies


def create_namespace(request: AdminRequest, tenant: str, namespace: str) -> None:
    tenant_of(request, tenant)
    with metadata_errors():
        check_entity_name("namespace", namespace)
        store_of(request).create_namespace(f"{tenant}/{namespace}", _initial_policies(request))


def get_policies(request: AdminRequest, tenant: str, namespace: str) -> object:
    name = namespace_of(request, tenant, namespace)
    store = store_of(request)
    return full(store.namespaces[name], store.cluster)


def delete_namespace(request: AdminRequest, tenant: str, namespace: str) -> None:
    name = namespace_of(request, tenant, namespace)
    if query_bool(request, "force"):
        # forceDeleteNamespaceAllowed is false, as in Pulsar.
        raise RestError(405, "Broker doesn't allow forced deletion of namespaces")
    with metadata_errors():
        store_of(request).delete_namespace(name)


def namespace_topics(request: AdminRequest, tenant: str, namespace: str) -> object:
    name = namespace_of(request, tenant, namespace)
    mode_text = request.args.get("mode", "PERSISTENT").upper()
    mode = _MODES.get(mode_text)
    if mode is None:
        raise RestError(400, f"mode: must be one of {', '.join(_MODES)}, got {mode_text!r}")
    return topic_names(store_of(request), name, mode)


# One policy at a time.


def _json(value: object) -> Reply:
    """Any value as a JSON document: an unset policy is a 200 ``null`` (None alone would be
    a 204) and a string policy a JSON string (a str alone would be sent as text)."""
    return Reply(200, json.dumps(value).encode(), content_type="application/json")


def _update(
    request: AdminRequest, tenant: str, namespace: str, change: Callable[[dict[str, Any]], None]
) -> None:
    name = namespace_of(request, tenant, namespace)

    def apply(policies: dict[str, Any]) -> dict[str, Any]:
        change(policies)
        return policies

    with metadata_errors():
        store_of(request).update_policies(name, apply)


def _stored(request: AdminRequest, tenant: str, namespace: str) -> dict[str, Any]:
    name = namespace_of(request, tenant, namespace)
    return store_of(request).namespaces[name]


def _policy_routes(
    sub: str,
    key: str,
    check: Callable[[AdminRequest, object], object],
    *,
    set_method: str = "POST",
    unset: object = None,
) -> list[Route]:
    """GET, set and DELETE of the policy stored under ``key``."""

    def get(request: AdminRequest, tenant: str, namespace: str) -> Reply:
        return _json(_stored(request, tenant, namespace).get(key, unset))

    def put(request: AdminRequest, tenant: str, namespace: str) -> None:
        value = check(request, request.json())

        def change(policies: dict[str, Any]) -> None:
            policies[key] = value

        _update(request, tenant, namespace, change)

    def remove(request: AdminRequest, tenant: str, namespace: str) -> None:
        _update(request, tenant, namespace, lambda policies: policies.pop(key, None))

    rule = f"{NAMESPACE}/{sub}"
    return [
        Route(rule, ("GET",), get, auth="tenant"),
        Route(rule, (set_method,), put, auth="tenant"),
        Route(rule, ("DELETE",), remove, auth="tenant"),
    ]


def _checked(check: Callable[[object], object]) -> Callable[[AdminRequest, object], object]:
    def run(_request: AdminRequest, body: object) -> object:
        try:
            return check(body)
        except PolicyError as error:
            raise RestError(error.status, error.reason) from None

    return run


def _auto_topic_creation(request: AdminRequest, body: object) -> object:
    limit = request.context.settings.max_num_partitions_per_partitioned_topic
    return _checked(lambda b: checks.check_auto_topic_creation(b, limit))(request, body)


def _set_retention(request: AdminRequest, tenant: str, namespace: str) -> None:
    value = _checked(checks.check_retention)(request, request.json())
    assert isinstance(value, dict)

    def change(policies: dict[str, Any]) -> None:
        if not checks.retention_covers_quota(value, policies.get("backlog_quota_map", {})):
            raise PolicyError(
                412, "Retention Quota must exceed configured backlog quota for namespace."
            )
        policies["retention_policies"] = value

    _update(request, tenant, namespace, change)


def _quota_type(request: AdminRequest) -> str:
    kind = request.args.get("backlogQuotaType") or "destination_storage"
    if kind not in checks.BACKLOG_QUOTA_TYPES:
        allowed = ", ".join(checks.BACKLOG_QUOTA_TYPES)
        raise RestError(400, f"backlogQuotaType: must be one of {allowed}, got {kind!r}")
    return kind


def _set_backlog_quota(request: AdminRequest, tenant: str, namespace: str) -> None:
    kind = _quota_type(request)
    quota = _checked(checks.check_backlog_quota)(request, request.json())
    assert isinstance(quota, dict)

    def change(policies: dict[str, Any]) -> None:
        quotas = {**policies.get("backlog_quota_map", {}), kind: quota}
        retention = policies.get("retention_policies")
        if retention is not None and not checks.retention_covers_quota(retention, quotas):
            raise PolicyError(
                412,
                "Backlog Quota exceeds configured retention quota for namespace. "
                "Please increase retention quota and retry",
            )
        policies["backlog_quota_map"] = quotas

    _update(request, tenant, namespace, change)


def _remove_backlog_quota(request: AdminRequest, tenant: str, namespace: str) -> None:
    kind = _quota_type(request)

    def change(policies: dict[str, Any]) -> None:
        quotas = dict(policies.get("backlog_quota_map", {}))
        quotas.pop(kind, None)
        policies["backlog_quota_map"] = quotas

    _update(request, tenant, namespace, change)


def _backlog_quota_map(request: AdminRequest, tenant: str, namespace: str) -> object:
    return _stored(request, tenant, namespace).get("backlog_quota_map", {})


# Permissions: stored in auth_policies.namespace_auth (the security area enforces them).

_AUTH_ACTIONS = ("produce", "consume", "functions", "sources", "sinks", "packages")


def _permissions(request: AdminRequest, tenant: str, namespace: str) -> object:
    policies = full(_stored(request, tenant, namespace), "")
    return policies["auth_policies"]["namespace_auth"]


def _grant(request: AdminRequest, tenant: str, namespace: str, role: str) -> None:
    actions = request.json()
    if not isinstance(actions, list) or any(a not in _AUTH_ACTIONS for a in actions):
        raise RestError(400, f"actions: must be a list of {', '.join(_AUTH_ACTIONS)}")

    def change(policies: dict[str, Any]) -> None:
        auth = full(policies, "")["auth_policies"]
        auth["namespace_auth"][role] = sorted(set(actions))
        policies["auth_policies"] = auth

    _update(request, tenant, namespace, change)


def _revoke(request: AdminRequest, tenant: str, namespace: str, role: str) -> None:
    def change(policies: dict[str, Any]) -> None:
        auth = full(policies, "")["auth_policies"]
        auth["namespace_auth"].pop(role, None)
        policies["auth_policies"] = auth

    _update(request, tenant, namespace, change)


def _allow_auto_update(request: AdminRequest, tenant: str, namespace: str) -> Reply:
    # Unset in the namespace: the broker's isAllowAutoUpdateSchemaEnabled, as Pulsar answers.
    value = _stored(request, tenant, namespace).get("is_allow_auto_update_schema")
    if value is None:
        value = request.context.settings.allow_auto_update_schema
    return _json(value)


def routes() -> list[Route]:
    return [
        Route("/admin/v2/namespaces/<seg:tenant>", ("GET",), list_namespaces, auth="tenant"),
        Route(NAMESPACE, ("PUT",), create_namespace, auth="tenant"),
        Route(NAMESPACE, ("GET",), get_policies, auth="tenant"),
        Route(NAMESPACE, ("DELETE",), delete_namespace, auth="tenant"),
        Route(f"{NAMESPACE}/topics", ("GET",), namespace_topics, auth="consume"),
        *_policy_routes("messageTTL", "message_ttl_in_seconds", _checked(checks.check_message_ttl)),
        *_policy_routes(
            "deduplication", "deduplicationEnabled", _checked(checks.check_deduplication)
        ),
        *_policy_routes("autoTopicCreation", "autoTopicCreationOverride", _auto_topic_creation),
        *_policy_routes(
            "schemaCompatibilityStrategy",
            "schema_compatibility_strategy",
            _checked(checks.check_schema_strategy),
            set_method="PUT",
            unset="UNDEFINED",
        ),
        # The schema registry's other namespace policies (Pulsar's Namespaces resource).
        *_policy_routes(
            "schemaAutoUpdateCompatibilityStrategy",
            "schema_auto_update_compatibility_strategy",
            _checked(checks.check_auto_update_strategy),
            set_method="PUT",
            unset="Full",
        ),
        *_policy_routes(
            "schemaValidationEnforced",
            "schema_validation_enforced",
            _checked(checks.check_flag("schemaValidationEnforced")),
            unset=False,
        ),
        Route(f"{NAMESPACE}/isAllowAutoUpdateSchema", ("GET",), _allow_auto_update, auth="tenant"),
        *[
            route
            for route in _policy_routes(
                "isAllowAutoUpdateSchema",
                "is_allow_auto_update_schema",
                _checked(checks.check_flag("isAllowAutoUpdateSchema")),
            )
            if route.methods != ("GET",)
        ],
        # retention: its set checks the backlog quota, so it is spelled out.
        Route(
            f"{NAMESPACE}/retention",
            ("GET",),
            lambda r, tenant, namespace: _json(
                _stored(r, tenant, namespace).get("retention_policies")
            ),
            auth="tenant",
        ),
        Route(f"{NAMESPACE}/retention", ("POST",), _set_retention, auth="tenant"),
        Route(
            f"{NAMESPACE}/retention",
            ("DELETE",),
            lambda r, tenant, namespace: _update(
                r, tenant, namespace, lambda p: p.pop("retention_policies", None)
            ),
            auth="tenant",
        ),
        Route(f"{NAMESPACE}/backlogQuota", ("POST",), _set_backlog_quota, auth="tenant"),
        Route(f"{NAMESPACE}/backlogQuota", ("DELETE",), _remove_backlog_quota, auth="tenant"),
        Route(f"{NAMESPACE}/backlogQuotaMap", ("GET",), _backlog_quota_map, auth="tenant"),
        Route(f"{NAMESPACE}/permissions", ("GET",), _permissions, auth="tenant"),
        Route(f"{NAMESPACE}/permissions/<seg:role>", ("POST",), _grant, auth="tenant"),
        Route(f"{NAMESPACE}/permissions/<seg:role>", ("DELETE",), _revoke, auth="tenant"),
    ]
