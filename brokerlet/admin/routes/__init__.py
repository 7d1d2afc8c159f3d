"""Route modules the admin app mounts; each exposes ``routes() -> list[Route]``."""

from brokerlet.admin.routes import permissions

MODULES = (permissions,)

__all__ = ["MODULES"]
