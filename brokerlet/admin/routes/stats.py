"""Stats, health and metrics: topic stats, every topic's stats, ``/metrics``."""

from __future__ import annotations

from typing import Any

from prometheus_client.exposition import choose_encoder

from brokerlet.admin.rest import AdminRequest, Reply, RestError, Route
from brokerlet.admin.routes import topics_ops

__all__ = ["routes"]

TOPIC = "/admin/v2/<domain:domain>/<seg:tenant>/<seg:namespace>/<seg:topic>"


def topic_stats(
    request: AdminRequest, domain: str, tenant: str, namespace: str, topic: str
) -> object:
    if request.context.broker is not None:  # Pulsar's TopicStats shape (topic operations)
        return topics_ops.stats(
            request, domain=domain, tenant=tenant, namespace=namespace, topic=topic
        )
    stats_of = request.context.topic_stats
    assert stats_of is not None
    stats = stats_of(f"{domain}://{tenant}/{namespace}/{topic}")
    if stats is None:
        raise RestError(404, "Topic not found")
    return stats


def every_topic(request: AdminRequest) -> object:
    if request.context.broker is not None:  # Pulsar's nesting (topic operations)
        return topics_ops.broker_stats_topics(request)
    all_stats = request.context.all_stats
    assert all_stats is not None
    return all_stats()


def metrics(request: AdminRequest) -> Reply:
    encode, content_type = choose_encoder(request.headers.get("Accept", ""))
    body: Any = encode(request.context.registry)
    return Reply(200, bytes(body), content_type=content_type)


def routes() -> list[Route]:
    return [
        Route(f"{TOPIC}/stats", ("GET",), topic_stats, auth="tenant"),
        Route("/admin/v2/broker-stats/topics", ("GET",), every_topic, auth="super"),
        Route("/metrics", ("GET",), metrics, auth="none"),
    ]
