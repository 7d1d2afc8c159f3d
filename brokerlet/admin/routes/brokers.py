"""Broker liveness: ``/admin/v2/brokers/health``, ``/admin/v2/brokers/ready``, ``/status.html``."""

from __future__ import annotations

from brokerlet.admin.rest import AdminRequest, Reply, Route

__all__ = ["routes"]


def health(_request: AdminRequest) -> Reply:
    # Pulsar's BrokersBase.healthCheck answers the text "ok".
    return Reply(200, "ok")


def ready(_request: AdminRequest) -> Reply:
    # BrokersBase.isReady: "ok" once the broker service is up, which it is when we serve.
    return Reply(200, "ok")


def status_page(_request: AdminRequest) -> Reply:
    # Pulsar's VipStatus answers "OK" (load balancers probe it).
    return Reply(200, "OK")


def routes() -> list[Route]:
    return [
        Route("/admin/v2/brokers/health", ("GET",), health, auth="super"),
        Route("/admin/v2/brokers/ready", ("GET",), ready, auth="none"),
        Route("/status.html", ("GET",), status_page, auth="none"),
    ]
