"""The admin HTTP endpoint, served in the test's hub and queried over real loopback sockets.

The client (``urllib``) runs in the hub's thread pool, so the server keeps running on this
thread while a request is in flight.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from email.message import Message
from typing import Any

import gevent
import gevent.event
import pytest
from gevent import socket
from prometheus_client import REGISTRY
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from brokerlet.admin import AdminServer

ORDERS = "persistent://public/default/orders"
PAYMENTS = "persistent://public/default/payments"
OTHER_NAMESPACE = "persistent://acme/billing/invoices"
VOLATILE = "non-persistent://public/default/ticks"

CONSUMER = {
    "consumerName": "worker-1",
    "consumerId": 7,
    "availablePermits": 812,
    "unackedMessages": 3,
    "msgOutCounter": 1200,
    "blockedConsumerOnUnackedMsgs": True,
    "writable": False,
    "pendingOutboundBytes": 70_000,
    "writabilityChanges": 5,
}


def _orders_stats() -> dict[str, Any]:
    return {
        "msgRateIn": 12.5,
        "msgRateOut": 10.0,
        "msgInCounter": 1500,
        "bytesInCounter": 96_000,
        "msgOutCounter": 1200,
        "storageSize": 96_000,
        "backlogSize": 19_200,
        "publishers": [{"producerName": "p-1"}],
        "subscriptions": {
            "billing": {
                "type": "Shared",
                "msgBacklog": 300,
                "msgRateOut": 10.0,
                "msgOutCounter": 1200,
                "unackedMessages": 3,
                "consumers": [dict(CONSUMER)],
            },
            "audit": {"type": "Exclusive", "msgBacklog": 1500, "consumers": []},
        },
    }


@dataclass
class FakeBroker:
    """Stats callables over a dict, recording where and with what they are called."""

    topics: dict[str, dict[str, Any]] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)
    callers: list[tuple[int, Any]] = field(default_factory=list)
    error: Exception | None = None
    entered: gevent.event.Event = field(default_factory=gevent.event.Event)
    release: gevent.event.Event | None = None

    def _called(self) -> None:
        self.callers.append((threading.get_ident(), gevent.getcurrent()))
        self.entered.set()
        if self.release is not None:
            assert self.release.wait(5), "test never released the stats call"
        if self.error is not None:
            raise self.error

    def topic_stats(self, name: str) -> Mapping[str, Any] | None:
        self.asked.append(name)
        self._called()
        return self.topics.get(name)

    def all_stats(self) -> Mapping[str, Mapping[str, Any]]:
        self._called()
        return self.topics


@dataclass
class Reply:
    status: int
    headers: Message
    body: bytes

    def json(self) -> Any:
        assert self.headers.get_content_type() == "application/json"
        return json.loads(self.body)


@pytest.fixture
def broker() -> FakeBroker:
    return FakeBroker(
        topics={
            ORDERS: _orders_stats(),
            PAYMENTS: {"msgInCounter": 4},
            OTHER_NAMESPACE: {"msgInCounter": 9},
            VOLATILE: {"msgInCounter": 2},
        }
    )


@pytest.fixture
def server(broker: FakeBroker) -> Iterator[AdminServer]:
    admin = AdminServer("127.0.0.1", 0, topic_stats=broker.topic_stats, all_stats=broker.all_stats)
    admin.start()
    yield admin
    admin.stop()


def _url(server: AdminServer, path: str) -> str:
    host, port = server.address
    return f"http://{host}:{port}{path}"


def _fetch(url: str, method: str, headers: dict[str, str]) -> Reply:
    request = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return Reply(response.status, response.headers, response.read())
    except urllib.error.HTTPError as error:
        with error:
            return Reply(error.code, error.headers, error.read())


def request(
    server: AdminServer, path: str, method: str = "GET", headers: dict[str, str] | None = None
) -> Reply:
    """One HTTP request from a pool thread; this greenlet (and the server) waits cooperatively."""
    pool = gevent.get_hub().threadpool
    reply: Reply = pool.spawn(_fetch, _url(server, path), method, headers or {}).get(timeout=10)
    return reply


def scrape(server: AdminServer) -> dict[str, list[Any]]:
    """``/metrics`` parsed: samples by metric family name."""
    reply = request(server, "/metrics")
    assert reply.status == 200
    assert reply.headers["Content-Type"].startswith("text/plain")
    families = text_string_to_metric_families(reply.body.decode())
    return {family.name: family.samples for family in families}


def sample_value(samples: list[Any], **labels: str) -> float:
    """The value of the one sample whose labels include ``labels``."""
    matching = [s for s in samples if labels.items() <= s.labels.items()]
    assert len(matching) == 1, (labels, samples)
    value: float = matching[0].value
    return value


# Routes.


def test_topic_stats_route_answers_that_topics_stats(
    server: AdminServer, broker: FakeBroker
) -> None:
    reply = request(server, "/admin/v2/persistent/public/default/orders/stats")

    assert reply.status == 200
    assert reply.json() == _orders_stats()
    assert broker.asked == [ORDERS]


def test_non_persistent_domain_is_part_of_the_topic_name(
    server: AdminServer, broker: FakeBroker
) -> None:
    reply = request(server, "/admin/v2/non-persistent/public/default/ticks/stats")

    assert reply.status == 200
    assert reply.json() == {"msgInCounter": 2}
    assert broker.asked == [VOLATILE]


@pytest.mark.parametrize(
    ("path", "topic"),
    [
        ("/admin/v2/persistent/caf%C3%A9/ns/my%20topic/stats", "persistent://café/ns/my topic"),
        ("/admin/v2/persistent/t/ns/a%2Fb/stats", "persistent://t/ns/a/b"),
        ("/admin/v2/persistent/t/ns/100%25/stats", "persistent://t/ns/100%"),
        ("/admin/v2/persistent/t/ns/orders/stats/", "persistent://t/ns/orders"),
    ],
)
def test_path_segments_are_split_then_url_decoded(
    server: AdminServer, broker: FakeBroker, path: str, topic: str
) -> None:
    broker.topics[topic] = {"msgInCounter": 1}

    reply = request(server, path)

    assert reply.status == 200
    assert broker.asked == [topic]


def test_unknown_topic_is_404_with_pulsars_reason(server: AdminServer, broker: FakeBroker) -> None:
    reply = request(server, "/admin/v2/persistent/public/default/missing/stats")

    assert reply.status == 404
    assert reply.json() == {"reason": "Topic not found"}
    assert broker.asked == ["persistent://public/default/missing"]


def test_namespace_route_lists_its_topics_of_that_domain_only(server: AdminServer) -> None:
    assert request(server, "/admin/v2/persistent/public/default").json() == [ORDERS, PAYMENTS]
    assert request(server, "/admin/v2/non-persistent/public/default").json() == [VOLATILE]
    assert request(server, "/admin/v2/persistent/acme/billing").json() == [OTHER_NAMESPACE]
    assert request(server, "/admin/v2/persistent/acme/empty").json() == []


def test_broker_stats_topics_answers_every_topic(server: AdminServer, broker: FakeBroker) -> None:
    reply = request(server, "/admin/v2/broker-stats/topics")

    assert reply.status == 200
    assert reply.json() == broker.topics


def test_health_answers_ok_as_text(server: AdminServer) -> None:
    reply = request(server, "/admin/v2/brokers/health")

    assert reply.status == 200
    assert reply.headers.get_content_type() == "text/plain"
    assert reply.body == b"ok"


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/metricsx",
        "/admin/v2/persistent/public",
        "/admin/v2/persistent/public/default/orders/nothing-here",
        "/admin/v2/persistent/public/default/orders/stats/more",
        "/admin/v2/persistent//default/orders/stats",
        "/admin/v2/partitioned/public/default/orders/stats",
        "/admin/v3/persistent/public/default/orders/stats",
    ],
)
def test_unknown_paths_are_404_with_a_json_reason(
    server: AdminServer, broker: FakeBroker, path: str
) -> None:
    reply = request(server, path)

    assert reply.status == 404
    assert reply.json() == {"reason": "Not Found"}
    assert broker.asked == []


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "HEAD"])
@pytest.mark.parametrize("path", ["/metrics", "/admin/v2/persistent/public/default/orders/stats"])
def test_other_methods_on_known_routes_are_405(
    server: AdminServer, broker: FakeBroker, method: str, path: str
) -> None:
    reply = request(server, path, method=method)

    assert reply.status == 405
    assert reply.headers["Allow"] == "GET"
    if method != "HEAD":
        assert reply.json() == {"reason": "Method Not Allowed"}
    assert broker.callers == []


def test_a_topic_path_allows_only_its_write_methods(server: AdminServer) -> None:
    # PUT creates and DELETE deletes a topic; Pulsar has no GET on the bare topic path.
    reply = request(server, "/admin/v2/persistent/public/default/orders")

    assert reply.status == 405
    assert reply.headers["Allow"] == "DELETE, PUT"


def test_other_methods_on_unknown_paths_are_404(server: AdminServer) -> None:
    assert request(server, "/nowhere", method="POST").status == 404


# Metrics.


def test_metrics_render_topic_figures_with_pulsars_names_and_labels(server: AdminServer) -> None:
    metrics = scrape(server)

    topic = {"cluster": "brokerlet", "namespace": "public/default", "topic": ORDERS}
    assert sample_value(metrics["pulsar_rate_in"], **topic) == 12.5
    assert sample_value(metrics["pulsar_rate_out"], **topic) == 10.0
    assert sample_value(metrics["pulsar_storage_size"], **topic) == 96_000
    assert sample_value(metrics["pulsar_storage_backlog_size"], **topic) == 19_200
    assert sample_value(metrics["pulsar_msg_backlog"], **topic) == 1800  # 300 + 1500
    assert sample_value(metrics["pulsar_subscriptions_count"], **topic) == 2
    assert sample_value(metrics["pulsar_producers_count"], **topic) == 1
    assert sample_value(metrics["pulsar_consumers_count"], **topic) == 1
    # Counters keep Pulsar's series names, ``_total`` included.
    in_messages = metrics["pulsar_in_messages"]
    assert {s.name for s in in_messages} == {"pulsar_in_messages_total"}
    assert sample_value(in_messages, **topic) == 1500
    assert sample_value(metrics["pulsar_out_messages"], **topic) == 1200
    other = {"namespace": "acme/billing", "topic": OTHER_NAMESPACE}
    assert sample_value(in_messages, **other) == 9


def test_metrics_render_subscription_figures(server: AdminServer) -> None:
    metrics = scrape(server)

    billing = {"cluster": "brokerlet", "topic": ORDERS, "subscription": "billing"}
    audit = {"topic": ORDERS, "subscription": "audit"}
    assert sample_value(metrics["pulsar_subscription_back_log"], **billing) == 300
    assert sample_value(metrics["pulsar_subscription_back_log"], **audit) == 1500
    assert sample_value(metrics["pulsar_subscription_unacked_messages"], **billing) == 3
    assert sample_value(metrics["pulsar_subscription_msg_rate_out"], **billing) == 10.0


def test_metrics_render_consumer_figures_including_backpressure(server: AdminServer) -> None:
    metrics = scrape(server)

    consumer = {
        "cluster": "brokerlet",
        "namespace": "public/default",
        "topic": ORDERS,
        "subscription": "billing",
        "consumer_name": "worker-1",
        "consumer_id": "7",
    }
    assert sample_value(metrics["pulsar_consumer_available_permits"], **consumer) == 812
    assert sample_value(metrics["pulsar_consumer_unacked_messages"], **consumer) == 3
    assert sample_value(metrics["pulsar_consumer_blocked_on_unacked_messages"], **consumer) == 1
    assert sample_value(metrics["brokerlet_consumer_writable"], **consumer) == 0
    assert sample_value(metrics["brokerlet_consumer_pending_outbound_bytes"], **consumer) == 70_000
    changes = metrics["brokerlet_consumer_writability_changes"]
    assert {s.name for s in changes} == {"brokerlet_consumer_writability_changes_total"}
    assert sample_value(changes, **consumer) == 5


def test_metrics_read_the_stats_at_each_scrape(server: AdminServer, broker: FakeBroker) -> None:
    consumer = {"topic": ORDERS, "consumer_name": "worker-1"}
    assert sample_value(scrape(server)["brokerlet_consumer_writable"], **consumer) == 0

    broker.topics[ORDERS]["subscriptions"]["billing"]["consumers"][0]["writable"] = True
    broker.topics["persistent://public/default/new"] = {"msgInCounter": 1}
    metrics = scrape(server)

    assert sample_value(metrics["brokerlet_consumer_writable"], **consumer) == 1
    assert sample_value(metrics["pulsar_in_messages"], topic="persistent://public/default/new") == 1


def test_metrics_tolerate_missing_keys_as_zero(server: AdminServer, broker: FakeBroker) -> None:
    broker.topics.clear()
    broker.topics["persistent://t/ns/bare"] = {
        "subscriptions": {"s": {"consumers": [{"consumerName": "c"}]}}
    }

    metrics = scrape(server)

    consumer = {"topic": "persistent://t/ns/bare", "subscription": "s", "consumer_name": "c"}
    assert sample_value(metrics["pulsar_rate_in"], namespace="t/ns") == 0
    assert sample_value(metrics["pulsar_msg_backlog"], namespace="t/ns") == 0
    assert sample_value(metrics["pulsar_subscription_back_log"], subscription="s") == 0
    assert sample_value(metrics["pulsar_consumer_available_permits"], **consumer) == 0
    assert sample_value(metrics["brokerlet_consumer_writable"], **consumer) == 0
    assert sample_value(metrics["brokerlet_consumer_pending_outbound_bytes"], **consumer) == 0
    assert sample_value(metrics["pulsar_consumer_available_permits"], consumer_id="") == 0


def test_metrics_with_no_topics_have_no_samples(server: AdminServer, broker: FakeBroker) -> None:
    broker.topics.clear()

    metrics = scrape(server)

    assert "pulsar_rate_in" in metrics
    # Only the broker-wide supervision counter has samples, one per actor kind.
    restarts = metrics.pop("brokerlet_actor_restarts")
    assert len(restarts) == 3
    assert all(samples == [] for samples in metrics.values())


def test_metrics_answer_openmetrics_when_asked(server: AdminServer) -> None:
    reply = request(server, "/metrics", headers={"Accept": "application/openmetrics-text"})

    assert reply.status == 200
    assert reply.headers.get_content_type() == "application/openmetrics-text"
    families = {f.name: f.samples for f in openmetrics_families(reply.body.decode())}
    assert sample_value(families["pulsar_in_messages"], topic=ORDERS) == 1500


def test_metrics_use_a_private_registry(server: AdminServer) -> None:
    assert "pulsar_rate_in" not in {family.name for family in REGISTRY.collect()}
    assert "python_info" not in scrape(server)


# Failures and lifecycle.


@pytest.mark.parametrize(
    "path",
    [
        "/admin/v2/persistent/public/default/orders/stats",
        "/admin/v2/persistent/public/default",
        "/admin/v2/broker-stats/topics",
        "/metrics",
    ],
)
def test_a_failing_stats_call_is_a_logged_500_and_the_server_carries_on(
    server: AdminServer, broker: FakeBroker, caplog: pytest.LogCaptureFixture, path: str
) -> None:
    broker.error = RuntimeError("dispatcher gone")

    with caplog.at_level(logging.ERROR, logger="brokerlet.admin"):
        reply = request(server, path)

    assert reply.status == 500
    assert "dispatcher gone" in reply.json()["reason"]
    assert any(r.exc_info and "dispatcher gone" in str(r.exc_info[1]) for r in caplog.records)
    broker.error = None
    assert request(server, path).status == 200


def test_stats_calls_run_on_a_greenlet_of_the_servers_hub(
    server: AdminServer, broker: FakeBroker
) -> None:
    request(server, "/admin/v2/persistent/public/default/orders/stats")
    request(server, "/metrics")

    hub = gevent.get_hub()
    assert len(broker.callers) == 2
    for thread_id, greenlet in broker.callers:
        assert thread_id == threading.get_ident()
        assert greenlet is not hub
        assert greenlet is not gevent.getcurrent()


def test_address_reports_the_bound_ephemeral_port(server: AdminServer) -> None:
    host, port = server.address

    assert host == "127.0.0.1"
    assert port > 0


def test_address_and_start_misuse_raise() -> None:
    admin = AdminServer("127.0.0.1", 0, topic_stats=lambda _: None, all_stats=dict)
    with pytest.raises(RuntimeError, match="not started"):
        _ = admin.address
    admin.start()
    try:
        with pytest.raises(RuntimeError, match="already started"):
            admin.start()
    finally:
        admin.stop()
    admin.stop()  # idempotent


def _refused(address: tuple[str, int]) -> bool:
    try:
        socket.create_connection(address, timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_stop_lets_a_request_in_flight_finish_and_refuses_new_ones(
    server: AdminServer, broker: FakeBroker
) -> None:
    broker.release = gevent.event.Event()
    address = server.address
    pool = gevent.get_hub().threadpool
    pending = pool.spawn(_fetch, _url(server, "/admin/v2/broker-stats/topics"), "GET", {})
    assert broker.entered.wait(5)

    stopping = gevent.spawn(server.stop, 5.0)

    def release_once_refusing() -> None:
        assert _refused(address)
        broker.release.set()  # type: ignore[union-attr]

    releaser = gevent.spawn(release_once_refusing)
    reply: Reply = pending.get(timeout=5)
    assert reply.status == 200
    assert reply.json() == broker.topics
    gevent.joinall([releaser, stopping], timeout=5, raise_error=True)
    assert stopping.dead
    assert _refused(address)


def test_stop_does_not_wait_for_served_connections(server: AdminServer) -> None:
    assert request(server, "/admin/v2/brokers/health").status == 200

    with gevent.Timeout(3):  # would expire if the served connection were kept alive
        server.stop(timeout=30)


def test_stop_drops_a_silent_connection_after_the_timeout(server: AdminServer) -> None:
    client = socket.create_connection(server.address, timeout=5)
    try:
        with gevent.Timeout(3):
            server.stop(timeout=0.1)
        # Dropped by the server (a close or a reset), not left hanging until our timeout.
        with contextlib.suppress(ConnectionResetError):
            assert client.recv(1) == b""
    finally:
        client.close()


def test_a_stopped_server_can_start_again(broker: FakeBroker) -> None:
    admin = AdminServer("127.0.0.1", 0, topic_stats=broker.topic_stats, all_stats=broker.all_stats)
    admin.start()
    admin.stop()
    admin.start()
    try:
        assert request(admin, "/admin/v2/brokers/health").body == b"ok"
    finally:
        admin.stop()
