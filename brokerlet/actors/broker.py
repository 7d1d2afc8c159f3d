"""The broker actor: the topic registry and the broker's lifecycle."""

from __future__ import annotations

import contextlib
import itertools
import logging
from typing import Any

import pykka

from brokerlet.actors._runtime import GeventActor
from brokerlet.actors.connection import GetTopic
from brokerlet.actors.ratelimit import DispatchRateLimiter
from brokerlet.actors.supervision import CursorState, TopicFailed, stop_quietly
from brokerlet.actors.topic import IsIdle, TopicActor, TopicStats
from brokerlet.config import Settings
from brokerlet.storage import CursorStore, DiskStorage, Ledger, MemoryLedger
from brokerlet.topicops import broker_side as topic_ops
from brokerlet.topicops.nonpersistent import is_non_persistent

__all__ = ["BrokerActor", "CloseIdleTopics", "GetAllStats", "GetTopic", "GetTopicStats"]

log = logging.getLogger(__name__)


class GetTopicStats:
    def __init__(self, name: str) -> None:
        self.name = name


class GetAllStats:
    pass


class CloseIdleTopics:
    """Close (never delete) every topic with no producer and no subscription."""


class BrokerActor(GeventActor):
    """Owns the topics: each is created on first use (PRODUCER or SUBSCRIBE)."""

    def __init__(self, settings: Settings, storage: DiskStorage | None = None) -> None:
        super().__init__()
        self.settings = settings
        self.storage = storage
        self.topics: dict[str, pykka.ActorRef[TopicActor]] = {}
        # Memory ledgers outlive their topic actor: a replacement or a reopened topic reuses
        # them. Disk ledgers are reopened from storage, which hands back an open one.
        self._memory_ledgers: dict[str, MemoryLedger] = {}
        self._restored: dict[str, dict[str, CursorState]] = {}
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
            stats = {}
            for name, ref in list(self.topics.items()):
                with contextlib.suppress(pykka.ActorDeadError):
                    stats[name] = ref.ask(TopicStats())
            return stats
        if isinstance(message, TopicFailed):
            return self._topic_failed(message)
        if isinstance(message, CloseIdleTopics):
            return self._close_idle_topics()
        if isinstance(message, topic_ops.BROKER_MESSAGES):
            return topic_ops.handle(self, message)
        raise TypeError(f"unexpected message {message!r}")

    def on_stop(self) -> None:
        for topic in self.topics.values():
            stop_quietly(topic)

    def _topic(self, name: str) -> pykka.ActorRef[TopicActor]:
        topic = self.topics.get(name)
        if topic is None:
            ledger: Ledger
            cursors: CursorStore | None = None
            if self.storage is not None and not is_non_persistent(name):
                ledger, cursors = self.storage.open_topic(name)
            else:
                memory = self._memory_ledgers.get(name)
                if memory is None:
                    memory = self._memory_ledgers[name] = MemoryLedger(next(self._ledger_ids))
                ledger = memory
            topic = TopicActor.start(
                name,
                ledger,
                self.settings,
                self.rate_limiter,
                cursors,
                supervisor=self.actor_ref,
                restored=self._restored.pop(name, None),
            )
            self.topics[name] = topic
            log.info("opened topic %s (ledger %d)", name, ledger.ledger_id)
        return topic

    def _topic_failed(self, message: TopicFailed) -> None:
        if self.topics.get(message.name) is message.topic:
            del self.topics[message.name]
            self._restored[message.name] = message.cursors
            log.info("topic %s is reopened on next use", message.name)

    def _close_idle_topics(self) -> list[str]:
        """Pulsar's inactive-topic check, closing only: the data and cursors stay stored.

        Only disk topics close: a memory topic's data lives in its ledger, which holds no
        file, and closing it would drop the data.
        """
        closed: list[str] = []
        if self.storage is None:
            return closed
        for name, ref in list(self.topics.items()):
            try:
                idle = ref.ask(IsIdle(), timeout=5)
            except (pykka.ActorDeadError, pykka.Timeout):
                continue
            if idle and self.topics.get(name) is ref:
                del self.topics[name]
                stop_quietly(ref)
                closed.append(name)
        if closed:
            log.info("closed %d idle topic(s): %s", len(closed), ", ".join(closed[:10]))
        return closed
