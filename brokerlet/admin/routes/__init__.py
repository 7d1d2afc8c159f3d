"""Route modules of the admin REST API; each exposes ``routes() -> list[Route]``."""

from brokerlet.admin.routes import schemas

MODULES = (schemas,)
"""The modules the admin application mounts."""

__all__ = ["MODULES", "schemas"]
