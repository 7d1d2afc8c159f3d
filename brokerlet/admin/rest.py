"""The admin REST plug-in contract (minimal version; issue 12a's admin core replaces it).

Route modules (``brokerlet/admin/routes/<area>.py``) expose ``routes() -> list[Route]``; a
handler is called as ``handler(request, **url_args)`` on a greenlet of the broker's hub and
returns a JSON-able object (200), None (204) or a :class:`Reply`, or raises
:class:`RestError`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["AdminContext", "AdminRequest", "Reply", "RestError", "Route"]


class RestError(Exception):
    """Answered as ``{"reason": reason}`` with ``status`` (Pulsar's RestException)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: object
    headers: Mapping[str, str] = field(default_factory=dict)
    content_type: str | None = None


@dataclass(frozen=True, slots=True)
class Route:
    rule: str
    methods: tuple[str, ...]
    handler: Callable[..., object]
    auth: str = "tenant"


class AdminContext:
    """What handlers reach: the broker actor, settings, the metadata store, and more."""

    def __init__(self, broker: Any = None, settings: Any = None, metadata: Any = None) -> None:
        self.broker = broker
        self.settings = settings
        self.metadata = metadata


class AdminRequest:
    def __init__(
        self,
        *,
        method: str,
        path: str,
        args: Any,
        headers: Any,
        body: bytes,
        context: AdminContext,
        role: str | None = None,
        peer_cert: dict[str, Any] | None = None,
    ) -> None:
        self.method = method
        self.path = path
        self.args = args
        self.headers = headers
        self.body = body
        self.context = context
        self.role = role
        self.peer_cert = peer_cert

    def json(self) -> Any:
        """The parsed body (None when empty); malformed JSON is a 400 naming the problem."""
        if not self.body.strip():
            return None
        try:
            return json.loads(self.body)
        except ValueError as error:
            raise RestError(400, f"Malformed JSON body: {error}") from None
