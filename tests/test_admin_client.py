"""The admin client and ``brokerlet admin``: the requests each verb builds, the errors, and the
endpoints brokerlet serves today (stats, health, topic lists) on a running broker.

Request building is checked against a tiny WSGI application on gevent's WSGI server (HTTP/1.1
keep-alive, on a thread and hub of its own) that records every request and answers what the
test scripted. The verbs of the tenants/namespaces/partitions API run against brokerlet in
test_admin_client_api.py.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl, unquote

import gevent
import gevent.event
import pulsar
import pytest
from gevent.pywsgi import WSGIServer

from brokerlet import Broker
from brokerlet.admin import AdminClient
from brokerlet.admin import cli as admin_cli
from brokerlet.admin.client import (
    AdminError,
    AdminUnavailable,
    Conflict,
    NotFound,
    PreconditionFailed,
    ServerError,
    TopicName,
    parse_relative_time,
)


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    headers: dict[str, str]
    peer_port: int


@dataclass
class FakeAdmin:
    """Records requests; answers ``(status, body, headers)`` from ``answers`` by
    ``(method, path)`` or ``default``."""

    url: str = ""
    requests: list[Recorded] = field(default_factory=list)
    answers: dict[tuple[str, str], tuple[int, Any, dict[str, str]]] = field(default_factory=dict)
    default: tuple[int, Any, dict[str, str]] = (204, None, {})

    def __call__(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        raw_path = environ.get("REQUEST_URI") or environ.get("RAW_URI") or environ["PATH_INFO"]
        path = raw_path.split("?", 1)[0]
        length = int(environ.get("CONTENT_LENGTH") or 0)
        data = environ["wsgi.input"].read(length) if length else b""
        self.requests.append(
            Recorded(
                method=environ["REQUEST_METHOD"],
                path=path,
                query=dict(parse_qsl(environ.get("QUERY_STRING", ""))),
                body=json.loads(data) if data else None,
                headers={k[5:]: v for k, v in environ.items() if k.startswith("HTTP_")},
                peer_port=int(environ.get("REMOTE_PORT", 0)),
            )
        )
        status, body, headers = self.answers.get((environ["REQUEST_METHOD"], path), self.default)
        if isinstance(body, bytes):
            payload = body
        elif body is None:
            payload = b""
        else:
            payload = json.dumps(body).encode()
            headers = {"Content-Type": "application/json", **headers}
        start_response(f"{status} {_phrase(status)}", list(headers.items()))
        return [payload]


class _ServerThread(threading.Thread):
    """gevent's WSGI server (HTTP/1.1 keep-alive) on a thread and hub of its own."""

    def __init__(self, app: FakeAdmin) -> None:
        super().__init__(daemon=True)
        self.app = app
        self.ready = threading.Event()
        self.port = 0

    def run(self) -> None:
        hub = gevent.get_hub()
        self.stop_event = gevent.event.Event()
        self.hub = hub
        server = WSGIServer(("127.0.0.1", 0), self.app, log=None)
        server.start()
        self.port = server.server_port
        self.ready.set()
        self.stop_event.wait()
        server.stop(timeout=1)
        hub.destroy(destroy_loop=True)

    def stop(self) -> None:
        self.hub.loop.run_callback_threadsafe(self.stop_event.set)
        self.join(5)


