"""Route modules the admin app mounts (each exposes ``routes() -> list[Route]``)."""

from __future__ import annotations

from brokerlet.admin.rest import Route
from brokerlet.admin.routes import topics_ops

__all__ = ["MODULES", "all_routes"]

MODULES = (topics_ops,)


def all_routes() -> list[Route]:
    return [route for module in MODULES for route in module.routes()]
