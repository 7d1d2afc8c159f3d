"""Namespace permissions: ``/admin/v2/namespaces/{tenant}/{namespace}/permissions[/{role}]``.

As in Pulsar's ``NamespacesBase``: GET lists ``{role: [actions]}``; POST with a JSON array of
``AuthAction`` names grants them to the role (replacing what it had); DELETE revokes. Tenant
admins and super users may call them; with authorization disabled the writes answer 501.
"""

from __future__ import annotations

from typing import Any

from brokerlet.admin.rest import AdminRequest, RestError, Route
from brokerlet.security.authorization import AuthAction, NamespaceNotFound, PolicyStore

__all__ = ["routes"]

_BASE = "/admin/v2/namespaces/<seg:tenant>/<seg:namespace>/permissions"


def routes() -> list[Route]:
    return [
        Route(_BASE, ("GET",), get_permissions),
        Route(_BASE + "/<seg:role>", ("POST",), grant_permission),
        Route(_BASE + "/<seg:role>", ("DELETE",), revoke_permission),
    ]


def _store(request: AdminRequest) -> PolicyStore:
    security = request.context.security
    policies = None if security is None else security.authorizer.policies
    if not isinstance(policies, PolicyStore):
        raise RestError(501, "Namespace permissions are not stored by this broker")
    return policies


def _require_authorization(request: AdminRequest) -> None:
    security = request.context.security
    if security is None or not security.authorizer.enabled:
        raise RestError(501, "Authorization is not enabled")


def get_permissions(request: AdminRequest, tenant: str, namespace: str) -> Any:
    permissions = _store(request).namespace_permissions(tenant, namespace)
    if permissions is None:
        raise RestError(404, "Namespace does not exist")
    return {role: sorted(a.value for a in actions) for role, actions in permissions.items()}


def grant_permission(request: AdminRequest, tenant: str, namespace: str, role: str) -> None:
    _require_authorization(request)
    body = request.json()
    if not isinstance(body, list) or not all(isinstance(a, str) for a in body):
        raise RestError(400, "actions: must be a JSON array of AuthAction names")
    try:
        actions = {AuthAction(a) for a in body}
    except ValueError:
        allowed = ", ".join(a.value for a in AuthAction)
        raise RestError(400, f"actions: each must be one of {allowed}") from None
    try:
        _store(request).grant(tenant, namespace, role, actions)
    except NamespaceNotFound:
        raise RestError(404, "Namespace does not exist") from None


def revoke_permission(request: AdminRequest, tenant: str, namespace: str, role: str) -> None:
    _require_authorization(request)
    try:
        _store(request).revoke(tenant, namespace, role)
    except NamespaceNotFound:
        raise RestError(404, "Namespace does not exist") from None
