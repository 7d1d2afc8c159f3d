"""The errors of topic operations, carrying the HTTP status and reason Pulsar answers."""

from __future__ import annotations

__all__ = ["TopicOpError", "subscription_not_found", "topic_not_found"]


class TopicOpError(Exception):
    """A refused topic operation: ``status`` is Pulsar's HTTP status, ``reason`` its text."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def topic_not_found(topic: str) -> TopicOpError:
    # PersistentTopicsBase#getTopicNotFoundErrorMessage
    return TopicOpError(404, f"Topic {topic} not found")


def subscription_not_found(topic: str, subscription: str) -> TopicOpError:
    # PersistentTopicsBase#getSubNotFoundErrorMessage
    return TopicOpError(404, f"Subscription {subscription} not found for topic {topic}")


def message_not_found() -> TopicOpError:
    return TopicOpError(404, "Message not found")
