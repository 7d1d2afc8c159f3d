"""The admin web service: the Werkzeug-routed admin app on gevent's WSGI server.

The routes come from :mod:`brokerlet.admin.routes` (one module per area, see
:mod:`brokerlet.admin.rest` for the contract). Errors are JSON objects with a ``reason``, as
Pulsar's admin API answers them. The application is a plain WSGI callable, so it also runs
under any other WSGI server.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any
from wsgiref.types import StartResponse, WSGIEnvironment

from gevent.pool import Pool
from gevent.pywsgi import LoggingLogAdapter, WSGIHandler, WSGIServer
from prometheus_client import CollectorRegistry

from brokerlet.admin._metrics import AllStats, StatsCollector, TopicStats
from brokerlet.admin.rest import AdminApp, AdminContext, Guard, Route
from brokerlet.admin.routes import all_routes

__all__ = ["AdminServer"]

log = logging.getLogger(__name__)
access_log = logging.getLogger(__name__ + ".access")


class _Handler(WSGIHandler):  # type: ignore[misc]  # gevent ships no type information
    """gevent's handler, also passing the raw request target to the application."""

    def get_environ(self) -> WSGIEnvironment:
        environ: WSGIEnvironment = super().get_environ()
        environ["RAW_URI"] = self.path
        return environ


class AdminServer:
    """Serves the admin API over HTTP on the current gevent hub.

    Handlers run on the greenlet handling the request, in the hub that called :meth:`start`
    (the broker's), so they may block on actor asks. An exception from one becomes a 500
    answer and a log record; the server keeps serving.

    Every response closes its connection: admin calls are rare, and no idle keep-alive
    connection is left to hold :meth:`stop` up.

    Args:
        host: address to listen on.
        port: port to listen on; 0 picks a free one (see :attr:`address`).
        topic_stats: returns one topic's stats by full name, or None for an unknown topic.
        all_stats: returns ``{topic name: stats}`` for every topic.
        cluster: the ``cluster`` label of every metric.
        max_connections: connections served at once; more wait in the listen backlog.
        context: what handlers reach the broker through; its ``topic_stats``, ``all_stats``,
            ``registry`` and ``web_service_url`` are filled in here.
        routes: what to mount (default: every module in :mod:`brokerlet.admin.routes`).
        guards: checks run before each handler (the security layer).
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        topic_stats: TopicStats,
        all_stats: AllStats,
        cluster: str = "brokerlet",
        max_connections: int = 64,
        context: AdminContext | None = None,
        routes: Iterable[Route] | None = None,
        guards: Sequence[Guard] = (),
    ) -> None:
        self.host = host
        self.port = port
        self._max_connections = max_connections
        # A private registry: an embedding program's global registry stays its own.
        self.registry = CollectorRegistry()
        self.registry.register(StatsCollector(all_stats, cluster=cluster))
        self.context = context if context is not None else AdminContext()
        self.context.topic_stats = topic_stats
        self.context.all_stats = all_stats
        self.context.registry = self.registry
        self.context.web_service_url = self._own_url
        self.app = AdminApp(all_routes() if routes is None else routes, self.context, guards)
        self._server: Any = None

    @property
    def address(self) -> tuple[str, int]:
        """The (host, port) listened on; the real port when 0 was asked."""
        if self._server is None:
            raise RuntimeError("admin server not started")
        host, port = self._server.address[:2]
        return str(host), int(port)

    def _own_url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}"

    def start(self) -> None:
        """Bind and start accepting in the current hub; returns at once."""
        if self._server is not None:
            raise RuntimeError("admin server already started")
        server = WSGIServer(
            (self.host, self.port),
            self.application,
            spawn=Pool(self._max_connections),
            handler_class=_Handler,
            log=LoggingLogAdapter(access_log, logging.DEBUG),
            error_log=log,
        )
        server.start()
        self._server = server
        log.info("admin endpoint on http://%s:%d", *self.address)

    def stop(self, timeout: float = 1.0) -> None:
        """Stop accepting, give requests in flight up to ``timeout`` seconds, close the rest.

        Idempotent; the server may be started again afterwards.
        """
        server, self._server = self._server, None
        if server is not None:
            server.stop(timeout=timeout)

    def application(
        self, environ: WSGIEnvironment, start_response: StartResponse
    ) -> Iterable[bytes]:
        """Answer one request (a WSGI application)."""
        return self.app(environ, start_response)
