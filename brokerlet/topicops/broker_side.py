"""The broker actor's part of the topic operations: finding and deleting topics."""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

import pykka

from brokerlet.actors.connection import GetTopic
from brokerlet.topicops.errors import topic_not_found
from brokerlet.topicops.messages import DeleteTopic, FindTopic, PrepareDelete
from brokerlet.topicops.nonpersistent import is_non_persistent

if TYPE_CHECKING:
    from brokerlet.actors.broker import BrokerActor

__all__ = ["BROKER_MESSAGES", "handle"]

log = logging.getLogger(__name__)

BROKER_MESSAGES = (FindTopic, DeleteTopic)


def handle(broker: BrokerActor, message: Any) -> Any:
    if isinstance(message, FindTopic):
        return _find(broker, message.name)
    if isinstance(message, DeleteTopic):
        return _delete(broker, message)
    raise TypeError(f"unexpected message {message!r}")


def _find(broker: BrokerActor, name: str) -> Any:
    """The topic's actor; a stored topic closed while idle is opened again."""
    topic = broker.topics.get(name)
    storage = broker.storage
    stored = storage is not None and not is_non_persistent(name) and name in storage.topics()
    if topic is None and stored:
        topic = broker.on_receive(GetTopic(name))
    return topic


def _delete(broker: BrokerActor, message: DeleteTopic) -> None:
    """Close the topic's clients (or refuse), then drop it and its storage.

    Runs on the broker actor throughout, so a client reconnecting meanwhile (its GetTopic
    waits behind this message) finds a fresh topic, never the one being deleted.
    """
    topic = _find(broker, message.name)
    if topic is None:
        raise topic_not_found(message.name)
    topic.ask(PrepareDelete(message.force))
    del broker.topics[message.name]
    broker._memory_ledgers.pop(message.name, None)  # a new topic of the name starts empty
    broker._restored.pop(message.name, None)
    with contextlib.suppress(pykka.ActorDeadError):
        topic.stop(block=True, timeout=5)
    if broker.storage is not None and message.name in broker.storage.topics():
        broker.storage.delete_topic(message.name)
    log.info("deleted topic %s", message.name)
