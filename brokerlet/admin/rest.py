"""The admin REST plug-in contract: routes, requests, replies and errors.

Each feature area contributes a module ``brokerlet/admin/routes/<area>.py`` with a
``routes() -> list[Route]``; :class:`AdminApp` mounts them on one Werkzeug map and serves
them as a WSGI application (gevent's WSGI server runs it, see :mod:`brokerlet.admin.http`).

A handler is called on a greenlet of the broker's hub as ``handler(request, **url_args)`` and
may block on actor asks. It returns a JSON-able object (200), ``None`` (204) or a
:class:`Reply`, and raises :class:`RestError` for a 4xx answer. Any other exception is a
logged 500. Errors are ``{"reason": ...}``, as Pulsar's admin API answers them.

Rule syntax is Werkzeug's, with these converters:

``seg``     one path segment, percent-decoded; ``%2F`` stays inside the segment
``domain``  ``persistent`` or ``non-persistent``
``int``, ``path``  Werkzeug's own (``path`` percent-decoded like ``seg``)

Guards (the security layer) run before each handler as ``guard(request, route)``; one may set
``request.role`` or raise ``RestError(401 | 403, ...)``.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Final, TypeVar, overload
from urllib.parse import unquote, urlsplit
from wsgiref.types import StartResponse, WSGIEnvironment

from werkzeug.datastructures import Headers, MultiDict
from werkzeug.exceptions import MethodNotAllowed, NotFound
from werkzeug.routing import BaseConverter, Map, PathConverter, Rule
from werkzeug.wrappers import Request

__all__ = [
    "AdminApp",
    "AdminContext",
    "AdminRequest",
    "Guard",
    "Reply",
    "RestError",
    "Route",
    "expect",
    "json_object",
    "optional_field",
    "query_bool",
    "query_int",
    "require_field",
    "required_field",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_BODY_BYTES: Final = 16 * 1024 * 1024
"""Request bodies above this are refused (413) before they are read."""


class RestError(Exception):
    """A 4xx (or other non-2xx) answer: ``{"reason": reason}`` with ``status``."""

    def __init__(self, status: int, reason: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.headers: Mapping[str, str] = headers or {}


@dataclass(frozen=True, slots=True)
class Reply:
    """A handler's answer when it is not a plain 200 JSON document or a 204.

    ``body`` is JSON-able, or ``bytes``/``str`` sent as they are.
    """

    status: int
    body: object = None
    headers: Mapping[str, str] = field(default_factory=dict)
    content_type: str | None = None


@dataclass(frozen=True, slots=True)
class Route:
    """One route: a Werkzeug rule, its methods, its handler and what security checks."""

    rule: str
    methods: tuple[str, ...]
    handler: Callable[..., object]
    auth: str = "tenant"  # "none", "super", "tenant", "produce", "consume", "lookup"


class AdminContext:
    """What handlers reach the broker through; whoever builds the app sets these.

    Attributes:
        broker: the BrokerActor's ``pykka.ActorRef`` (None in tests of the HTTP layer).
        settings: the broker's settings.
        metadata: the metadata store (:class:`brokerlet.metadata.MetadataStore`).
        topic_stats: one topic's stats by full name, or None for an unknown topic.
        all_stats: ``{topic name: stats}`` for every topic.
        registry: the Prometheus registry ``/metrics`` renders.
        web_service_url: this web service's own ``http://host:port``.
        service_url: the ``pulsar://`` URL lookups answer.
        schemas: the schema registry (the schema area sets it).
        security: the authentication and authorization services (the security area).

    Any other keyword becomes an attribute too, for areas that add their own.
    """

    def __init__(
        self,
        *,
        broker: Any = None,
        settings: Any = None,
        metadata: Any = None,
        topic_stats: Callable[[str], Mapping[str, Any] | None] | None = None,
        all_stats: Callable[[], Mapping[str, Mapping[str, Any]]] | None = None,
        registry: Any = None,
        web_service_url: Callable[[], str] | None = None,
        service_url: Callable[[], str] | None = None,
        schemas: Any = None,
        security: Any = None,
        **extra: Any,
    ) -> None:
        self.broker = broker
        self.settings = settings
        self.metadata = metadata
        self.topic_stats = topic_stats
        self.all_stats = all_stats
        self.registry = registry
        self.web_service_url = web_service_url
        self.service_url = service_url
        self.schemas = schemas
        self.security = security
        for name, value in extra.items():
            setattr(self, name, value)


class AdminRequest:
    """One admin request, as a handler sees it."""

    def __init__(self, environ: WSGIEnvironment, context: AdminContext) -> None:
        self._request = Request(environ)
        self._request.max_content_length = MAX_BODY_BYTES
        self.environ = environ
        self.context = context
        self.role: str | None = None
        self.peer_cert: Mapping[str, Any] | None = environ.get("brokerlet.peer_cert")
        self.url_args: Mapping[str, Any] = {}
        self._body: bytes | None = None

    @property
    def method(self) -> str:
        return str(self._request.method)

    @property
    def path(self) -> str:
        return str(self._request.path)

    @property
    def args(self) -> MultiDict[str, str]:
        return self._request.args

    @property
    def headers(self) -> Headers:
        return self._request.headers

    @property
    def body(self) -> bytes:
        if self._body is None:
            length = self._request.content_length
            if length is not None and length > MAX_BODY_BYTES:
                raise RestError(413, f"Request body over {MAX_BODY_BYTES} bytes")
            self._body = self._request.get_data(cache=True)
        return self._body

    @property
    def content_type(self) -> str:
        return str(self._request.mimetype)

    def json(self, default: object = ...) -> Any:
        """The parsed body; an empty body gives ``default`` (or a 400 when none is given)."""
        body = self.body
        if not body.strip():
            if default is ...:
                raise RestError(400, "Request body is empty; a JSON value is required")
            return default
        try:
            return json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise RestError(400, f"Malformed JSON body: {error}") from None


Guard = Callable[[AdminRequest, Route], None]


# Body and query validation: each names the field in its 400 reason.


def _type_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }
    return " or ".join(names.get(k, k.__name__) for k in kinds)


@overload
def expect(value: object, kind: type[T], name: str) -> T: ...
@overload
def expect(value: object, kind: tuple[type, ...], name: str) -> Any: ...
def expect(value: object, kind: type | tuple[type, ...], name: str) -> Any:
    """``value`` if it is of ``kind``, else a 400 naming ``name`` (bool is not an int)."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        ok = False
    elif float in kinds and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    else:
        ok = isinstance(value, kinds)
    if not ok:
        raise RestError(400, f"{name}: must be {_type_name(kind)}, got {json.dumps(value)}")
    return value


