"""Mounting contract routes in front of the stats app, until the issue-12a app replaces both.

Requests that match a route of :data:`brokerlet.admin.routes.MODULES` are served here (with
the route's ``auth`` level checked against the role the security wrapper set); anything else
goes on to ``fallback``, today's stats application, after the same check with the level its
route would have (:func:`_stats_level`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from http import HTTPStatus
from typing import Any
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from werkzeug.exceptions import MethodNotAllowed, NotFound
from werkzeug.routing import BaseConverter, Map, Rule
from werkzeug.wrappers import Request

from brokerlet.admin.rest import AdminContext, AdminRequest, Reply, RestError, Route
from brokerlet.admin.routes import MODULES
from brokerlet.security.http import PEER_CERT_KEY, ROLE_KEY, RouteRefused, check_route

__all__ = ["mount_routes"]

log = logging.getLogger(__name__)


class _Segment(BaseConverter):
    regex = "[^/]+"


class _Domain(BaseConverter):
    regex = "persistent|non-persistent"


def mount_routes(context: AdminContext, fallback: WSGIApplication) -> WSGIApplication:
    routes: list[Route] = [route for module in MODULES for route in module.routes()]
    url_map = Map(
        [Rule(r.rule, methods=list(r.methods), endpoint=i) for i, r in enumerate(routes)],
        converters={"seg": _Segment, "domain": _Domain},
        strict_slashes=False,
    )

    def application(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        adapter = url_map.bind_to_environ(environ)
        try:
            index, url_args = adapter.match()
        except NotFound:
            level, url_args = _stats_level(environ.get("PATH_INFO", ""))
            try:
                check_route(context.security, level, environ.get(ROLE_KEY), url_args)
            except RouteRefused as refused:
                return _answer(start_response, 403, {"reason": str(refused)})
            return fallback(environ, start_response)
        except MethodNotAllowed:
            return _answer(start_response, 405, {"reason": "Method Not Allowed"})
        route = routes[index]
        request = Request(environ)
        admin_request = AdminRequest(
            method=request.method,
            path=request.path,
            args=request.args,
            headers=dict(request.headers),
            body=request.get_data(),
            context=context,
            role=environ.get(ROLE_KEY),
            peer_cert=environ.get(PEER_CERT_KEY),
        )
        try:
            check_route(context.security, route.auth, admin_request.role, url_args)
            result = route.handler(admin_request, **url_args)
        except RouteRefused as refused:
            return _answer(start_response, 403, {"reason": str(refused)})
        except RestError as error:
            return _answer(start_response, error.status, {"reason": error.reason})
        except Exception as error:
            log.exception("admin request %s %s failed", request.method, request.path)
            return _answer(start_response, 500, {"reason": f"Internal error: {error!r}"})
        if result is None:
            return _answer(start_response, 204, None)
        if isinstance(result, Reply):
            return _answer(start_response, result.status, result.body, result.content_type)
        return _answer(start_response, 200, result)

    return application


def _stats_level(path: str) -> tuple[str, dict[str, str]]:
    """The auth level of the stats app's routes, as Pulsar guards them: topic stats and
    listings need the tenant's admin, broker-wide stats a super user; /metrics and the
    health check stay open (Pulsar's authenticateMetricsEndpoint defaults to false)."""
    parts = [p for p in path.split("/") if p]
    if parts[:3] == ["admin", "v2", "broker-stats"]:
        return "super", {}
    if (
        len(parts) >= 4
        and parts[:2] == ["admin", "v2"]
        and parts[2]
        in (
            "persistent",
            "non-persistent",
        )
    ):
        return "tenant", {"tenant": parts[3]}
    return "none", {}


def _answer(
    start_response: StartResponse, status: int, body: Any, content_type: str | None = None
) -> list[bytes]:
    if body is None:
        data = b""
    elif isinstance(body, bytes):
        data = body
    elif isinstance(body, str):
        data = body.encode()
    else:
        data = json.dumps(body).encode()
    headers = [("Content-Length", str(len(data))), ("Connection", "close")]
    if data:
        headers.append(("Content-Type", content_type or "application/json"))
    phrase = HTTPStatus(status).phrase
    start_response(f"{status} {phrase}", headers)
    return [data]
