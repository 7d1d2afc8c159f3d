"""Tenants (``admin/v2/Tenants.java``, ``TenantsBase``): TenantInfo is
``{"adminRoles": [str], "allowedClusters": [str]}``."""

from __future__ import annotations

from typing import Any

from brokerlet.admin.rest import AdminRequest, RestError, Route, json_object, query_bool
from brokerlet.admin.routes._common import metadata_errors, store_of, tenant_of
from brokerlet.metadata.naming import check_entity_name

__all__ = ["routes"]

TENANT = "/admin/v2/tenants/<seg:tenant>"


def _strings(document: dict[str, Any], key: str) -> list[str]:
    value = document.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RestError(400, f"{key}: must be a list of strings")
    return sorted(set(value))


def _tenant_info(request: AdminRequest) -> dict[str, Any]:
    body = json_object(request, default={})
    info = {
        "adminRoles": _strings(body, "adminRoles"),
        "allowedClusters": _strings(body, "allowedClusters"),
    }
    cluster = store_of(request).cluster
    if not info["allowedClusters"]:
        # pulsar-admin sends every cluster when none is given; an explicit [] is refused.
        if "allowedClusters" in body:
            raise RestError(412, "Clusters can not be empty")
        info["allowedClusters"] = [cluster]
    unknown = [c for c in info["allowedClusters"] if c != cluster]
    if unknown:
        raise RestError(412, f"Clusters do not exist: {', '.join(unknown)}")
    return info


def list_tenants(request: AdminRequest) -> object:
    return sorted(store_of(request).tenants)


def get_tenant(request: AdminRequest, tenant: str) -> object:
    return tenant_of(request, tenant)


def create_tenant(request: AdminRequest, tenant: str) -> None:
    with metadata_errors():
        check_entity_name("tenant", tenant)
        info = _tenant_info(request)
        store_of(request).create_tenant(tenant, info)


def update_tenant(request: AdminRequest, tenant: str) -> None:
    tenant_of(request, tenant)
    with metadata_errors():
        store_of(request).update_tenant(tenant, _tenant_info(request))


def delete_tenant(request: AdminRequest, tenant: str) -> None:
    tenant_of(request, tenant)
    if query_bool(request, "force"):
        # forceDeleteTenantAllowed is false, as in Pulsar.
        raise RestError(405, "Broker doesn't allow forced deletion of tenants")
    with metadata_errors():
        store_of(request).delete_tenant(tenant)


def routes() -> list[Route]:
    return [
        Route("/admin/v2/tenants", ("GET",), list_tenants, auth="super"),
        Route(TENANT, ("GET",), get_tenant, auth="tenant"),
        Route(TENANT, ("PUT",), create_tenant, auth="super"),
        Route(TENANT, ("POST",), update_tenant, auth="super"),
        Route(TENANT, ("DELETE",), delete_tenant, auth="super"),
    ]
