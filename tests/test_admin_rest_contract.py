"""The admin REST plug-in contract as the mini application mounts it (admin-contract.md)."""

from __future__ import annotations

import json

from werkzeug.test import Client

from brokerlet.admin.mini_app import RestApp, schema_admin_app
from brokerlet.admin.rest import AdminContext, AdminRequest, Reply, RestError, Route, require_field
from brokerlet.config import load_settings
from brokerlet.schema import SchemaRegistry


def _app() -> RestApp:
    def echo(request: AdminRequest, tenant: str, topic: str) -> object:
        body = request.json()
        return {"tenant": tenant, "topic": topic, "n": require_field(body, "n", int)}

    def created(request: AdminRequest) -> object:
        return Reply(201, b"raw", headers={"X-Thing": "1"}, content_type="application/x-raw")

    def nothing(request: AdminRequest) -> object:
        return None

    def refuse(request: AdminRequest) -> object:
        raise RestError(409, "taken")

    def broken(request: AdminRequest) -> object:
        raise RuntimeError("bug")

    routes = [
        Route(
            "/echo/<seg:tenant>/<domain:domain>/<seg:topic>",
            ("POST",),
            lambda r, domain, **kw: echo(r, **kw),
        ),
        Route("/created", ("PUT",), created),
        Route("/nothing", ("DELETE",), nothing),
        Route("/refuse", ("GET",), refuse),
        Route("/broken", ("GET",), broken),
    ]
    return RestApp(routes, AdminContext(settings=None))


def test_handlers_answer_in_the_contracts_shapes() -> None:
    client = Client(_app())
    answer = client.post("/echo/acme/persistent/t1", json={"n": 3})
    assert (answer.status_code, answer.json) == (200, {"tenant": "acme", "topic": "t1", "n": 3})
    made = client.put("/created")
    assert (made.status_code, made.data, made.headers["X-Thing"]) == (201, b"raw", "1")
    assert made.headers["Content-Type"] == "application/x-raw"
    assert client.delete("/nothing").status_code == 204
    assert (client.get("/refuse").status_code, client.get("/refuse").json) == (
        409,
        {"reason": "taken"},
    )
    assert client.get("/broken").status_code == 500


def test_bad_requests_name_the_problem() -> None:
    client = Client(_app())
    malformed = client.post("/echo/a/persistent/t", data=b"{oops")
    assert malformed.status_code == 400
    assert "Malformed JSON" in malformed.json["reason"]
    missing = client.post("/echo/a/persistent/t", json={})
    assert (missing.status_code, missing.json) == (400, {"reason": "Missing field 'n'"})
    assert client.post("/echo/a/bogus/t", json={"n": 1}).status_code == 404
    wrong = client.get("/echo/a/persistent/t")
    assert wrong.status_code == 405
    assert "POST" in wrong.headers["Allow"]


def test_schema_routes_mount_from_the_route_modules() -> None:
    settings = load_settings(env={})
    client = Client(schema_admin_app(SchemaRegistry(settings), settings))
    base = "/admin/v2/schemas/public/default/t"
    assert client.get(f"{base}/schema").status_code == 404
    posted = client.post(f"{base}/schema", json={"type": "STRING", "schema": ""})
    assert posted.status_code == 202
    got = client.get(f"{base}/schema")
    assert got.json["type"] == "STRING"
    assert client.get(f"{base}/schema/x").status_code == 400
    version = client.post(f"{base}/version", json={"type": "STRING", "schema": ""})
    assert json.loads(version.data) == {"version": 0}
