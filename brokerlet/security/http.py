"""Security for the web service: the admin app's guard and the HTTPS listener.

:func:`admin_guard` is the guard the admin app runs before each handler: it authenticates
the request with :meth:`Authentication.authenticate_http`, sets ``request.role``, and applies
the route's ``auth`` level with :func:`check_route` (401 / 403, Pulsar's ``{"reason": ...}``).

The HTTPS server (:func:`start_https`) uses :class:`CertHandler`, which puts the client's
verified certificate in ``environ[PEER_CERT_KEY]``, where ``AdminRequest.peer_cert`` reads it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Final
from wsgiref.types import WSGIApplication, WSGIEnvironment

from gevent.pool import Pool
from gevent.pywsgi import LoggingLogAdapter, WSGIHandler, WSGIServer

from brokerlet.admin.rest import RestError
from brokerlet.security.authentication import AuthenticationFailed
from brokerlet.security.authorization import AuthAction
from brokerlet.security.service import Security

__all__ = [
    "PEER_CERT_KEY",
    "CertHandler",
    "RouteRefused",
    "admin_guard",
    "check_route",
    "start_https",
]

log = logging.getLogger(__name__)

PEER_CERT_KEY: Final = "brokerlet.peer_cert"
"""Where :class:`CertHandler` puts the client certificate (``AdminRequest.peer_cert``)."""


def admin_guard(security: Security) -> Callable[[Any, Any], None]:
    """The admin app's guard (``guard(request, route)``, see :mod:`brokerlet.admin.rest`).

    Authenticates the request (Bearer, Basic or the HTTPS client certificate), sets
    ``request.role``, then applies the route's ``auth`` level: a refused credential is a 401,
    a role that may not is a 403, both ``{"reason": ...}`` and logged with the peer.
    ``auth="none"`` routes (``/metrics``, readiness) need no credentials, as with Pulsar's
    default ``authenticateMetricsEndpoint=false``.
    """

    def guard(request: Any, route: Any) -> None:
        if route.auth == "none" or not security.authentication.enabled:
            return
        try:
            role = security.authentication.authenticate_http(request.headers, request.peer_cert)
        except AuthenticationFailed as error:
            environ = request.environ
            peer = f"{environ.get('REMOTE_ADDR')}:{environ.get('REMOTE_PORT')}"
            log.warning(
                "HTTP authentication failed for %s (%s %s): %s",
                peer,
                request.method,
                request.path,
                error,
            )
            raise RestError(401, f"Authentication required: {error}") from None
        request.role = role
        try:
            check_route(security, route.auth, role, request.url_args)
        except RouteRefused as refused:
            raise RestError(403, str(refused)) from None

    return guard


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
