"""The broker actor: the topic registry and the broker's lifecycle.

It is also the one place topics come and go in the metadata store, so a topic created over
the binary protocol and one deleted over HTTP at the same moment are serialised here: the
metadata rules live in :mod:`brokerlet.metadata.topics`, this actor applies them.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import Any

import gevent
import pykka

from brokerlet.actors import stats_reader
from brokerlet.actors._loop import in_turns
from brokerlet.actors._runtime import GeventActor
from brokerlet.actors.errors import BrokerError, parsed_topic
from brokerlet.actors.messages import (
    BacklogQuotaReport,
    CloseClients,
    CloseIfIdle,
    CreateTopic,
    DeleteTopic,
    ExpireEntries,
    FindTopic,
    GetTopic,
    IsIdle,
    ListTopics,
    MaybeCompact,
    OpenTopic,
    PartitionedMetadata,
    Subscribe,
    TopicFailed,
    TopicsOfNamespace,
    UnexpectedMessage,
    UpdatePartitions,
)
from brokerlet.actors.supervision import CursorState, stop_quietly, tell_quietly
from brokerlet.actors.topic import TopicActor
from brokerlet.config import Settings
from brokerlet.dispatch.options import DEFAULT_OPTIONS, DispatchOptions
from brokerlet.dispatch.ratelimit import DispatchRateLimiter
from brokerlet.dispatch.strategy import SUB_TYPE_NAMES
from brokerlet.metadata import MetadataStore, TopicName
from brokerlet.metadata import topics as rules
from brokerlet.metadata.policies import PolicyError, deduplication
from brokerlet.metadata.store import AlreadyExists, NotFound
from brokerlet.storage import CursorStore, DiskStorage, Ledger, MemoryLedger
from brokerlet.storage.backlog_quota import QuotaService, QuotaState, backlog_quotas
from brokerlet.storage.expiry import ExpiryService, message_ttl
from brokerlet.storage.retention import RetentionPolicy, RetentionService, retention_policy
from brokerlet.topicops import broker_side as topic_ops
from brokerlet.topicops.nonpersistent import is_non_persistent
from brokerlet.transport.protocol import pb

__all__ = [
    "BrokerActor",
    "CloseIfIdle",
    "CreateTopic",
    "DeleteTopic",
    "GetTopic",
    "PartitionedMetadata",
    "TopicBusy",
    "TopicsOfNamespace",
    "UpdatePartitions",
    "close_idle_topics",
]

log = logging.getLogger(__name__)


class TopicBusy(Exception):  # noqa: N818 - Pulsar's TopicBusyException
    """A topic still has producers or consumers connected."""


class BrokerActor(GeventActor):
    """Owns the topics: each is created on first use (PRODUCER or SUBSCRIBE)."""

    def __init__(
        self,
        settings: Settings,
        storage: DiskStorage | None = None,
        metadata: MetadataStore | None = None,
        dispatch_options: DispatchOptions = DEFAULT_OPTIONS,
        *,
        topic_deleted: Callable[[str], object] | None = None,
        topics: dict[str, pykka.ActorRef[TopicActor]] | None = None,
    ) -> None:
        super().__init__()
        # Told the name of every deleted topic (a partitioned one by its own name, after its
        # partitions): the schema registry drops its history there.
        self._topic_deleted = topic_deleted
        self.settings = settings
        self.dispatch_options = dispatch_options
        self.storage = storage
        self._metadata = metadata
        # Only this actor changes it; the connections read it (a topic that is open).
        self.topics: dict[str, pykka.ActorRef[TopicActor]] = {} if topics is None else topics
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
        # Retention runs on a greenlet of its own (storage side), never on this actor's.
        self.retention = RetentionService(
            self.retention_policy, settings.retention_check_interval_in_seconds
        )
        self._ledgers: dict[str, Ledger] = {}  # of the open topics
        self.expiry = ExpiryService(
            self._expiry_targets,
            lambda topic: message_ttl(self.namespace_policies(topic), self.settings),
            settings.message_expiry_check_interval_in_minutes * 60,
        )
        # What each open topic was last told by the quota check, and by which of its actors.
        self._quota_told: dict[str, tuple[pykka.ActorRef[TopicActor], QuotaState]] = {}
        self.quotas = QuotaService(
            self._quota_targets,
            lambda topic: backlog_quotas(self.namespace_policies(topic), self.settings),
            settings.backlog_quota_check_interval_in_seconds,
        )

    def _monitor_compaction(self) -> None:
        """brokerServiceCompactionThresholdInBytes / namespace compactionThreshold, checked
        every brokerServiceCompactionMonitorIntervalInSeconds (each topic decides)."""
        while True:
            gevent.sleep(self.settings.broker_service_compaction_monitor_interval_in_seconds)
            for name, ref in in_turns(list(self.topics.items())):
                stored = (self.namespace_policies(name) or {}).get("compaction_threshold")
                threshold = (
                    self.settings.broker_service_compaction_threshold_in_bytes
                    if stored is None
                    else int(stored)
                )
                if threshold > 0:
                    tell_quietly(ref, MaybeCompact(threshold))

    def _open_ledgers(self) -> Iterator[tuple[str, pykka.ActorRef[TopicActor], Ledger]]:
        """The open topics with their ledgers, from a copy of the map, one at a time: the
        periodic passes take turns between topics, and make what they need per topic as
        they reach it (building it for all first held the hub)."""
        for name, ref in list(self.topics.items()):
            ledger = self._ledgers.get(name)
            if ledger is not None:
                yield name, ref, ledger

    def _quota_targets(self) -> Iterator[tuple[str, Ledger, Callable[[QuotaState, int], None]]]:
        for gone in self._quota_told.keys() - self.topics.keys():
            del self._quota_told[gone]
        for name, ref, ledger in self._open_ledgers():
            yield name, ledger, partial(self._report_quota, name, ref)

    def _report_quota(
        self, name: str, topic: pykka.ActorRef[TopicActor], state: QuotaState, evict_to: int
    ) -> None:
        """Tell ``topic`` its quota state, unless the same actor was told this state and
        there is nothing to do: telling every topic at every check woke each topic's actor
        (8,000 runs a minute with 8,000 topics, the hub's replies queued behind them). An
        exceeded state is told each time (the topic acts on it, and may reset it itself)."""
        told = (topic, state)
        if evict_to < 0 and state.exceeded is None and self._quota_told.get(name) == told:
            return
        self._quota_told[name] = told
        tell_quietly(topic, BacklogQuotaReport(state, evict_to))

    def _expiry_targets(self) -> Iterator[tuple[str, Ledger, Callable[[int], None]]]:
        for name, ref, ledger in self._open_ledgers():
            yield name, ledger, _expirer(ref)

    def namespace_policies(self, topic: str) -> Mapping[str, Any] | None:
        """The stored policies of ``topic``'s namespace (None when unknown)."""
        try:
            namespace = TopicName.parse(topic).namespace
        except Exception:
            return None
        return self.metadata.namespaces.get(namespace)

    def retention_policy(self, topic: str) -> RetentionPolicy:
        return retention_policy(self.namespace_policies(topic), self.settings)

    def on_start(self) -> None:
        self.retention.start()
        self.expiry.start()
        if self.settings.backlog_quota_check_enabled:
            self.quotas.start()
        self._compaction_monitor = gevent.spawn(self._monitor_compaction)

    @property
    def metadata(self) -> MetadataStore:
        # Made on first use, on the actor's hub: the store's lock belongs to that hub.
        if self._metadata is None:
            self._metadata = MetadataStore(None, cluster=self.settings.cluster_name)
        return self._metadata

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, GetTopic):
            return self._topic(message.name, recovering=message.recovering, create=message.create)
        if isinstance(message, FindTopic):
            return self.topics.get(message.name)
        if isinstance(message, ListTopics):
            return dict(self.topics)
        if isinstance(message, TopicFailed):
            return self._topic_failed(message)
        if isinstance(message, CloseIfIdle):
            return self._close_if_idle(message.name, message.topic)
        if isinstance(message, PartitionedMetadata):
            return self._refusing(rules.partitioned_metadata, parsed_topic(message.name))
        if isinstance(message, TopicsOfNamespace):
            return rules.topic_names(self.metadata, message.namespace, message.mode)
        if isinstance(message, CreateTopic):
            return self._create(message)
        if isinstance(message, UpdatePartitions):
            return self._update_partitions(message)
        if isinstance(message, DeleteTopic):
            return self._delete(message)
        if isinstance(message, OpenTopic):
            return topic_ops.open_topic(self, message.name)
        raise UnexpectedMessage(self, message)

    def on_stop(self) -> None:
        self.retention.stop()
        self.expiry.stop()
        self.quotas.stop()
        self._compaction_monitor.kill(block=False)
        for topic in self.topics.values():
            stop_quietly(topic)

    def _refusing(self, rule: Any, name: TopicName) -> Any:
        try:
            return rule(self.metadata, self.settings, name)
        except rules.Refused as refused:
            raise BrokerError.refused(refused) from None

    def _topic(
        self, name: str, *, recovering: bool = False, create: bool = True
    ) -> pykka.ActorRef[TopicActor]:
        topic = self.topics.get(name)
        if topic is None:
            parsed = parsed_topic(name)
            if recovering:
                self._adopt(parsed)
            elif not create and not rules.exists(self.metadata, parsed):
                raise BrokerError(pb.TopicNotFound, f"Topic {name} does not exist")
            else:
                self._refusing(rules.admit, parsed)
            ledger: Ledger
            cursors: CursorStore | None = None
            if self.storage is not None and not is_non_persistent(name):
                ledger, cursors = self.storage.open_topic(name)
            else:
                memory = self._memory_ledgers.get(name)
                if memory is None:
                    memory = self._memory_ledgers[name] = MemoryLedger(
                        next(self._ledger_ids), self.settings.segment_bytes
                    )
                ledger = memory
            if not is_non_persistent(name):  # the data rules are for persistent topics
                self.retention.watch(name, ledger)
            self._ledgers[name] = ledger
            topic = TopicActor.start(
                name,
                ledger,
                self.settings,
                self.rate_limiter,
                cursors,
                supervisor=self.actor_ref,
                restored=self._restored.pop(name, None),
                retention=self.retention,
                dispatch_options=self.dispatch_options,
                deduplication=deduplication(self.metadata.namespaces.get(parsed.namespace)),
            )
            self.topics[name] = topic
            log.info("opened topic %s (ledger %d)", name, ledger.ledger_id)
        return topic

    def _topic_failed(self, message: TopicFailed) -> None:
        if self.topics.get(message.name) is message.topic:
            del self.topics[message.name]
            self._restored[message.name] = message.cursors
            log.info("topic %s is reopened on next use", message.name)

    def _close_if_idle(self, name: str, topic: pykka.ActorRef[TopicActor]) -> bool:
        """One topic of the inactive-topic check (`close_idle_topics`), asked again here: no
        GetTopic hands the topic out between its answer and its close.

        Only disk topics close: a memory topic's data lives in its ledger, which holds no
        file, and closing it would drop the data.
        """
        if self.storage is None or self.topics.get(name) is not topic:
            return False
        try:
            idle = topic.ask(IsIdle(), block=True, timeout=5)
        except (pykka.ActorDeadError, pykka.Timeout):
            return False
        if not idle:
            return False
        del self.topics[name]
        stop_quietly(topic)
        return True

    def _adopt(self, name: TopicName) -> None:
        """A topic found in storage at start-up: make sure the metadata knows it."""
        store = self.metadata
        if rules.exists(store, name):
            return
        if name.tenant not in store.tenants:
            info = {"adminRoles": [], "allowedClusters": [store.cluster]}
            store.create_tenant(name.tenant, info)
            log.warning("tenant %s recreated for stored topic %s", name.tenant, name)
        if name.namespace not in store.namespaces:
            store.create_namespace(name.namespace, {})
            log.warning("namespace %s recreated for stored topic %s", name.namespace, name)
        store.create_topic(name.full, name.namespace, 0, exist_ok=True)

    # Admin operations.

    def _create(self, message: CreateTopic) -> None:
        name = parsed_topic(message.name)
        store = self.metadata
        if name.namespace not in store.namespaces:
            raise NotFound("Namespace does not exist")
        if rules.exists(store, name) or name.full in self.topics:
            raise AlreadyExists("This topic already exists")
        store.create_topic(name.full, name.namespace, message.partitions, message.properties)

    def _update_partitions(self, message: UpdatePartitions) -> None:
        stored = self.metadata.topics.get(message.name)
        if stored is not None and message.partitions < stored.partitions:
            # Checked again here: two updates racing must not shrink the topic.
            raise PolicyError(
                422,
                f"Expect partitions {message.partitions} can't less than current "
                f"partitions {stored.partitions}.",
            )
        self.metadata.update_partitions(message.name, message.partitions)
        if stored is not None:
            name = parsed_topic(message.name)
            self._copy_subscriptions(name, stored.partitions, message.partitions)

    def _copy_subscriptions(self, name: TopicName, old: int, new: int) -> None:
        """New partitions get partition 0's durable subscriptions, at their start, as
        ``internalUpdatePartitionedTopicAsync`` does: nothing published to them before a
        consumer finds them is lost to those subscriptions."""
        first = self.topics.get(name.partition(0).full)
        if first is None or new <= old:
            return
        stats = stats_reader.of_topic(first)  # an admin operation: waiting here is fine
        durable = [
            (sub, stat.get("type"))
            for sub, stat in stats.get("subscriptions", {}).items()
            if stat.get("isDurable", True)
        ]
        kinds = {kind_name: kind for kind, kind_name in SUB_TYPE_NAMES.items()}
        for index in range(old, new):
            topic = self._topic(name.partition(index).full)
            for sub, kind_name in durable:
                kind = kinds.get(kind_name, pb.CommandSubscribe.Exclusive)
                topic.ask(Subscribe(sub, kind, True, pb.CommandSubscribe.Earliest))

    def _delete(self, message: DeleteTopic) -> None:
        name = parsed_topic(message.name)
        store = self.metadata
        stored = store.topics.get(name.full)
        if message.partitioned:
            if stored is None or stored.partitions == 0:
                raise NotFound("Partitioned topic does not exist")
            victims = [name.partition(i).full for i in range(stored.partitions)]
        else:
            if stored is not None and stored.partitions > 0:
                raise AlreadyExists(f"{name} is a partitioned topic: delete its partitions")
            if not rules.exists(store, name) and name.full not in self.topics:
                raise NotFound("Topic not found")
            victims = [name.full]
        live = [(v, self.topics[v]) for v in victims if v in self.topics]
        if not message.force:
            for _, ref in live:
                with contextlib.suppress(pykka.ActorDeadError):
                    if ref.ask(CloseClients(close=False)):
                        raise TopicBusy("Topic has active producers/subscriptions")
        for victim, ref in live:
            with contextlib.suppress(pykka.ActorDeadError):
                ref.ask(CloseClients(close=True))
            stop_quietly(ref)
            del self.topics[victim]
        for victim in victims:
            # A deleted topic comes back empty: no kept memory ledger, no restored cursors.
            self._memory_ledgers.pop(victim, None)
            self._restored.pop(victim, None)
            self.retention.forget(victim)
            self._ledgers.pop(victim, None)
        if self.storage is not None:
            for victim in victims:
                self.storage.delete_topic(victim)
        if stored is not None:
            store.delete_topic(name.full)
        if self._topic_deleted is not None:
            try:
                self._topic_deleted(name.full)
            except Exception:  # the topic is gone either way; say what was left behind
                log.exception("topic %s deleted, but the hook for its deletion failed", name)
        log.info("deleted topic %s%s", name, " (forced)" if message.force else "")


def close_idle_topics(
    broker: pykka.ActorRef[BrokerActor], topics: Mapping[str, pykka.ActorRef[TopicActor]]
) -> list[str]:
    """Pulsar's inactive-topic check, closing only (the data and cursors stay stored): the
    names of the open ``topics`` it closed.

    Runs outside the broker actor, which is asked only about the topics that answered idle:
    a topic with a durable subscription is never idle, and a test suite leaves thousands of
    them open, each asked every minute (asked from the broker actor, they held topic
    creation for 100-190 ms a pass with 8,000 open).
    """
    closed: list[str] = []
    for name, topic in list(topics.items()):
        try:
            idle = topic.ask(IsIdle(), block=True, timeout=5)  # waiting, the greenlet yields
        except (pykka.ActorDeadError, pykka.Timeout):
            continue
        if idle and broker.ask(CloseIfIdle(name, topic), block=True):
            closed.append(name)
    if closed:
        log.info("closed %d idle topic(s): %s", len(closed), ", ".join(closed[:10]))
    return closed


def _expirer(topic: pykka.ActorRef[TopicActor]) -> Callable[[int], None]:
    def expire(entry_id: int) -> None:
        tell_quietly(topic, ExpireEntries(entry_id))

    return expire
