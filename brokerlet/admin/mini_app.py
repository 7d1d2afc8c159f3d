"""A small Werkzeug WSGI application that mounts contract :class:`Route` lists.

A stop-gap until issue 12's admin web service mounts ``brokerlet/admin/routes/``: it serves
the schema routes behind :class:`~brokerlet.admin.http.AdminServer` (which hands it every
path it does not route itself) and in tests. It follows the contract: a handler's return
value is JSON with 200, ``None`` is 204, a :class:`Reply` is sent as it is, a
:class:`RestError` is ``{"reason": ...}`` with its status, anything else a logged 500.
There is no security layer here: ``request.role`` is None (auth off).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from http import HTTPStatus
from typing import Any
from wsgiref.types import StartResponse, WSGIEnvironment

from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound
from werkzeug.routing import BaseConverter, Map, Rule
from werkzeug.wrappers import Request

from brokerlet.admin.rest import AdminContext, AdminRequest, Reply, RestError, Route
from brokerlet.admin.routes import MODULES

__all__ = ["RestApp", "schema_admin_app"]

log = logging.getLogger(__name__)


class _Segment(BaseConverter):
    regex = "[^/]+"


class _Domain(BaseConverter):
    regex = "persistent|non-persistent"


class RestApp:
    """Serve ``routes`` with ``context`` as a WSGI application."""

    def __init__(self, routes: Sequence[Route], context: AdminContext) -> None:
        self.context = context
        self._handlers = {}
        rules = []
        for index, route in enumerate(routes):
            endpoint = f"r{index}"
            self._handlers[endpoint] = route
            rules.append(Rule(route.rule, methods=list(route.methods), endpoint=endpoint))
        self._map = Map(rules, converters={"seg": _Segment, "domain": _Domain})

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        status, body, headers = self._respond(Request(environ))
        phrase = HTTPStatus(status).phrase
        start_response(f"{status} {phrase}", [*headers, ("Content-Length", str(len(body)))])
        return [body]

    def matches(self, path: str, method: str) -> bool:
        """Whether a route serves ``path`` (any method, so a wrong one still gets 405)."""
        try:
            self._map.bind("localhost").match(path, method=method)
        except MethodNotAllowed:
            return True
        except HTTPException:
            return False
        return True

    def _respond(self, request: Request) -> tuple[int, bytes, list[tuple[str, str]]]:
        adapter = self._map.bind_to_environ(request.environ)
        try:
            endpoint, arguments = adapter.match()
        except NotFound:
            return _error(404, "Not Found")
        except MethodNotAllowed as error:
            allowed = ", ".join(error.valid_methods or ())
            status, body, headers = _error(405, "Method Not Allowed")
            return status, body, [*headers, ("Allow", allowed)]
        except HTTPException as error:
            return _error(error.code or 400, error.description or "Bad Request")
        route = self._handlers[str(endpoint)]
        admin_request = AdminRequest(
            method=request.method,
            path=request.path,
            args=request.args,
            headers=request.headers,
            body=request.get_data(),
            context=self.context,
        )
        try:
            result = route.handler(admin_request, **arguments)
        except RestError as error:
            return _error(error.status, error.reason)
        except Exception as error:
            log.exception("admin request %s %s failed", request.method, request.path)
            return _error(500, f"Internal error: {type(error).__name__}: {error}")
        if result is None:
            return 204, b"", []
        if isinstance(result, Reply):
            return _encode(result.status, result.body, result.content_type, dict(result.headers))
        return _encode(200, result, None, {})


def _encode(
    status: int, body: object, content_type: str | None, extra: dict[str, str]
) -> tuple[int, bytes, list[tuple[str, str]]]:
    if isinstance(body, bytes):
        data, kind = body, content_type or "application/octet-stream"
    elif isinstance(body, str):
        data, kind = body.encode(), content_type or "text/plain; charset=utf-8"
    else:
        data, kind = json.dumps(body).encode(), content_type or "application/json"
    return status, data, [("Content-Type", kind), *extra.items()]


def _error(status: int, reason: str) -> tuple[int, bytes, list[tuple[str, str]]]:
    return _encode(status, {"reason": reason}, None, {})


def schema_admin_app(schemas: Any, settings: Any, broker: Any = None) -> RestApp:
    """The schema routes over ``schemas`` (a SchemaRegistry) as a WSGI application."""
    routes = [route for module in MODULES for route in module.routes()]
    return RestApp(routes, AdminContext(broker=broker, settings=settings, schemas=schemas))
