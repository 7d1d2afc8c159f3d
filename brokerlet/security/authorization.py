"""Authorization as Pulsar's ``PulsarAuthorizationProvider`` decides it.

* super users (``superUserRoles``) may do everything;
* a tenant's ``adminRoles`` administer the tenant and may also produce, consume and look up
  anywhere in it (``validateTenantAdminAccess`` comes first in
  ``allowTopicOperationAsync``);
* everyone else needs the action in the namespace's permissions (``auth_policies.
  namespace_auth``): ``produce`` for PRODUCER, ``consume`` for SUBSCRIBE, either for LOOKUP
  and partitioned metadata.

Policies come from a :class:`PolicySource`: the metadata store at integration, or
:class:`InMemoryPolicies` (tests, and a broker without a store).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "AuthAction",
    "Authorizer",
    "InMemoryPolicies",
    "NamespaceNotFound",
    "PolicySource",
    "PolicyStore",
    "PulsarShapedPolicies",
    "topic_namespace",
]

log = logging.getLogger(__name__)


class AuthAction(StrEnum):
    """Pulsar's ``AuthAction`` values, as the admin API spells them."""

    PRODUCE = "produce"
    CONSUME = "consume"
    FUNCTIONS = "functions"
    SOURCES = "sources"
    SINKS = "sinks"
    PACKAGES = "packages"


class NamespaceNotFound(LookupError):  # noqa: N818 - an outcome, answered 404
    """The namespace (or its tenant) does not exist."""


@runtime_checkable
class PolicySource(Protocol):
    """What authorization reads: tenants' admin roles and namespaces' permissions."""

    def tenant_admin_roles(self, tenant: str) -> frozenset[str] | None:
        """The tenant's ``adminRoles``; None when the tenant does not exist."""
        ...

    def namespace_permissions(
        self, tenant: str, namespace: str
    ) -> dict[str, frozenset[AuthAction]] | None:
        """``auth_policies.namespace_auth``: role to actions; None for no such namespace."""
        ...


@runtime_checkable
class PolicyStore(PolicySource, Protocol):
    """A :class:`PolicySource` the permissions admin routes can change."""

    def grant(self, tenant: str, namespace: str, role: str, actions: Iterable[AuthAction]) -> None:
        """Set the role's actions on the namespace (replacing earlier ones).

        Raises:
            NamespaceNotFound: no such namespace.
        """
        ...

    def revoke(self, tenant: str, namespace: str, role: str) -> None:
        """Remove the role's permissions on the namespace.

        Raises:
            NamespaceNotFound: no such namespace.
        """
        ...


