"""Topic operations driven from outside the actors: the admin routes and ``Broker`` call these.

Each function runs on a greenlet of the broker's hub and blocks on actor asks. Failures raise
:class:`~brokerlet.topicops.errors.TopicOpError` with Pulsar's HTTP status and reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pykka

from brokerlet.actors import stats_reader
from brokerlet.actors.broker import TopicBusy
from brokerlet.actors.messages import (
    CreateSubscription,
    DeleteSubscription,
    DeleteTopic,
    ExamineMessage,
    ExpireMessages,
    GetMessage,
    GetStats,
    GetTopic,
    InternalStats,
    LastMessageId,
    ListSubscriptions,
    ListTopics,
    OpenTopic,
    PeekMessage,
    ResetCursor,
    SkipEntries,
    TerminateTopic,
    UnloadTopic,
)
from brokerlet.metadata.store import AlreadyExists, NotFound
from brokerlet.topicops import stats as stats_shape
from brokerlet.topicops.entries import StoredMessage
from brokerlet.topicops.errors import TopicOpError, topic_not_found
from brokerlet.topicops.nonpersistent import is_non_persistent

__all__ = [
    "create_subscription",
    "delete_subscription",
    "delete_topic",
    "every_topic_stats",
    "examine_message",
    "expire_messages",
    "get_message_by_id",
    "internal_stats",
    "last_message_id",
    "list_subscriptions",
    "partition_count",
    "partitioned_stats",
    "peek_messages",
    "reset_cursor",
    "skip",
    "skip_all",
    "terminate_topic",
    "topic_stats",
    "unload_topic",
]

TIMEOUT = 30.0
"""Longest wait for one operation (a peek on disk, or closing many clients)."""


def _topic(broker: Any, name: str) -> Any:
    topic = broker.ask(OpenTopic(name), timeout=TIMEOUT)
    if topic is None:
        raise topic_not_found(name)
    return topic


def _ask(broker: Any, name: str, message: object) -> Any:
    return _topic(broker, name).ask(message, timeout=TIMEOUT)


def exists(broker: Any, name: str) -> bool:
    return broker.ask(OpenTopic(name), timeout=TIMEOUT) is not None


def terminate_topic(broker: Any, name: str) -> tuple[int, int]:
    """Terminate: later producers and SENDs are refused; answers the last message id."""
    result: tuple[int, int] = _ask(broker, name, TerminateTopic())
    return result


def unload_topic(broker: Any, name: str) -> None:
    _ask(broker, name, UnloadTopic())


def delete_topic(broker: Any, name: str, *, force: bool = False) -> None:
    """The broker actor's DeleteTopic, its refusals as Pulsar's statuses."""
    try:
        broker.ask(DeleteTopic(name, force=force), timeout=TIMEOUT)
    except TopicBusy as busy:
        raise TopicOpError(412, str(busy)) from None
    except NotFound:
        raise topic_not_found(name) from None
    except AlreadyExists as exists:
        raise TopicOpError(409, str(exists)) from None


def list_subscriptions(broker: Any, name: str) -> list[str]:
    result: list[str] = _ask(broker, name, ListSubscriptions())
    return result


def create_subscription(
    broker: Any, name: str, subscription: str, position: str | tuple[int, int] = "latest"
) -> None:
    """As PersistentTopicsBase#internalCreateSubscription: a missing topic is created (the
    broker's topic creation rules apply, as for a consumer's SUBSCRIBE)."""
    topic = broker.ask(GetTopic(name), timeout=TIMEOUT)
    topic.ask(CreateSubscription(subscription, position), timeout=TIMEOUT)


def delete_subscription(broker: Any, name: str, subscription: str, *, force: bool = False) -> None:
    _ask(broker, name, DeleteSubscription(subscription, force))


def skip(broker: Any, name: str, subscription: str, count: int) -> None:
    if count < 0:
        raise TopicOpError(400, "numMessages must be >= 0")
    _ask(broker, name, SkipEntries(subscription, count))


def skip_all(broker: Any, name: str, subscription: str) -> None:
    _ask(broker, name, SkipEntries(subscription, None))


def reset_cursor(
    broker: Any,
    name: str,
    subscription: str,
    *,
    timestamp_ms: int | None = None,
    message_id: tuple[int, int] | None = None,
    excluded: bool = False,
) -> None:
    """Reset by publish time (``timestamp_ms``) or to a message id; consumers reconnect."""
    if (timestamp_ms is None) == (message_id is None):
        raise TopicOpError(400, "either a timestamp or a message id is required")
    _ask(broker, name, ResetCursor(subscription, timestamp_ms, message_id, excluded))


def expire_messages(broker: Any, name: str, subscription: str | None, seconds: int) -> None:
    if seconds < 0:
        raise TopicOpError(400, "expireTimeInSeconds must be >= 0")
    _ask(broker, name, ExpireMessages(subscription, seconds))


def peek_messages(broker: Any, name: str, subscription: str, position: int = 1) -> StoredMessage:
    if position < 1:
        raise TopicOpError(400, "messagePosition must be >= 1")
    result: StoredMessage = _ask(broker, name, PeekMessage(subscription, position))
    return result


def examine_message(
    broker: Any, name: str, initial_position: str = "latest", position: int = 1
) -> StoredMessage:
    if initial_position not in ("earliest", "latest"):
        raise TopicOpError(400, "initialPosition must be 'earliest' or 'latest'")
    if position < 1:
        raise TopicOpError(400, "messagePosition must be >= 1")
    result: StoredMessage = _ask(broker, name, ExamineMessage(initial_position, position))
    return result


def get_message_by_id(broker: Any, name: str, ledger_id: int, entry_id: int) -> StoredMessage:
    result: StoredMessage = _ask(broker, name, GetMessage(ledger_id, entry_id))
    return result


def internal_stats(broker: Any, name: str) -> dict[str, Any]:
    """PersistentTopicInternalStats: the topic's ledger part, then its open cursors, each
    dispatcher asked at once from this greenlet (no actor waits on another)."""
    shaped, dispatchers = _ask(broker, name, InternalStats())
    asked = {sub: ref.ask(GetStats(), block=False) for sub, ref in dispatchers.items()}
    for sub, future in asked.items():
        with contextlib.suppress(pykka.ActorDeadError):
            shaped["cursors"][sub] = stats_shape.cursor_stats(future.get(timeout=TIMEOUT))
    result: dict[str, Any] = shaped
    return result


def topic_stats(broker: Any, name: str) -> dict[str, Any]:
    """TopicStats in Pulsar's shape, gathered off the hot actors (``stats_reader``)."""
    try:
        return _shaped_stats(name, _topic(broker, name))
    except pykka.ActorDeadError:
        raise topic_not_found(name) from None