def json_object(request: AdminRequest, *, default: object = ...) -> dict[str, Any]:
    """The body as a JSON object (400 otherwise)."""
    document = request.json(default)
    if not isinstance(document, dict):
        raise RestError(400, f"Request body must be a JSON object, got {json.dumps(document)}")
    return document


def required_field(document: object, name: str, kind: type | tuple[type, ...]) -> Any:
    """``document[name]``, present, not null and of ``kind``; else a 400 naming the field."""
    if not isinstance(document, Mapping):
        raise RestError(400, f"Request body must be a JSON object, got {json.dumps(document)}")
    if document.get(name) is None:
        raise RestError(400, f"{name}: required")
    return expect(document[name], kind, name)


require_field = required_field
"""The same, under the name other areas' first versions of this module used."""


def optional_field(document: object, name: str, kind: type | tuple[type, ...], default: T) -> Any:
    """``document[name]`` when present and not null (it must be of ``kind``), else ``default``."""
    if not isinstance(document, Mapping) or document.get(name) is None:
        return default
    return expect(document[name], kind, name)


def query_bool(request: AdminRequest, name: str, default: bool = False) -> bool:
    raw = request.args.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("true", "1"):
        return True
    if raw.lower() in ("false", "0"):
        return False
    raise RestError(400, f"{name}: must be true or false, got {raw!r}")


def query_int(request: AdminRequest, name: str, default: int) -> int:
    raw = request.args.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise RestError(400, f"{name}: must be an integer, got {raw!r}") from None


# Routing.


class _SegmentConverter(BaseConverter):
    """One path segment; the match path keeps ``/`` and ``%`` encoded inside segments."""

    def to_python(self, value: str) -> str:
        return unquote(value)


class _PathConverter(PathConverter):
    def to_python(self, value: str) -> str:
        return unquote(value)


class _DomainConverter(BaseConverter):
    regex = "persistent|non-persistent"