@pytest.fixture
def fake() -> Iterator[FakeAdmin]:
    app = FakeAdmin()
    thread = _ServerThread(app)
    thread.start()
    assert thread.ready.wait(5)
    app.url = f"http://127.0.0.1:{thread.port}"
    yield app
    thread.stop()


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def _run(url: str, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    real_err = sys.stderr
    sys.stderr = err
    try:
        code = admin_cli.main(["--admin-url", url, *argv], out=out)
    finally:
        sys.stderr = real_err
    return code, out.getvalue(), err.getvalue()


T = "persistent://acme/orders/placed"
P = "/admin/v2/persistent/acme/orders/placed"
SUB = f"{P}/subscription/billing"

# (argv, method, path, query, body, answer, expected stdout)
VERBS: list[tuple[list[str], str, str, dict[str, str], Any, Any, str]] = [
    (
        ["tenants", "list"],
        "GET",
        "/admin/v2/tenants",
        {},
        None,
        ["acme", "public"],
        "acme\npublic\n",
    ),
    (
        ["tenants", "get", "acme"],
        "GET",
        "/admin/v2/tenants/acme",
        {},
        None,
        {"adminRoles": [], "allowedClusters": ["standalone"]},
        '{\n  "adminRoles": [],\n  "allowedClusters": [\n    "standalone"\n  ]\n}\n',
    ),
    (
        ["tenants", "create", "acme", "-r", "ops,dev", "-c", "standalone"],
        "PUT",
        "/admin/v2/tenants/acme",
        {},
        {"adminRoles": ["ops", "dev"], "allowedClusters": ["standalone"]},
        None,
        "",
    ),
    (
        ["tenants", "delete", "acme", "-f"],
        "DELETE",
        "/admin/v2/tenants/acme",
        {"force": "true"},
        None,
        None,
        "",
    ),
    (
        ["namespaces", "list", "acme"],
        "GET",
        "/admin/v2/namespaces/acme",
        {},
        None,
        ["acme/orders"],
        "acme/orders\n",
    ),
    (
        ["namespaces", "create", "acme/orders", "-b", "4"],
        "PUT",
        "/admin/v2/namespaces/acme/orders",
        {},
        {"bundles": {"numBundles": 4}},
        None,
        "",
    ),
    (
        ["namespaces", "create", "acme/orders"],
        "PUT",
        "/admin/v2/namespaces/acme/orders",
        {},
        None,
        None,
        "",
    ),
    (
        ["namespaces", "delete", "acme/orders"],
        "DELETE",
        "/admin/v2/namespaces/acme/orders",
        {"force": "false"},
        None,
        None,
        "",
    ),
    (
        ["namespaces", "policies", "acme/orders"],
        "GET",
        "/admin/v2/namespaces/acme/orders",
        {},
        None,
        {"bundles": {"numBundles": 4}},
        '{\n  "bundles": {\n    "numBundles": 4\n  }\n}\n',
    ),
    (
        ["namespaces", "topics", "acme/orders"],
        "GET",
        "/admin/v2/namespaces/acme/orders/topics",
        {"mode": "PERSISTENT"},
        None,
        [T],
        T + "\n",
    ),
    (
        ["namespaces", "set-retention", "acme/orders", "-s", "2G", "-t", "3h"],
        "POST",
        "/admin/v2/namespaces/acme/orders/retention",
        {},
        {"retentionTimeInMinutes": 180, "retentionSizeInMB": 2048},
        None,
        "",
    ),
    (
        ["namespaces", "get-retention", "acme/orders"],
        "GET",
        "/admin/v2/namespaces/acme/orders/retention",
        {},
        None,
        {"retentionTimeInMinutes": 180, "retentionSizeInMB": 2048},
        '{\n  "retentionTimeInMinutes": 180,\n  "retentionSizeInMB": 2048\n}\n',
    ),
    (
        ["namespaces", "remove-retention", "acme/orders"],
        "DELETE",
        "/admin/v2/namespaces/acme/orders/retention",
        {},
        None,
        None,
        "",
    ),
    (
        ["namespaces", "set-message-ttl", "acme/orders", "-ttl", "1h"],
        "POST",
        "/admin/v2/namespaces/acme/orders/messageTTL",
        {},
        3600,
        None,
        "",
    ),
    (
        ["namespaces", "get-message-ttl", "acme/orders"],
        "GET",
        "/admin/v2/namespaces/acme/orders/messageTTL",
        {},
        None,
        3600,
        "3600\n",
    ),
    (
        ["namespaces", "remove-message-ttl", "acme/orders"],
        "DELETE",
        "/admin/v2/namespaces/acme/orders/messageTTL",
        {},
        None,
        None,
        "",
    ),
    (
        ["namespaces", "set-deduplication", "acme/orders", "--enable"],
        "POST",
        "/admin/v2/namespaces/acme/orders/deduplication",
        {},
        True,
        None,
        "",
    ),
    (
        ["namespaces", "set-deduplication", "acme/orders", "-d"],
        "POST",
        "/admin/v2/namespaces/acme/orders/deduplication",
        {},
        False,
        None,
        "",
    ),
    (
        ["namespaces", "get-deduplication", "acme/orders"],
        "GET",
        "/admin/v2/namespaces/acme/orders/deduplication",
        {},
        None,
        True,
        "true\n",
    ),
    (
        [
            "namespaces",
            "set-auto-topic-creation",
            "acme/orders",
            "-e",
            "-t",
            "partitioned",
            "-n",
            "3",
        ],
        "POST",
        "/admin/v2/namespaces/acme/orders/autoTopicCreation",
        {},
        {"allowAutoTopicCreation": True, "topicType": "partitioned", "defaultNumPartitions": 3},
        None,
        "",
    ),
    (
        ["namespaces", "set-backlog-quota", "acme/orders", "-l", "1G", "-p", "producer_exception"],
        "POST",
        "/admin/v2/namespaces/acme/orders/backlogQuota",
        {"backlogQuotaType": "destination_storage"},
        {"limitSize": 1024**3, "limitTime": -1, "policy": "producer_exception"},
        None,
        "",
    ),
    (
        ["namespaces", "get-backlog-quotas", "acme/orders"],
        "GET",
        "/admin/v2/namespaces/acme/orders/backlogQuotaMap",
        {},
        None,
        {},
        "{}\n",
    ),
    (
        ["topics", "list-partitioned-topics", "acme/orders"],
        "GET",
        "/admin/v2/persistent/acme/orders/partitioned",
        {},
        None,
        [T],
        T + "\n",
    ),
    (["topics", "create", T], "PUT", P, {}, None, None, ""),
    (
        ["topics", "create-partitioned-topic", T, "-p", "4"],
        "PUT",
        f"{P}/partitions",
        {},
        4,
        None,
        "",
    ),
    (
        ["topics", "update-partitioned-topic", T, "-p", "6"],
        "POST",
        f"{P}/partitions",
        {},
        6,
        None,
        "",
    ),
    (
        ["topics", "get-partitioned-topic-metadata", T],
        "GET",
        f"{P}/partitions",
        {},
        None,
        {"partitions": 4},
        '{\n  "partitions": 4\n}\n',
    ),
    (["topics", "delete", T, "--force"], "DELETE", P, {"force": "true"}, None, None, ""),
    (
        ["topics", "delete-partitioned-topic", T],
        "DELETE",
        f"{P}/partitions",
        {"force": "false"},
        None,
        None,
        "",
    ),
    (
        ["topics", "stats", T],
        "GET",
        f"{P}/stats",
        {},
        None,
        {"msgInCounter": 3},
        '{\n  "msgInCounter": 3\n}\n',
    ),
    (
        ["topics", "partitioned-stats", T, "--per-partition"],
        "GET",
        f"{P}/partitioned-stats",
        {"perPartition": "true"},
        None,
        {"metadata": {"partitions": 4}},
        '{\n  "metadata": {\n    "partitions": 4\n  }\n}\n',
    ),
    (
        ["topics", "stats-internal", T],
        "GET",
        f"{P}/internalStats",
        {},
        None,
        {"entriesAddedCounter": 1},
        '{\n  "entriesAddedCounter": 1\n}\n',
    ),
    (
        ["topics", "last-message-id", T],
        "GET",
        f"{P}/lastMessageId",
        {},
        None,
        {"ledgerId": 1, "entryId": 2},
        '{\n  "ledgerId": 1,\n  "entryId": 2\n}\n',
    ),
    (
        ["topics", "subscriptions", T],
        "GET",
        f"{P}/subscriptions",
        {},
        None,
        ["billing"],
        "billing\n",
    ),
    (
        ["topics", "create-subscription", T, "-s", "billing", "-m", "earliest"],
        "PUT",
        SUB,
        {},
        {"ledgerId": -1, "entryId": -1},
        None,
        "",
    ),
    (
        ["topics", "create-subscription", T, "-s", "billing", "-m", "5:7"],
        "PUT",
        SUB,
        {},
        {"ledgerId": 5, "entryId": 7, "partitionIndex": -1},
        None,
        "",
    ),
    (
        ["topics", "unsubscribe", T, "-s", "billing", "-f"],
        "DELETE",
        SUB,
        {"force": "true"},
        None,
        None,
        "",
    ),
    (
        ["topics", "reset-cursor", T, "-s", "billing", "-m", "3:4"],
        "POST",
        f"{SUB}/resetcursor",
        {},
        {"ledgerId": 3, "entryId": 4, "partitionIndex": -1},
        None,
        "",
    ),
    (
        ["topics", "skip", T, "-s", "billing", "-n", "5"],
        "POST",
        f"{SUB}/skip/5",
        {},
        None,
        None,
        "",
    ),
    (
        ["topics", "clear-backlog", T, "-s", "billing"],
        "POST",
        f"{SUB}/skip_all",
        {},
        None,
        None,
        "",
    ),
    (
        ["topics", "expire-messages", T, "-s", "billing", "-t", "2m"],
        "POST",
        f"{SUB}/expireMessages/120",
        {},
        None,
        None,
        "",
    ),
    (
        ["topics", "terminate", T],
        "POST",
        f"{P}/terminate",
        {},
        None,
        {"ledgerId": 9, "entryId": 3},
        "Topic successfully terminated at 9:3\n",
    ),
    (["topics", "unload", T], "PUT", f"{P}/unload", {}, None, None, ""),
    (["clusters", "list"], "GET", "/admin/v2/clusters", {}, None, ["standalone"], "standalone\n"),
    (["brokers", "healthcheck"], "GET", "/admin/v2/brokers/health", {}, None, b"ok", "ok\n"),
    (["broker-stats", "topics"], "GET", "/admin/v2/broker-stats/topics", {}, None, {}, "{}\n"),
]


@pytest.mark.parametrize(
    ("argv", "method", "path", "query", "body", "answer", "printed"),
    VERBS,
    ids=[" ".join(v[0][:2]) + f"-{i}" for i, v in enumerate(VERBS)],
)
def test_every_verb_sends_pulsars_request_and_prints_like_pulsar_admin(
    fake: FakeAdmin,
    argv: list[str],
    method: str,
    path: str,
    query: dict[str, str],
    body: Any,
    answer: Any,
    printed: str,
) -> None:
    fake.answers[(method, path)] = (204 if answer is None else 200, answer, {})
    code, out, err = _run(fake.url, *argv)
    assert code == 0, err
    assert len(fake.requests) == 1, fake.requests
    request = fake.requests[0]
    assert (request.method, unquote(request.path), request.query) == (method, path, query)
    assert request.body == body
    assert out == printed


def test_tenant_create_without_clusters_allows_every_cluster(fake: FakeAdmin) -> None:
    # pulsar-admin's CmdTenants fills allowedClusters with every cluster when -c is absent.
    fake.answers[("GET", "/admin/v2/clusters")] = (200, ["standalone", "east"], {})
    code, _out, err = _run(fake.url, "tenants", "create", "acme")
    assert code == 0, err
    assert [r.method for r in fake.requests] == ["GET", "PUT"]
    assert fake.requests[1].body == {"adminRoles": [], "allowedClusters": ["standalone", "east"]}


def test_tenant_update_keeps_what_is_not_given(fake: FakeAdmin) -> None:
    fake.answers[("GET", "/admin/v2/tenants/acme")] = (
        200,
        {"adminRoles": ["ops"], "allowedClusters": ["standalone"]},
        {},
    )
    code, _out, err = _run(fake.url, "tenants", "update", "acme", "-c", "standalone,east")
    assert code == 0, err
    assert fake.requests[-1].method == "POST"
    assert fake.requests[-1].body == {
        "adminRoles": ["ops"],
        "allowedClusters": ["standalone", "east"],
    }


def test_list_topics_asks_both_domains(fake: FakeAdmin) -> None:
    fake.answers[("GET", "/admin/v2/persistent/acme/orders")] = (200, [T], {})
    fake.answers[("GET", "/admin/v2/non-persistent/acme/orders")] = (
        200,
        ["non-persistent://acme/orders/ticks"],
        {},
    )
    code, out, err = _run(fake.url, "topics", "list", "acme/orders")
    assert code == 0, err
    assert out == f"{T}\nnon-persistent://acme/orders/ticks\n"


def test_reset_cursor_by_relative_time_sends_a_timestamp_that_long_ago(fake: FakeAdmin) -> None:
    before = int((time.time() - 600) * 1000)
    code, _out, err = _run(fake.url, "topics", "reset-cursor", T, "-s", "billing", "-t", "10m")
    after = int((time.time() - 600) * 1000)
    assert code == 0, err
    prefix = f"{SUB}/resetcursor/"
    assert fake.requests[0].method == "POST"
    assert fake.requests[0].path.startswith(prefix)
    assert before <= int(fake.requests[0].path[len(prefix) :]) <= after


def test_peek_messages_reads_positions_and_prints_headers_properties_and_payload(
    fake: FakeAdmin,
) -> None:
    for position, body in ((1, b"hello"), (2, b"world!")):
        fake.answers[("GET", f"{SUB}/position/{position}")] = (
            200,
            body,
            {
                "X-Pulsar-Message-ID": f"7:{position}",
                "X-Pulsar-publish-time": "2026-12-01T10:00:00.000Z",
                "X-Pulsar-PROPERTY": json.dumps({"kind": "new"}),
                "Content-Type": "application/octet-stream",
            },
        )
    fake.answers[("GET", f"{SUB}/position/3")] = (404, {"reason": "No message at position"}, {})
    code, out, err = _run(fake.url, "topics", "peek-messages", T, "-s", "billing", "-n", "5")
    assert code == 0, err
    assert [r.path for r in fake.requests] == [f"{SUB}/position/{n}" for n in (1, 2, 3)]
    assert "Message ID: 7:1" in out
    assert "Message ID: 7:2" in out
    assert '"kind": "new"' in out
    assert "|00000000| 68 65 6c 6c 6f" in out
    assert "|hello" in out
    assert "Publish time: 2026-12-01T10:00:00.000Z" in out


def test_peeked_properties_in_per_key_headers_too(fake: FakeAdmin) -> None:
    # Brokers before apache/pulsar PR #20627 send one X-Pulsar-PROPERTY-<key> per property.
    fake.answers[("GET", f"{SUB}/position/1")] = (
        200,
        b"x",
        {"X-Pulsar-Message-ID": "1:0", "X-Pulsar-PROPERTY-region": "eu"},
    )
    with AdminClient(fake.url) as admin:
        [message] = admin.peek_messages(T, "billing", 1)
    assert message.properties == {"region": "eu"}
    assert message.message_id == "1:0"
    assert message.payload == b"x"


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (404, NotFound),
        (409, Conflict),
        (412, PreconditionFailed),
        (500, ServerError),
        (418, AdminError),
    ],
)
def test_error_answers_raise_typed_errors_with_pulsars_reason(
    fake: FakeAdmin, status: int, kind: type[AdminError]
) -> None:
    fake.default = (status, {"reason": "Tenant already exist"}, {})
    with AdminClient(fake.url) as admin, pytest.raises(kind) as raised:
        admin.tenant("acme")
    assert raised.value.status == status
    assert raised.value.reason == "Tenant already exist"
    assert raised.value.path == "/admin/v2/tenants/acme"
    code, out, err = _run(fake.url, "tenants", "get", "acme")
    assert (code, out) == (1, "")
    assert err.endswith("Reason: Tenant already exist\n")
    assert err.startswith(str(status))


