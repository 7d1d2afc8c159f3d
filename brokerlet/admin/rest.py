"""The admin REST plug-in contract (shared by the issue 12, 17 and 18 work).

A minimal version written on the issue-17 branch with exactly the contract's names; the
issue-12a Werkzeug app replaces it at merge. Route modules under ``brokerlet.admin.routes``
depend only on these names.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from werkzeug.datastructures import MultiDict

__all__ = ["AdminContext", "AdminRequest", "Reply", "RestError", "Route"]


class RestError(Exception):
    """A 4xx answer: ``{"reason": reason}`` with ``status``."""

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
    """What handlers reach: the broker actor, settings, metadata, security, ..."""

    def __init__(self, **attributes: Any) -> None:
        self.broker: Any = None
        self.settings: Any = None
        self.metadata: Any = None
        self.security: Any = None
        for name, value in attributes.items():
            setattr(self, name, value)


class AdminRequest:
    def __init__(
        self,
        *,
        method: str,
        path: str,
        args: MultiDict[str, str],
        headers: Mapping[str, str],
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
        """The parsed body; malformed JSON is a 400 naming the problem."""
        try:
            return json.loads(self.body or b"null")
        except ValueError as error:
            raise RestError(400, f"Malformed JSON body: {error}") from None
