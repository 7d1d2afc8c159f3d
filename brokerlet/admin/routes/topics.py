"""Topic metadata routes: list, create and delete topics, partitioned topics."""

from __future__ import annotations

from brokerlet.admin.rest import AdminRequest, Route

__all__ = ["routes"]

NAMESPACE = "/admin/v2/<domain:domain>/<seg:tenant>/<seg:namespace>"


def list_topics(request: AdminRequest, domain: str, tenant: str, namespace: str) -> object:
    prefix = f"{domain}://{tenant}/{namespace}/"
    all_stats = request.context.all_stats
    assert all_stats is not None
    return sorted(name for name in all_stats() if name.startswith(prefix))


def routes() -> list[Route]:
    return [
        Route(NAMESPACE, ("GET",), list_topics, auth="tenant"),
    ]
