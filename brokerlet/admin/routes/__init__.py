"""The admin API's route modules; :func:`all_routes` is what the app mounts.

Each area has a module here exposing ``routes() -> list[Route]`` (see
:mod:`brokerlet.admin.rest`); add yours to ``MODULES``.
"""

from __future__ import annotations

import functools

from brokerlet.admin.rest import Route
from brokerlet.admin.routes import (
    brokers,
    clusters,
    compaction,
    lookup,
    namespaces,
    schemas,
    stats,
    tenants,
    topics,
    topics_ops,
)

__all__ = ["MODULES", "all_routes"]

MODULES = (
    stats,
    brokers,
    clusters,
    tenants,
    namespaces,
    topics,
    topics_ops,
    lookup,
    schemas,
    compaction,
)


@functools.cache
def _mounted() -> tuple[Route, ...]:
    return tuple(route for module in MODULES for route in module.routes())


def all_routes() -> list[Route]:
    """Every route of every module, in mounting order (the same objects on every call, so
    the app's compiled URL map is built once per process)."""
    return list(_mounted())