class InMemoryPolicies:
    """Tenants and namespaces in memory; ``public/default`` exists from the start, as in a
    Pulsar standalone. Thread-safe: tests change it from their own thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tenants: dict[str, frozenset[str]] = {"public": frozenset()}
        self._namespaces: dict[tuple[str, str], dict[str, frozenset[AuthAction]]] = {
            ("public", "default"): {}
        }

    def add_tenant(self, tenant: str, admin_roles: Iterable[str] = ()) -> None:
        with self._lock:
            self._tenants[tenant] = frozenset(admin_roles)

    def add_namespace(self, tenant: str, namespace: str) -> None:
        with self._lock:
            if tenant not in self._tenants:
                raise NamespaceNotFound(f"Tenant does not exist: {tenant}")
            self._namespaces.setdefault((tenant, namespace), {})

    def tenant_admin_roles(self, tenant: str) -> frozenset[str] | None:
        with self._lock:
            return self._tenants.get(tenant)

    def namespace_permissions(
        self, tenant: str, namespace: str
    ) -> dict[str, frozenset[AuthAction]] | None:
        with self._lock:
            permissions = self._namespaces.get((tenant, namespace))
            return None if permissions is None else dict(permissions)

    def grant(self, tenant: str, namespace: str, role: str, actions: Iterable[AuthAction]) -> None:
        with self._lock:
            permissions = self._namespace(tenant, namespace)
            permissions[role] = frozenset(actions)

    def revoke(self, tenant: str, namespace: str, role: str) -> None:
        with self._lock:
            self._namespace(tenant, namespace).pop(role, None)

    def _namespace(self, tenant: str, namespace: str) -> dict[str, frozenset[AuthAction]]:
        permissions = self._namespaces.get((tenant, namespace))
        if permissions is None:
            raise NamespaceNotFound(f"Namespace does not exist: {tenant}/{namespace}")
        return permissions


class PulsarShapedPolicies:
    """A :class:`PolicyStore` over documents shaped as Pulsar's admin API shapes them.

    For wiring authorization to a metadata store that keeps ``TenantInfo``
    (``{"adminRoles": [...], "allowedClusters": [...]}``) and namespace ``Policies`` (with
    ``auth_policies.namespace_auth``: role to a list of action names), without this module
    knowing the store.

    Args:
        tenant_info: the tenant's TenantInfo, or None when it does not exist.
        namespace_policies: the namespace's Policies, or None when it does not exist.
        update_namespace_policies: applies a change to the namespace's Policies in place and
            stores it; returns False when the namespace does not exist.
    """

    def __init__(
        self,
        tenant_info: Callable[[str], Mapping[str, Any] | None],
        namespace_policies: Callable[[str, str], Mapping[str, Any] | None],
        update_namespace_policies: Callable[[str, str, Callable[[dict[str, Any]], None]], bool],
    ) -> None:
        self._tenant_info = tenant_info
        self._namespace_policies = namespace_policies
        self._update = update_namespace_policies

    def tenant_admin_roles(self, tenant: str) -> frozenset[str] | None:
        info = self._tenant_info(tenant)
        return None if info is None else frozenset(info.get("adminRoles") or ())

    def namespace_permissions(
        self, tenant: str, namespace: str
    ) -> dict[str, frozenset[AuthAction]] | None:
        policies = self._namespace_policies(tenant, namespace)
        if policies is None:
            return None
        granted = (policies.get("auth_policies") or {}).get("namespace_auth") or {}
        known = {a.value for a in AuthAction}
        return {
            role: frozenset(AuthAction(a) for a in actions if a in known)
            for role, actions in granted.items()
        }

    def grant(self, tenant: str, namespace: str, role: str, actions: Iterable[AuthAction]) -> None:
        names = sorted(a.value for a in actions)

        def change(policies: dict[str, Any]) -> None:
            auth = policies.setdefault("auth_policies", {})
            auth.setdefault("namespace_auth", {})[role] = names

        if not self._update(tenant, namespace, change):
            raise NamespaceNotFound(f"Namespace does not exist: {tenant}/{namespace}")

    def revoke(self, tenant: str, namespace: str, role: str) -> None:
        def change(policies: dict[str, Any]) -> None:
            auth = policies.get("auth_policies") or {}
            (auth.get("namespace_auth") or {}).pop(role, None)

        if not self._update(tenant, namespace, change):
            raise NamespaceNotFound(f"Namespace does not exist: {tenant}/{namespace}")


def topic_namespace(topic: str) -> tuple[str, str]:
    """``(tenant, namespace)`` of a full topic name (``persistent://t/ns/x``)."""
    rest = topic.partition("://")[2]
    tenant, _, remainder = rest.partition("/")
    return tenant, remainder.partition("/")[0]


class Authorizer:
    """Decides what a role may do; every refusal is logged with the role and the action.

    Args:
        enabled: ``authorizationEnabled``; when False everything is allowed.
        super_user_roles: ``superUserRoles``.
        policies: where tenants and namespace permissions come from.
    """

    def __init__(
        self, *, enabled: bool, super_user_roles: Iterable[str], policies: PolicySource
    ) -> None:
        self.enabled = enabled
        self.super_user_roles = frozenset(r.strip() for r in super_user_roles if r.strip())
        self.policies = policies

    @classmethod
    def from_settings(cls, settings: object, policies: PolicySource) -> Authorizer:
        enabled = bool(getattr(settings, "authorization_enabled", False))
        roles = str(getattr(settings, "super_user_roles", "")).split(",")
        return cls(enabled=enabled, super_user_roles=roles, policies=policies)

    def is_super_user(self, role: str | None) -> bool:
        return not self.enabled or (role is not None and role in self.super_user_roles)

    def is_tenant_admin(self, role: str | None, tenant: str) -> bool:
        """Super users, and the tenant's ``adminRoles``."""
        if self.is_super_user(role):
            return True
        admins = self.policies.tenant_admin_roles(tenant)
        return role is not None and admins is not None and role in admins

    def allows_namespace(
        self, role: str | None, tenant: str, namespace: str, action: AuthAction
    ) -> bool:
        if self.is_tenant_admin(role, tenant):
            return True
        if role is None:
            return False
        permissions = self.policies.namespace_permissions(tenant, namespace) or {}
        return action in permissions.get(role, frozenset())

    def can_produce(self, role: str | None, topic: str) -> bool:
        return self.allows_namespace(role, *topic_namespace(topic), AuthAction.PRODUCE)

    def can_consume(self, role: str | None, topic: str) -> bool:
        return self.allows_namespace(role, *topic_namespace(topic), AuthAction.CONSUME)

    def can_lookup(self, role: str | None, topic: str) -> bool:
        return self.can_produce(role, topic) or self.can_consume(role, topic)

    def check(self, allowed: bool, role: str | None, action: str, target: str, peer: str) -> bool:
        """Log a refusal (role, action, target, peer); returns ``allowed``."""
        if not allowed:
            log.warning(
                "authorization refused: role %r may not %s %s (peer %s)",
                role,
                action,
                target,
                peer,
            )
        return allowed