def _match_path(environ: WSGIEnvironment) -> str:
    """The request path with each segment decoded except for ``%`` and ``/``.

    Segments are split before they are percent-decoded, so ``a%2Fb`` stays one segment.
    That needs the raw request target (``RAW_URI``, set by our handler as gunicorn does);
    other servers give only the decoded ``PATH_INFO``, which is used as it is.
    """
    raw = environ.get("RAW_URI")
    if isinstance(raw, str):
        segments = urlsplit(raw).path.split("/")
    else:
        # PEP 3333: PATH_INFO carries the decoded bytes as latin-1.
        path_info = str(environ.get("PATH_INFO", ""))
        decoded = path_info.encode("latin-1").decode("utf-8", "replace")
        segments = [s.replace("%", "%25") for s in decoded.split("/")]
    return "/".join(unquote(s).replace("%", "%25").replace("/", "%2F") for s in segments)


def _json_fallback(value: object) -> object:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, set | frozenset):
        return list(value)
    return str(value)


class AdminApp:
    """The admin WSGI application over a list of routes.

    Args:
        routes: what to mount; rules must be unique per method.
        context: what handlers see as ``request.context``.
        guards: run in order before each handler (the security layer).
    """

    def __init__(
        self,
        routes: Iterable[Route],
        context: AdminContext,
        guards: Sequence[Guard] = (),
    ) -> None:
        self.context = context
        self.guards = list(guards)
        self.routes = tuple(routes)
        self.url_map = _url_map(self.routes)
        self._adapter = self.url_map.bind("localhost")

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        reply = self.respond(environ)
        body, content_type = _encode(reply)
        headers = [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            ("Connection", "close"),
            *reply.headers.items(),
        ]
        try:
            phrase = HTTPStatus(reply.status).phrase
        except ValueError:
            phrase = "Unknown"
        start_response(f"{reply.status} {phrase}", headers)
        return [body]

    def respond(self, environ: WSGIEnvironment) -> Reply:
        method = str(environ.get("REQUEST_METHOD", "GET")).upper()
        try:
            route, url_args = self._adapter.match(_match_path(environ), method)
        except NotFound:
            return Reply(404, {"reason": "Not Found"})
        except MethodNotAllowed as error:
            allowed = ", ".join(sorted(error.valid_methods or ()))
            return Reply(405, {"reason": "Method Not Allowed"}, {"Allow": allowed})
        request = AdminRequest(environ, self.context)
        request.url_args = url_args  # guards check the tenant/namespace a route names
        try:
            for guard in self.guards:
                guard(request, route)
            result = route.handler(request, **url_args)
        except RestError as error:
            return Reply(error.status, {"reason": error.reason}, error.headers)
        except Exception as error:
            log.exception("admin request %s %s failed", method, environ.get("PATH_INFO"))
            return Reply(500, {"reason": f"Internal error: {type(error).__name__}: {error}"})
        if isinstance(result, Reply):
            return result
        if result is None:
            return Reply(204, b"")
        return Reply(200, result)


@functools.lru_cache(maxsize=8)
def _url_map(routes: tuple[Route, ...]) -> Map:
    """The Werkzeug map of ``routes``, built once per process for the same routes: Werkzeug
    compiles a URL builder per rule (about 1 ms each), which a broker's start should not pay
    every time."""
    rules = []
    for route in routes:
        rule = Rule(route.rule, endpoint=route, methods=list(route.methods))
        # Werkzeug answers HEAD for every GET rule; Pulsar's API has no HEAD routes.
        if "HEAD" not in route.methods and rule.methods is not None:
            rule.methods.discard("HEAD")
        rules.append(rule)
    return Map(
        rules,
        converters={
            "seg": _SegmentConverter,
            "domain": _DomainConverter,
            "path": _PathConverter,
        },
        merge_slashes=False,
        strict_slashes=False,
    )


def _encode(reply: Reply) -> tuple[bytes, str]:
    body = reply.body
    if isinstance(body, bytes):
        return body, reply.content_type or "application/octet-stream"
    if isinstance(body, str):
        return body.encode(), reply.content_type or "text/plain; charset=utf-8"
    if reply.status == 204:
        return b"", reply.content_type or "application/json"
    encoded = json.dumps(body, default=_json_fallback).encode()
    return encoded, reply.content_type or "application/json"
