"""Authentication for the web service: a WSGI wrapper and the HTTPS listener's handler.

:func:`authenticating` wraps any WSGI application (today's admin app or the Werkzeug one):
it authenticates each request with :meth:`Authentication.authenticate_http` and stores the
role in ``environ[ROLE_KEY]``, where the admin layer reads ``AdminRequest.role``. A refused
credential is answered 401 with Pulsar's ``{"reason": ...}`` body before the application
runs. What a role may do per route is decided by :func:`check_route` (403).

The HTTPS server uses :class:`CertHandler`, which puts the client's verified certificate in
``environ[PEER_CERT_KEY]``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any, Final
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from gevent.pool import Pool
from gevent.pywsgi import LoggingLogAdapter, WSGIHandler, WSGIServer

from brokerlet.security.authentication import AuthenticationFailed
from brokerlet.security.authorization import AuthAction
from brokerlet.security.service import Security

__all__ = [
    "PEER_CERT_KEY",
    "ROLE_KEY",
    "CertHandler",
    "RouteRefused",
    "authenticating",
    "check_route",
    "start_https",
]

log = logging.getLogger(__name__)

ROLE_KEY: Final = "brokerlet.role"
PEER_CERT_KEY: Final = "brokerlet.peer_cert"
OPEN_PATHS: Final = frozenset({"/metrics"})
"""Served without credentials: Pulsar's ``authenticateMetricsEndpoint`` defaults to false."""


def _headers(environ: WSGIEnvironment) -> dict[str, str]:
    headers = {}
    for key, value in environ.items():
        if key.startswith("HTTP_"):
            headers[key[5:].replace("_", "-").title()] = str(value)
    return headers


def authenticating(app: WSGIApplication, security: Security) -> WSGIApplication:
    """``app`` behind authentication; unchanged requests when authentication is off."""

    def application(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") in OPEN_PATHS:
            environ[ROLE_KEY] = None
            return app(environ, start_response)
        peer_cert = environ.get(PEER_CERT_KEY)
        try:
            role = security.authentication.authenticate_http(_headers(environ), peer_cert)
        except AuthenticationFailed as error:
            peer = f"{environ.get('REMOTE_ADDR')}:{environ.get('REMOTE_PORT')}"
            log.warning(
                "HTTP authentication failed for %s (%s %s): %s",
                peer,
                environ.get("REQUEST_METHOD"),
                environ.get("PATH_INFO"),
                error,
            )
            body = json.dumps({"reason": f"Authentication required: {error}"}).encode()
            start_response(
                "401 Unauthorized",
                [("Content-Type", "application/json"), ("Content-Length", str(len(body)))],
            )
            return [body]
        environ[ROLE_KEY] = role
        return app(environ, start_response)

    return application


class RouteRefused(Exception):  # noqa: N818 - an outcome, answered 403
    """The role may not use the route; ``str()`` is the reason."""


def check_route(
    security: Security | None, auth: str, role: str | None, url_args: Mapping[str, Any]
) -> None:
    """Apply a route's ``auth`` level (the admin contract's ``Route.auth``) to a role.

    Levels: ``none``; ``super``; ``tenant`` (super users and the tenant's admins);
    ``produce`` / ``consume`` / ``lookup`` (namespace permissions on the topic's namespace).

    Raises:
        RouteRefused: the role may not; the refusal is logged with the role and the level.
    """
    if security is None or auth == "none" or not security.authorizer.enabled:
        return
    authorizer = security.authorizer
    tenant = str(url_args.get("tenant", ""))
    namespace = str(url_args.get("namespace", ""))
    if auth == "super":
        allowed = authorizer.is_super_user(role)
    elif auth == "tenant":
        allowed = authorizer.is_tenant_admin(role, tenant)
    elif auth in ("produce", "consume"):
        allowed = authorizer.allows_namespace(role, tenant, namespace, AuthAction(auth))
    elif auth == "lookup":
        allowed = authorizer.allows_namespace(
            role, tenant, namespace, AuthAction.PRODUCE
        ) or authorizer.allows_namespace(role, tenant, namespace, AuthAction.CONSUME)
    else:
        allowed = authorizer.is_super_user(role)  # an unknown level: only super users
    target = "/".join(p for p in (tenant, namespace) if p) or "the broker"
    if not authorizer.check(allowed, role, f"use a {auth!r} admin route on", target, "http"):
        raise RouteRefused(f"Role {role!r} is not authorized ({auth} access to {target})")


class CertHandler(WSGIHandler):  # type: ignore[misc]  # gevent ships no type information
    """gevent's handler, also passing the raw target and the TLS client certificate on."""

    def get_environ(self) -> WSGIEnvironment:
        environ: WSGIEnvironment = super().get_environ()
        environ.setdefault("RAW_URI", self.path)
        getpeercert = getattr(self.socket, "getpeercert", None)
        cert = getpeercert() if getpeercert is not None else None
        environ[PEER_CERT_KEY] = dict(cert) if cert else None
        return environ


def start_https(host: str, port: int, app: WSGIApplication, context: Any) -> Any:
    """Serve ``app`` over HTTPS on the current hub (the ``webServicePortTls`` listener).

    Returns:
        The started gevent ``WSGIServer``; its ``address`` has the bound port.
    """
    server = WSGIServer(
        (host, port),
        app,
        spawn=Pool(64),
        handler_class=CertHandler,
        ssl_context=context,
        log=LoggingLogAdapter(logging.getLogger("brokerlet.admin.https.access"), logging.DEBUG),
        error_log=log,
    )
    server.start()
    return server
