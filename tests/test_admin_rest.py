"""The admin plug-in contract (brokerlet.admin.rest) through Werkzeug's test client.

No sockets: AdminApp is a WSGI callable. Percent-decoding through the real server's raw
request target is covered in test_admin_http.py.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from werkzeug.test import Client

from brokerlet.admin.rest import (
    AdminApp,
    AdminContext,
    AdminRequest,
    Reply,
    RestError,
    Route,
    json_object,
    optional_field,
    query_bool,
    required_field,
)


def _echo(request: AdminRequest, **args: str) -> object:
    return {"args": args, "role": request.role, "method": request.method}


def _create(request: AdminRequest, name: str) -> None:
    body = json_object(request)
    required_field(body, "count", int)
    optional_field(body, "label", str, "")
    if name == "taken":
        raise RestError(409, "Already exists")


def _raw(_request: AdminRequest) -> Reply:
    return Reply(200, b"\x00\x01", {"X-Pulsar-Message-ID": "1:2"})


def _boom(_request: AdminRequest) -> object:
    raise RuntimeError("bug")


def _flag(request: AdminRequest) -> object:
    return query_bool(request, "force")


ROUTES = [
    Route("/admin/v2/<domain:domain>/<seg:tenant>/<seg:namespace>/<seg:topic>", ("GET",), _echo),
    Route("/things/<seg:name>", ("PUT", "POST"), _create),
    Route("/raw", ("GET",), _raw),
    Route("/boom", ("GET",), _boom),
    Route("/flag", ("GET",), _flag),
    Route("/files/<path:rest>", ("GET",), _echo),
]


@pytest.fixture
def client() -> Client:
    return Client(AdminApp(ROUTES, AdminContext()))


def _json(response: Any) -> Any:
    assert response.content_type == "application/json"
    return json.loads(response.data)


def test_url_arguments_reach_the_handler_by_name(client: Client) -> None:
    reply = client.get("/admin/v2/non-persistent/t/ns/orders")

    assert reply.status_code == 200
    assert _json(reply)["args"] == {
        "domain": "non-persistent",
        "tenant": "t",
        "namespace": "ns",
        "topic": "orders",
    }


def test_the_domain_converter_accepts_only_pulsars_two_domains(client: Client) -> None:
    reply = client.get("/admin/v2/partitioned/t/ns/orders")

    assert reply.status_code == 404
    assert _json(reply) == {"reason": "Not Found"}


def test_an_empty_segment_matches_no_route(client: Client) -> None:
    assert client.get("/admin/v2/persistent//ns/orders").status_code == 404


def test_a_wrong_method_is_405_naming_the_allowed_ones(client: Client) -> None:
    reply = client.delete("/things/x")

    assert reply.status_code == 405
    assert reply.headers["Allow"] == "POST, PUT"
    assert _json(reply) == {"reason": "Method Not Allowed"}


def test_none_is_204_with_an_empty_body(client: Client) -> None:
    reply = client.put("/things/x", data=b'{"count": 3}')

    assert reply.status_code == 204
    assert reply.data == b""


def test_rest_error_is_its_status_with_pulsars_reason_shape(client: Client) -> None:
    reply = client.put("/things/taken", data=b'{"count": 3}')

    assert reply.status_code == 409
    assert _json(reply) == {"reason": "Already exists"}


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"{not json", "Malformed JSON body"),
        (b"", "Request body is empty"),
        (b"[1]", "Request body must be a JSON object"),
        (b"{}", "count: required"),
        (b'{"count": "3"}', 'count: must be an integer, got "3"'),
        (b'{"count": true}', "count: must be an integer, got true"),
        (b'{"count": 1, "label": 5}', "label: must be a string, got 5"),
    ],
)
def test_bad_bodies_are_400_naming_the_problem(client: Client, body: bytes, reason: str) -> None:
    reply = client.post("/things/x", data=body)

    assert reply.status_code == 400
    assert _json(reply)["reason"].startswith(reason)


def test_a_reply_sends_bytes_as_they_are_with_its_headers(client: Client) -> None:
    reply = client.get("/raw")

    assert reply.status_code == 200
    assert reply.data == b"\x00\x01"
    assert reply.content_type == "application/octet-stream"
    assert reply.headers["X-Pulsar-Message-ID"] == "1:2"


def test_an_unexpected_exception_is_a_logged_500(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="brokerlet.admin.rest"):
        reply = client.get("/boom")

    assert reply.status_code == 500
    assert _json(reply) == {"reason": "Internal error: RuntimeError: bug"}
    assert any("GET /boom failed" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(("query", "expected"), [("", False), ("?force=true", True)])
def test_query_booleans(client: Client, query: str, expected: bool) -> None:
    assert _json(client.get("/flag" + query)) is expected


def test_a_malformed_query_boolean_is_400_naming_it(client: Client) -> None:
    reply = client.get("/flag?force=maybe")

    assert reply.status_code == 400
    assert _json(reply)["reason"] == "force: must be true or false, got 'maybe'"


def test_guards_run_before_the_handler_and_may_refuse_or_set_the_role() -> None:
    seen: list[str] = []

    def guard(request: AdminRequest, route: Route) -> None:
        seen.append(route.auth)
        if request.headers.get("Authorization") is None:
            raise RestError(401, "Authentication required")
        request.role = "admin"

    client = Client(AdminApp(ROUTES, AdminContext(), guards=[guard]))

    assert client.get("/admin/v2/persistent/t/ns/x").status_code == 401
    reply = client.get("/admin/v2/persistent/t/ns/x", headers={"Authorization": "Bearer x"})
    assert _json(reply)["role"] == "admin"
    assert seen == ["tenant", "tenant"]


def test_the_context_takes_attributes_other_areas_add() -> None:
    context = AdminContext(metadata="store", schemas="registry", quotas="limits")

    assert (context.metadata, context.schemas, context.security) == ("store", "registry", None)
    assert context.quotas == "limits"  # type: ignore[attr-defined]


def test_the_path_converter_takes_the_rest_of_the_path(client: Client) -> None:
    assert _json(client.get("/files/a/b/c"))["args"] == {"rest": "a/b/c"}
