"""The broker actor's part of the topic operations: ``OpenTopic``, finding a topic without
creating it.

Deleting is the broker actor's own ``DeleteTopic`` (issue 12a), which closes the clients,
the metadata and the storage together.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from brokerlet.actors.messages import GetTopic
from brokerlet.metadata import TopicName
from brokerlet.metadata.topics import partitions_of
from brokerlet.topicops.nonpersistent import is_non_persistent

if TYPE_CHECKING:
    from brokerlet.actors.broker import BrokerActor

__all__ = ["open_topic"]

log = logging.getLogger(__name__)


def open_topic(broker: BrokerActor, name: str) -> Any:
    """The topic's actor; a topic the metadata knows but no actor serves yet (created over
    the admin API, or closed while idle) is opened."""
    topic = broker.topics.get(name)
    if topic is not None:
        return topic
    try:
        parsed = TopicName.parse(name)
    except ValueError:
        return None
    storage = broker.storage
    stored = storage is not None and not is_non_persistent(name) and name in storage.topics()
    if stored or partitions_of(broker.metadata, parsed) == 0:
        return broker.on_receive(GetTopic(name))
    return None
