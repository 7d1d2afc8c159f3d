"""Topic metadata routes (``admin/v2/PersistentTopics.java``, ``PersistentTopicsBase``):
list topics, create and delete topics, create / get / grow / delete partitioned topics.

Creation and deletion are asked of the broker actor, which serialises them with topics
created over the binary protocol. Partitions are ordinary topics ``<name>-partition-<i>``,
so every per-topic route serves them as it serves any topic.
"""

from __future__ import annotations

from typing import Any

from brokerlet.actors.broker import CreateTopic, DeleteTopic, PartitionedMetadata, UpdatePartitions
from brokerlet.admin.rest import AdminRequest, RestError, Route, query_bool
from brokerlet.admin.routes._common import (
    ask_broker,
    metadata_errors,
    namespace_of,
    store_of,
    topic_of,
)
from brokerlet.metadata.naming import TopicName
from brokerlet.metadata.topics import (
    MODE_NON_PERSISTENT,
    MODE_PERSISTENT,
    partitions_of,
    topic_names,
)

__all__ = ["routes"]

NAMESPACE = "/admin/v2/<domain:domain>/<seg:tenant>/<seg:namespace>"
TOPIC = f"{NAMESPACE}/<seg:topic>"
PARTITIONED_MEDIA_TYPE = "application/vnd.partitioned-topic-metadata+json"


def _mode(domain: str) -> int:
    return MODE_PERSISTENT if domain == "persistent" else MODE_NON_PERSISTENT


def list_topics(request: AdminRequest, domain: str, tenant: str, namespace: str) -> object:
    if request.context.metadata is None:
        # The HTTP layer on its own (tests): the topics are the ones with stats.
        prefix = f"{domain}://{tenant}/{namespace}/"
        all_stats = request.context.all_stats
        assert all_stats is not None
        return sorted(name for name in all_stats() if name.startswith(prefix))
    name = namespace_of(request, tenant, namespace)
    return topic_names(store_of(request), name, _mode(domain))


def list_partitioned(request: AdminRequest, domain: str, tenant: str, namespace: str) -> object:
    name = namespace_of(request, tenant, namespace)
    prefix = f"{domain}://"
    return [
        meta.name
        for meta in store_of(request).topics_of(name)
        if meta.partitions > 0 and meta.name.startswith(prefix)
    ]


def _properties(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise RestError(400, "properties: must be an object of string values")
    return value


def create_topic(
    request: AdminRequest, domain: str, tenant: str, namespace: str, topic: str
) -> None:
    name = topic_of(request, domain, tenant, namespace, topic)
    properties = _properties(request.json(default=None))
    ask_broker(request, CreateTopic(name.full, 0, properties))


def _partition_count(request: AdminRequest, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RestError(400, f"partitions: must be an integer, got {value!r}")
    if value <= 0:
        raise RestError(406, "Number of partitions should be more than 0")
    return value


def create_partitioned(
    request: AdminRequest, domain: str, tenant: str, namespace: str, topic: str
) -> None:
    name = topic_of(request, domain, tenant, namespace, topic)
    body = request.json()
    properties: dict[str, str] = {}
    if isinstance(body, dict):  # application/vnd.partitioned-topic-metadata+json
        properties = _properties(body.get("properties"))
        body = body.get("partitions")
    partitions = _partition_count(request, body)
    limit = request.context.settings.max_num_partitions_per_partitioned_topic
    if limit > 0 and partitions > limit:
        raise RestError(406, f"Number of partitions should be less than or equal to {limit}")
    if name.partition_index >= 0:
        raise RestError(412, f"{name} is a partition name; a partitioned topic cannot have it")
    ask_broker(request, CreateTopic(name.full, partitions, properties))


def update_partitioned(
    request: AdminRequest, domain: str, tenant: str, namespace: str, topic: str
) -> None:
    name = topic_of(request, domain, tenant, namespace, topic)
    partitions = _partition_count(request, request.json())
    current = partitions_of(store_of(request), name)
    if not current:
        raise RestError(409, f"Topic {name} is not the partitioned topic.")
    if partitions < current:
        raise RestError(
            422, f"Expect partitions {partitions} can't less than current partitions {current}."
        )
    limit = request.context.settings.max_num_partitions_per_partitioned_topic
    if limit > 0 and partitions > limit:
        raise RestError(
            422,
            f"Expect partitions {partitions} grater than maximum partitions per topic {limit}",
        )
    if partitions != current:
        ask_broker(request, UpdatePartitions(name.full, partitions))


def get_partitioned(
    request: AdminRequest, domain: str, tenant: str, namespace: str, topic: str
) -> object:
    name = topic_of(request, domain, tenant, namespace, topic)
    if query_bool(request, "checkAllowAutoCreation"):
        # As the binary PARTITIONED_METADATA: may auto-create a partitioned topic.
        partitions = ask_broker(request, PartitionedMetadata(name.full))
    else:
        partitions = partitions_of(store_of(request), name) or 0
    meta = store_of(request).topics.get(name.full)
    properties: dict[str, Any] = dict(meta.properties) if meta is not None else {}
    return {"partitions": partitions, "properties": properties, "deleted": False}


def delete_topic(
    request: AdminRequest, domain: str, tenant: str, namespace: str, topic: str
) -> None:
    name = topic_of(request, domain, tenant, namespace, topic)
    ask_broker(request, DeleteTopic(name.full, force=query_bool(request, "force")))


def delete_partitioned(
    request: AdminRequest, domain: str, tenant: str, namespace: str, topic: str
) -> None:
    name = topic_of(request, domain, tenant, namespace, topic)
    message = DeleteTopic(name.full, force=query_bool(request, "force"), partitioned=True)
    ask_broker(request, message)


def parse_topic(domain: str, tenant: str, namespace: str, topic: str) -> TopicName:
    """For other route modules: the checked topic name (412 when malformed)."""
    with metadata_errors():
        return TopicName.of(domain, tenant, namespace, topic)


def routes() -> list[Route]:
    return [
        Route(NAMESPACE, ("GET",), list_topics, auth="consume"),
        Route(f"{NAMESPACE}/partitioned", ("GET",), list_partitioned, auth="consume"),
        Route(TOPIC, ("PUT",), create_topic, auth="tenant"),
        Route(TOPIC, ("DELETE",), delete_topic, auth="tenant"),
        Route(f"{TOPIC}/partitions", ("PUT",), create_partitioned, auth="tenant"),
        Route(f"{TOPIC}/partitions", ("POST",), update_partitioned, auth="tenant"),
        Route(f"{TOPIC}/partitions", ("GET",), get_partitioned, auth="lookup"),
        Route(f"{TOPIC}/partitions", ("DELETE",), delete_partitioned, auth="tenant"),
    ]
