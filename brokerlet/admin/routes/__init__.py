"""The admin API's route modules; :func:`all_routes` is what the app mounts.

Each area has a module here exposing ``routes() -> list[Route]`` (see
:mod:`brokerlet.admin.rest`); add yours to ``MODULES``.
"""

from __future__ import annotations

from brokerlet.admin.rest import Route
from brokerlet.admin.routes import (
    brokers,
    clusters,
    lookup,
    namespaces,
    stats,
    tenants,
    topics,
)

__all__ = ["MODULES", "all_routes"]

MODULES = (stats, brokers, clusters, tenants, namespaces, topics, lookup)


def all_routes() -> list[Route]:
    """Every route of every module, in mounting order."""
    return [route for module in MODULES for route in module.routes()]
