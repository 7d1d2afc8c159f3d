"""Werkzeug routing for contract route modules (``brokerlet.admin.rest.Route``).

Rules match the raw request path, so a ``seg`` keeps a ``%2F`` inside its segment and is
percent-decoded only after matching. Issue 12a's admin core supersedes this; until it lands
:class:`~brokerlet.admin.http.AdminServer` serves the mounted routes through it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from werkzeug.datastructures import Headers, MultiDict
from werkzeug.exceptions import MethodNotAllowed, NotFound
from werkzeug.routing import BaseConverter, Map, Rule

from brokerlet.admin.rest import AdminContext, AdminRequest, Reply, RestError, Route

__all__ = ["Mounted", "Response"]

log = logging.getLogger(__name__)

Response = tuple[int, str, bytes, tuple[tuple[str, str], ...]]


class _Segment(BaseConverter):
    regex = "[^/]+"

    def to_python(self, value: str) -> str:
        return unquote(value)


class _Domain(BaseConverter):
    regex = "persistent|non-persistent"


class Mounted:
    """Routes from contract modules, answered as ``(status, content type, body, headers)``."""

    def __init__(self, routes: Sequence[Route], context: AdminContext) -> None:
        self.context = context
        self._map = Map(
            [Rule(r.rule, endpoint=r, methods=list(r.methods)) for r in routes],
            converters={"seg": _Segment, "domain": _Domain},
            strict_slashes=False,
            merge_slashes=False,
        )

    def respond(self, environ: dict[str, Any]) -> Response | None:
        """The answer to a request, or None when no mounted rule matches its path."""
        raw = str(environ.get("RAW_URI") or environ.get("PATH_INFO", "/"))
        split = urlsplit(raw)
        method = str(environ.get("REQUEST_METHOD", "GET"))
        adapter = self._map.bind("localhost", path_info=split.path)
        try:
            route, args = adapter.match(split.path, method=method)
        except NotFound:
            return None
        except MethodNotAllowed as error:
            allowed = ", ".join(error.valid_methods or ())
            return _json(405, {"reason": "Method Not Allowed"}, (("Allow", allowed),))
        query = split.query or str(environ.get("QUERY_STRING", ""))
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length > 0 else b""
        request = AdminRequest(
            method=method,
            path=split.path,
            args=MultiDict(parse_qsl(query, keep_blank_values=True)),
            headers=Headers(
                [
                    (k[5:].replace("_", "-").title(), str(v))
                    for k, v in environ.items()
                    if k.startswith("HTTP_")
                ]
            ),
            body=body,
            context=self.context,
        )
        try:
            result = route.handler(request, **args)
        except RestError as error:
            return _json(error.status, {"reason": error.reason})
        except Exception as error:
            log.exception("admin request %s %s failed", method, split.path)
            return _json(500, {"reason": f"Internal error: {type(error).__name__}: {error}"})
        if result is None:
            return 204, "application/json", b"", ()
        if isinstance(result, Reply):
            headers = tuple(result.headers.items())
            if isinstance(result.body, bytes | str):
                data = result.body if isinstance(result.body, bytes) else result.body.encode()
                return (
                    result.status,
                    result.content_type or "application/octet-stream",
                    data,
                    headers,
                )
            status, kind, data, _ = _json(result.status, result.body)
            return status, result.content_type or kind, data, headers
        return _json(200, result)


def _json(status: int, document: object, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    return status, "application/json", json.dumps(document, default=str).encode(), headers
