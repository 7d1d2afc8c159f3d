"""Clusters (``admin/v2/Clusters.java``): brokerlet forms exactly one, ``cluster_name``."""

from __future__ import annotations

from brokerlet.admin.rest import AdminRequest, RestError, Route
from brokerlet.admin.routes._common import store_of

__all__ = ["routes"]


def list_clusters(request: AdminRequest) -> object:
    # Container readiness checks wait for exactly ["standalone"].
    return [store_of(request).cluster]


def get_cluster(request: AdminRequest, cluster: str) -> object:
    if cluster != store_of(request).cluster:
        raise RestError(404, "Cluster does not exist")
    context = request.context
    web = context.web_service_url() if context.web_service_url else ""
    service = context.service_url() if context.service_url else ""
    return {
        "serviceUrl": web,
        "serviceUrlTls": "",
        "brokerServiceUrl": service,
        "brokerServiceUrlTls": "",
        "proxyServiceUrl": "",
        "peerClusterNames": [],
    }


def routes() -> list[Route]:
    return [
        Route("/admin/v2/clusters", ("GET",), list_clusters, auth="none"),
        Route("/admin/v2/clusters/<seg:cluster>", ("GET",), get_cluster, auth="super"),
    ]
