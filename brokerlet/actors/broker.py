"""The broker actor: the topic registry and the broker's lifecycle."""

from __future__ import annotations

import itertools
import logging
from typing import Any

import pykka

from brokerlet.actors._runtime import GeventActor
from brokerlet.actors.messages import (
    FindTopic,
    GetTopic,
    ListTopics,
    UnexpectedMessage,
)
from brokerlet.actors.topic import TopicActor
from brokerlet.config import Settings
from brokerlet.dispatch.options import DEFAULT_OPTIONS, DispatchOptions
from brokerlet.dispatch.ratelimit import DispatchRateLimiter
from brokerlet.storage import CursorStore, DiskStorage, Ledger, MemoryLedger

__all__ = ["BrokerActor"]

log = logging.getLogger(__name__)


class BrokerActor(GeventActor):
    """Owns the topics: each is created on first use (PRODUCER or SUBSCRIBE)."""

    def __init__(
        self,
        settings: Settings,
        storage: DiskStorage | None = None,
        dispatch_options: DispatchOptions = DEFAULT_OPTIONS,
    ) -> None:
        super().__init__()
        self.settings = settings
        self.dispatch_options = dispatch_options
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
        if isinstance(message, FindTopic):
            return self.topics.get(message.name)
        if isinstance(message, ListTopics):
            return dict(self.topics)
        raise UnexpectedMessage(self, message)

    def on_stop(self) -> None:
        for topic in self.topics.values():
            topic.stop(block=True, timeout=5)

    def _topic(self, name: str) -> pykka.ActorRef[TopicActor]:
        topic = self.topics.get(name)
        if topic is None:
            ledger: Ledger
            cursors: CursorStore | None = None
            if self.storage is not None:
                ledger, cursors = self.storage.open_topic(name)
            else:
                ledger = MemoryLedger(next(self._ledger_ids))
            topic = TopicActor.start(
                name,
                ledger,
                self.settings,
                self.rate_limiter,
                cursors,
                dispatch_options=self.dispatch_options,
            )
            self.topics[name] = topic
            log.info("created topic %s (ledger %d)", name, ledger.ledger_id)
        return topic