def test_an_error_without_a_json_body_keeps_its_text(fake: FakeAdmin) -> None:
    fake.default = (503, b"try later", {})
    with AdminClient(fake.url) as admin, pytest.raises(ServerError, match="try later"):
        admin.tenants()


def test_auth_token_and_connection_reuse(fake: FakeAdmin) -> None:
    fake.default = (200, [], {})
    with AdminClient(fake.url, auth="s3cret", timeout=5) as admin:
        for _ in range(5):
            admin.tenants()
    assert {r.headers.get("AUTHORIZATION") for r in fake.requests} == {"Bearer s3cret"}
    # Keep-alive: the five requests share one pooled connection.
    assert len({r.peer_port for r in fake.requests}) == 1


def test_a_broker_that_does_not_answer_in_time_is_unavailable() -> None:
    with socket_that_never_answers() as url:
        started = time.monotonic()
        with AdminClient(url, timeout=0.3) as admin, pytest.raises(AdminUnavailable):
            admin.tenants()
        assert time.monotonic() - started < 5


class socket_that_never_answers:  # noqa: N801 -- a context manager used like a function
    def __enter__(self) -> str:
        import socket  # noqa: PLC0415

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


def test_names_and_times_parse_as_pulsar_does() -> None:
    assert str(TopicName.parse("orders")) == "persistent://public/default/orders"
    assert TopicName.parse("non-persistent://a/b/c d").path == "/non-persistent/a/b/c%20d"
    with pytest.raises(ValueError, match="expected tenant/namespace/topic"):
        TopicName.parse("a/b")
    with pytest.raises(ValueError, match="invalid topic domain"):
        TopicName.parse("kafka://a/b/c")
    assert parse_relative_time("10m") == 600
    assert parse_relative_time("2d") == 172800
    with pytest.raises(ValueError, match="invalid relative time"):
        parse_relative_time("10 minutes")


