"""The admin HTTP endpoint: Pulsar-shaped stats, a health check and Prometheus metrics.

Routes, all GET (another method on a known route gets 405):

=========================================================================  =====================
``/admin/v2/{persistent|non-persistent}/{tenant}/{namespace}/{topic}/stats``  one topic's stats
``/admin/v2/{persistent|non-persistent}/{tenant}/{namespace}``                its topics' names
``/admin/v2/broker-stats/topics``                                            every topic's stats
``/admin/v2/brokers/health``                                                 ``ok``
``/metrics``                                                                 Prometheus text
=========================================================================  =====================

Errors are JSON objects with a ``reason``, as Pulsar's admin API answers them. The server is
gevent's WSGI server; the application is a plain WSGI callable, so it also runs under any
other WSGI server.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from http import HTTPStatus
from typing import Any, NamedTuple
from urllib.parse import unquote, urlsplit
from wsgiref.types import StartResponse, WSGIEnvironment

from gevent.pool import Pool
from gevent.pywsgi import LoggingLogAdapter, WSGIHandler, WSGIServer
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from brokerlet.admin._metrics import AllStats, StatsCollector, TopicStats
from brokerlet.admin._mount import Mounted

__all__ = ["AdminServer"]

log = logging.getLogger(__name__)
access_log = logging.getLogger(__name__ + ".access")

DOMAINS = ("persistent", "non-persistent")


class _Response(NamedTuple):
    status: int
    content_type: str
    body: bytes
    extra_headers: tuple[tuple[str, str], ...] = ()


def _json_fallback(value: object) -> object:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, set | frozenset):
        return list(value)
    return str(value)


def _json(status: int, document: object, *extra_headers: tuple[str, str]) -> _Response:
    body = json.dumps(document, default=_json_fallback).encode()
    return _Response(status, "application/json", body, extra_headers)


def _text(status: int, text: str) -> _Response:
    return _Response(status, "text/plain; charset=utf-8", text.encode())


def _path_segments(environ: WSGIEnvironment) -> list[str] | None:
    """The request path as decoded segments; None when a segment is empty (``//``).

    Segments are split before they are percent-decoded, so ``a%2Fb`` stays one segment. That
    needs the raw request target (``RAW_URI``, set by our handler as gunicorn does); other
    servers give only the decoded ``PATH_INFO``, which is used as it is.
    """
    raw = environ.get("RAW_URI")
    if isinstance(raw, str):
        segments = [unquote(s) for s in urlsplit(raw).path.split("/")]
    else:
        # PEP 3333: PATH_INFO carries the decoded bytes as latin-1.
        path_info = str(environ.get("PATH_INFO", ""))
        segments = path_info.encode("latin-1").decode("utf-8", "replace").split("/")
    if segments and segments[0] == "":
        segments.pop(0)
    if len(segments) > 1 and segments[-1] == "":
        segments.pop()  # one trailing slash is tolerated
    if not segments or "" in segments:
        return None
    return segments


class _Handler(WSGIHandler):  # type: ignore[misc]  # gevent ships no type information
    """gevent's handler, also passing the raw request target to the application."""

    def get_environ(self) -> WSGIEnvironment:
        environ: WSGIEnvironment = super().get_environ()
        environ["RAW_URI"] = self.path
        return environ


class AdminServer:
    """Serves broker stats over HTTP on the current gevent hub.

    The stats callables run on the greenlet handling the request, in the hub that called
    :meth:`start` (the broker's), so they may block on actor asks. An exception from either
    becomes a 500 answer and a log record; the server keeps serving.

    Every response closes its connection: scrapes are rare, and no idle keep-alive connection
    is left to hold :meth:`stop` up.

    Args:
        host: address to listen on.
        port: port to listen on; 0 picks a free one (see :attr:`address`).
        topic_stats: returns one topic's stats by full name, or None for an unknown topic.
        all_stats: returns ``{topic name: stats}`` for every topic.
        cluster: the ``cluster`` label of every metric.
        max_connections: connections served at once; more wait in the listen backlog.
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
        mounted: Mounted | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self._topic_stats = topic_stats
        self._all_stats = all_stats
        self._max_connections = max_connections
        self._mounted = mounted  # contract route modules (brokerlet.admin.routes)
        # A private registry: an embedding program's global registry stays its own.
        self.registry = CollectorRegistry()
        self.registry.register(StatsCollector(all_stats, cluster=cluster))
        self._server: Any = None

    @property
    def address(self) -> tuple[str, int]:
        """The (host, port) listened on; the real port when 0 was asked."""
        if self._server is None:
            raise RuntimeError("admin server not started")
        host, port = self._server.address[:2]
        return str(host), int(port)

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

    # The WSGI application.

    def application(
        self, environ: WSGIEnvironment, start_response: StartResponse
    ) -> Iterable[bytes]:
        """Answer one request (a WSGI application)."""
        response = self._respond(environ)
        headers = [
            ("Content-Type", response.content_type),
            ("Content-Length", str(len(response.body))),
            ("Connection", "close"),
            *response.extra_headers,
        ]
        status = HTTPStatus(response.status)
        start_response(f"{status.value} {status.phrase}", headers)
        return [response.body]

    def _respond(self, environ: WSGIEnvironment) -> _Response:
        if self._mounted is not None:
            answer = self._mounted.respond(dict(environ))
            if answer is not None:
                return _Response(*answer)
        segments = _path_segments(environ)
        route = None if segments is None else self._route(segments, environ)
        if route is None:
            return _json(404, {"reason": "Not Found"})
        if environ.get("REQUEST_METHOD") != "GET":
            return _json(405, {"reason": "Method Not Allowed"}, ("Allow", "GET"))
        try:
            return route()
        except Exception as error:
            log.exception("admin request %s failed", environ.get("PATH_INFO"))
            return _json(500, {"reason": f"Internal error: {type(error).__name__}: {error}"})

    def _route(
        self, segments: list[str], environ: WSGIEnvironment
    ) -> Callable[[], _Response] | None:
        match segments:
            case ["metrics"]:
                return partial(self._metrics, str(environ.get("HTTP_ACCEPT", "")))
            case ["admin", "v2", "brokers", "health"]:
                return partial(_text, 200, "ok")
            case ["admin", "v2", "broker-stats", "topics"]:
                return self._every_topic
            case ["admin", "v2", domain, tenant, namespace, topic, "stats"] if domain in DOMAINS:
                return partial(self._one_topic, f"{domain}://{tenant}/{namespace}/{topic}")
            case ["admin", "v2", domain, tenant, namespace] if domain in DOMAINS:
                return partial(self._topic_names, f"{domain}://{tenant}/{namespace}/")
        return None

    def _one_topic(self, name: str) -> _Response:
        stats = self._topic_stats(name)
        if stats is None:
            return _json(404, {"reason": "Topic not found"})
        return _json(200, stats)

    def _topic_names(self, prefix: str) -> _Response:
        # No namespace registry: a namespace with no topics lists as empty.
        return _json(200, sorted(name for name in self._all_stats() if name.startswith(prefix)))

    def _every_topic(self) -> _Response:
        return _json(200, self._all_stats())

    def _metrics(self, accept: str) -> _Response:
        encode, content_type = choose_encoder(accept)
        return _Response(200, content_type, encode(self.registry))
