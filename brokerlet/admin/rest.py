"""The admin REST plug-in contract (``admin-contract.md``), in its minimal form.

Feature areas contribute :class:`Route` lists from ``brokerlet/admin/routes/<area>.py``. The
admin web service of issue 12 mounts them; until it lands, :mod:`brokerlet.admin.mini_app`
mounts them in a small Werkzeug application. This module has exactly the contract's names;
issue 12's version replaces it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "AdminContext",
    "AdminRequest",
    "Reply",
    "RestError",
    "Route",
    "optional_field",
    "require_field",
]


class RestError(Exception):
    """Answered as ``{"reason": reason}`` with ``status``, Pulsar's error shape."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Reply:
    """A handler's answer when 200 with a JSON body is not the right one."""

    status: int
    body: object
    headers: Mapping[str, str] = field(default_factory=dict)
    content_type: str | None = None


@dataclass(frozen=True, slots=True)
class Route:
    """One route: a Werkzeug rule, its methods, its handler and what auth checks."""

    rule: str
    methods: tuple[str, ...]
    handler: Callable[..., object]
    auth: str = "tenant"


class AdminContext:
    """What handlers reach: the broker actor, settings, metadata store, and area objects."""

    def __init__(
        self, *, broker: Any = None, settings: Any = None, metadata: Any = None, **extra: Any
    ) -> None:
        self.broker = broker
        self.settings = settings
        self.metadata = metadata
        for name, value in extra.items():
            setattr(self, name, value)


class AdminRequest:
    """One request as a handler sees it."""

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
        """The parsed body.

        Raises:
            RestError: 400 when the body is not JSON.
        """
        try:
            return json.loads(self.body or b"null")
        except ValueError as error:
            raise RestError(400, f"Malformed JSON body: {error}") from None


def require_field(body: object, name: str, kind: type | tuple[type, ...]) -> Any:
    """``body[name]``, which must exist and be of ``kind``; else a 400 naming the field."""
    if not isinstance(body, dict):
        raise RestError(400, "The request body must be a JSON object")
    if name not in body or body[name] is None:
        raise RestError(400, f"Missing field {name!r}")
    value = body[name]
    if not isinstance(value, kind):
        raise RestError(400, f"Field {name!r} has the wrong type ({type(value).__name__})")
    return value


def optional_field(body: object, name: str, kind: type | tuple[type, ...], default: Any) -> Any:
    """``body[name]`` if present and not null (it must be of ``kind``), else ``default``."""
    if isinstance(body, dict) and body.get(name) is not None:
        return require_field(body, name, kind)
    return default