def test_bad_input_exits_with_a_message(fake: FakeAdmin) -> None:
    code, _out, err = _run(fake.url, "topics", "stats", "a/b")
    assert code == 2
    assert "expected tenant/namespace/topic" in err
    assert fake.requests == []
    with pytest.raises(SystemExit) as exited:
        _run(fake.url, "topics", "reset-cursor", T, "-s", "billing", "-t", "soon")
    assert exited.value.code == 2


# -- against a running brokerlet: the endpoints it serves on this branch -----------------


@pytest.fixture(scope="module")
def running() -> Iterator[Broker]:
    with Broker(port=0) as broker:
        client = pulsar.Client(broker.service_url, operation_timeout_seconds=10)
        producer = client.create_producer("persistent://public/default/admin-cli")
        client.subscribe("persistent://public/default/admin-cli", "audit").close()
        for n in range(3):
            producer.send(f"m{n}".encode())
        client.close()
        yield broker


def test_stats_list_health_and_broker_stats_against_brokerlet(running: Broker) -> None:
    url = str(running.web_service_url)
    code, out, err = _run(url, "topics", "stats", "persistent://public/default/admin-cli")
    assert code == 0, err
    stats = json.loads(out)
    assert stats["msgInCounter"] == 3
    assert stats["subscriptions"]["audit"]["msgBacklog"] == 3
    assert _run(url, "topics", "list", "public/default")[1] == (
        "persistent://public/default/admin-cli\n"
    )
    assert _run(url, "brokers", "healthcheck")[:2] == (0, "ok\n")
    code, out, _err = _run(url, "broker-stats", "topics")
    assert code == 0
    # Pulsar's BrokerStatsBase nesting: namespace -> bundle -> domain -> topic.
    nested = json.loads(out)["public/default"]["0x00000000_0xffffffff"]["persistent"]
    assert nested["persistent://public/default/admin-cli"]["msgInCounter"] == 3
    code, out, _err = _run(url, "broker-stats", "metrics")
    assert code == 0
    assert "pulsar_in_messages_total" in out or "pulsar_" in out
    with AdminClient(url) as admin:
        assert admin.topic_stats("admin-cli")["msgInCounter"] == 3
        assert admin.topics("public/default") == ["persistent://public/default/admin-cli"]
        assert admin.healthcheck() == "ok"


def test_an_unknown_topic_prints_brokerlets_reason_and_exits_1(running: Broker) -> None:
    code, out, err = _run(str(running.web_service_url), "topics", "stats", "nope")
    assert (code, out) == (1, "")
    # Pulsar's reason (AdminResource#getTopicNotFoundErrorMessage names the topic).
    assert err == "404 Not Found\n\nReason: Topic persistent://public/default/nope not found\n"


def test_the_command_line_says_when_no_broker_runs() -> None:
    with socket_that_never_answers() as url:
        port = url.rsplit(":", 1)[1]
    done = subprocess.run(
        [sys.executable, "-m", "brokerlet", "admin", "--admin-url", url, "tenants", "list"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 1
    assert f"no answer from the admin API at http://127.0.0.1:{port}" in done.stderr
    assert "is the broker running?" in done.stderr
    assert "Connection refused" in done.stderr
