"""The broker actor: the topic registry and the broker's lifecycle."""

from __future__ import annotations

import itertools
import logging
from typing import Any

import pykka

from brokerlet.actors._runtime import GeventActor
from brokerlet.actors.connection import GetTopic
from brokerlet.actors.ratelimit import DispatchRateLimiter
from brokerlet.actors.topic import TopicActor, TopicStats
from brokerlet.config import Settings
from brokerlet.storage import CursorStore, DiskStorage, Ledger, MemoryLedger
from brokerlet.topicops import broker_side as topic_ops
from brokerlet.topicops.nonpersistent import is_non_persistent

__all__ = ["BrokerActor", "GetAllStats", "GetTopic", "GetTopicStats"]

log = logging.getLogger(__name__)


class GetTopicStats:
    def __init__(self, name: str) -> None:
        self.name = name


class GetAllStats:
    pass


class BrokerActor(GeventActor):
    """Owns the topics: each is created on first use (PRODUCER or SUBSCRIBE)."""

    def __init__(self, settings: Settings, storage: DiskStorage | None = None) -> None:
        super().__init__()
        self.settings = settings
        self.storage = storage
        self.topics: dict[str, pykka.ActorRef[TopicActor]] = {}
        self._ledger_ids = itertools.count(1)
        self.rate_limiter = DispatchRateLimiter(
            "broker",
            settings.dispatch_throttling_rate_in_msg,
            settings.dispatch_throttling_rate_in_byte,
        )

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, GetTopic):
            return self._topic(message.name)
        if isinstance(message, GetTopicStats):
            topic = self.topics.get(message.name)
            return None if topic is None else topic.ask(TopicStats())
        if isinstance(message, GetAllStats):
            return {name: ref.ask(TopicStats()) for name, ref in self.topics.items()}
        if isinstance(message, topic_ops.BROKER_MESSAGES):
            return topic_ops.handle(self, message)
        raise TypeError(f"unexpected message {message!r}")

    def on_stop(self) -> None:
        for topic in self.topics.values():
            topic.stop(block=True, timeout=5)

    def _topic(self, name: str) -> pykka.ActorRef[TopicActor]:
        topic = self.topics.get(name)
        if topic is None:
            ledger: Ledger
            cursors: CursorStore | None = None
            if self.storage is not None and not is_non_persistent(name):
                ledger, cursors = self.storage.open_topic(name)
            else:
                ledger = MemoryLedger(next(self._ledger_ids))
            topic = TopicActor.start(name, ledger, self.settings, self.rate_limiter, cursors)
            self.topics[name] = topic
            log.info("created topic %s (ledger %d)", name, ledger.ledger_id)
        return topic