def every_topic_stats(broker: Any) -> dict[str, dict[str, Any]]:
    """Every open topic's TopicStats, by name (topics closed meanwhile are left out)."""
    topics: dict[str, Any] = broker.ask(ListTopics(), timeout=TIMEOUT)
    result = {}
    for name, topic in topics.items():
        with contextlib.suppress(pykka.ActorDeadError):
            result[name] = _shaped_stats(name, topic)
    return result


def _shaped_stats(name: str, topic: Any) -> dict[str, Any]:
    raw, part = stats_reader.of_topic_with_part(topic)
    return stats_shape.topic_stats(
        raw,
        non_persistent=is_non_persistent(name),
        terminated=bool(part.extra.get("terminated")),
        drops=part.extra.get("drops"),
    )


def last_message_id(broker: Any, name: str) -> dict[str, int]:
    result: dict[str, int] = _ask(broker, name, LastMessageId())
    return result


PartitionCount = Callable[[str], int]


def partition_count(context: Any, name: str) -> int:
    """The topic's partition count from the metadata store (issue 12a), else 0.

    The one place that asks the store, so wiring the store in changes nothing else. 0 means
    non-partitioned, as in Pulsar's PartitionedTopicMetadata.
    """
    metadata = getattr(context, "metadata", None)
    topics = getattr(metadata, "topics", None)  # {full name: TopicMeta(partitions, ...)}
    if topics is None:
        return 0
    stored = topics.get(name)
    return int(getattr(stored, "partitions", 0) or 0)


def partitioned_stats(
    broker: Any, name: str, partitions: int, *, per_partition: bool = True
) -> dict[str, Any]:
    """PartitionedTopicStats over ``<name>-partition-<i>``; a non-partitioned topic counts
    as its own single partition-less entry (Pulsar answers its stats with 0 partitions)."""
    if partitions <= 0:
        stats = topic_stats(broker, name)
        merged = stats_shape.aggregate_partitions({}, include_partitions=per_partition)
        merged.update({k: v for k, v in stats.items() if k not in ("metadata", "partitions")})
        merged["metadata"] = {"partitions": 0}
        return merged
    per: dict[str, dict[str, Any]] = {}
    for index in range(partitions):
        partition = f"{name}-partition-{index}"
        if exists(broker, partition):
            per[partition] = topic_stats(broker, partition)
    if not per:
        raise topic_not_found(name)
    merged = stats_shape.aggregate_partitions(per, include_partitions=per_partition)
    merged["metadata"] = {"partitions": partitions}
    return merged


def broker_topic_stats(all_stats: dict[str, Any]) -> dict[str, Any]:
    return stats_shape.broker_topic_stats(all_stats)
