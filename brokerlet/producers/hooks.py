"""The topic actor's hook into producer semantics: one object per topic, called on
AddProducer, RemoveProducer and each Append (see brokerlet.actors.topic)."""

from __future__ import annotations

import contextlib
import datetime
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from brokerlet.actors.errors import BrokerError
from brokerlet.actors.messages import AppendItem, CloseConsumers
from brokerlet.actors.supervision import tell_quietly
from brokerlet.config import Settings
from brokerlet.producers.access import ProducerAccess, ProducerEntry, mode_name
from brokerlet.producers.dedup import Deduplication, Verdict
from brokerlet.producers.messages import (
    ProducerAdmitted,
    ProducerFenced,
    ProducerReady,
    ProducerRefused,
)
from brokerlet.producers.state import (
    DEDUP_KEY,
    EPOCH_KEY,
    MemoryProperties,
    Properties,
    is_last_chunk,
    may_be_chunked,
    recover,
)
from brokerlet.storage.ledger import Ledger
from brokerlet.transport.protocol import ProtocolError, parse_metadata, pb

__all__ = ["Screened", "TopicProducers", "check_consumer_limits"]

log = logging.getLogger(__name__)

NO_ID = 2**64 - 1  # -1 as the uint64 of a MessageIdData: a duplicate's receipt (-1:-1)
_NOTHING: dict[int, Any] = {}


@dataclass(frozen=True, slots=True)
class Screened:
    """What `TopicProducers.screen` learnt about one Append, for `appended`."""

    name: str
    partial: frozenset[int]  # indexes of chunks other than their message's last
    run_highest: int | None = None  # every item new (a `check_run`): stored as one


class TopicProducers:
    """Access modes, topic epoch and deduplication of one topic."""

    def __init__(
        self,
        topic: str,
        ledger: Ledger,
        settings: Settings,
        properties: Properties | None,
        deduplication: bool | None,
        *,
        receipt: Callable[..., Any],
    ) -> None:
        self.topic = topic
        self.receipt = receipt  # the topic's Receipt type
        self.ledger = ledger
        self.store: Properties = properties if properties is not None else MemoryProperties()
        self.access = ProducerAccess(None, settings.max_producers_per_topic)
        enabled = settings.broker_deduplication_enabled if deduplication is None else deduplication
        self.settings = settings
        self.dedup = self._new_dedup() if enabled else None
        self._last_stored = -1
        self._started = False

    def _new_dedup(self) -> Deduplication:
        settings = self.settings
        return Deduplication(
            max_producers=settings.broker_deduplication_max_number_of_producers,
            inactivity_seconds=60
            * settings.broker_deduplication_producer_inactivity_timeout_minutes,
            entries_interval=settings.broker_deduplication_entries_interval,
        )

    def set_deduplication(self, policy: bool | None) -> None:
        """The namespace policy as the broker sees it now (None: the broker setting).

        Turned on: the state is rebuilt from the snapshot and the entries after it, as at
        start; turned off: the state and its snapshot are dropped, as Pulsar removes its
        dedup cursor, so a later enabling starts from what is stored then.
        """
        enabled = self.settings.broker_deduplication_enabled if policy is None else policy
        if enabled == (self.dedup is not None) or not self._started:
            return
        if enabled:
            self.dedup = self._new_dedup()
            recover(self.ledger, self.dedup, self.store.properties().get(DEDUP_KEY))
            self._last_stored = self.ledger.last_entry_id
            for producer in self.access.producers.values():
                self.dedup.connect(producer.name)
            log.info("%s: deduplication enabled", self.topic)
        else:
            self.dedup = None
            self.store.set_property(DEDUP_KEY, None)
            log.info("%s: deduplication disabled", self.topic)

    # Life cycle.

    def start(self) -> None:
        self._started = True
        stored = self.store.properties()
        epoch = stored.get(EPOCH_KEY)
        self.access.epoch = None if epoch is None else int(epoch)
        if self.dedup is not None:
            replayed = recover(self.ledger, self.dedup, stored.get(DEDUP_KEY))
            self._last_stored = self.ledger.last_entry_id
            if replayed:
                log.info("%s: deduplication replayed %d entries", self.topic, replayed)

    def stop(self) -> None:
        if self.dedup is not None:
            self._snapshot()

    def connections(self) -> list[Any]:
        every = [p.connection for p in (*self.access.producers.values(), *self.access.waiting)]
        return list({id(c): c for c in every if c is not None}.values())

    def clear(self) -> None:
        for producer in self.access.clear():
            if self.dedup is not None:
                self.dedup.disconnect(producer.name)

    # Producers.

    def add(self, message: Any) -> ProducerAdmitted:
        """AddProducer: admit or raise BrokerError; fence or refuse who it displaces."""
        producer = ProducerEntry(
            message.name,
            message.peer,
            message.connection,
            message.producer_id,
            message.access_mode,
            message.topic_epoch,
            datetime.datetime.now(datetime.UTC).isoformat(),
        )
        before = self.access.epoch
        admission = self.access.add(producer)
        for fenced in admission.fenced:
            log.info("%s: producer %r fenced by %r", self.topic, fenced.name, producer.name)
            self._disconnected(fenced)
            tell_quietly(fenced.connection, ProducerFenced(fenced.producer_id))
        for refused in admission.refused:
            self._disconnected(refused)
            tell_quietly(
                refused.connection,
                ProducerRefused(
                    refused.producer_id,
                    pb.ProducerFenced,
                    f"Producer {producer.name!r} took the topic with ExclusiveWithFencing",
                ),
            )
        self._save_epoch(before)
        last = -1 if self.dedup is None else self.dedup.connect(producer.name)
        return ProducerAdmitted(admission.ready, admission.epoch, last)

    def remove(self, name: str, connection: Any, producer_id: int) -> None:
        if connection is None:  # by name only (an older caller)
            found = self.access.find(name)
            if found is None:
                return
            key = found.key
        else:
            key = (id(connection), producer_id)
        before = self.access.epoch
        removed, promoted = self.access.remove(key)
        if removed is not None:
            self._disconnected(removed)
        for ready in promoted:
            last = -1 if self.dedup is None else self.dedup.last_sequence_id(ready.name)
            tell_quietly(
                ready.connection, ProducerReady(ready.producer_id, self.access.epoch, last)
            )
        self._save_epoch(before)

    def _disconnected(self, producer: ProducerEntry) -> None:
        if self.dedup is not None:
            self.dedup.disconnect(producer.name)
            self.dedup.purge_inactive()

    def _save_epoch(self, before: int | None) -> None:
        if self.access.epoch != before:
            self.store.set_property(EPOCH_KEY, self.access.epoch)

    # SENDs.

    def screen(
        self, connection: Any, producer_id: int, items: Sequence[AppendItem]
    ) -> tuple[dict[int, Any], Screened | None]:
        """The answers some of an Append's items get without storage, by index."""
        key = (id(connection), producer_id)
        if self.access.is_fenced(key):
            receipt = self.receipt
            ledger_id = self.ledger.ledger_id
            reason = "Producer was fenced: another producer took the topic exclusively"
            return {
                i: receipt(sequence_id, highest, ledger_id, -1, pb.ProducerFenced, reason)
                for i, (sequence_id, highest, _, _) in enumerate(items)
            }, None
        dedup = self.dedup
        if dedup is None:
            return _NOTHING, None
        producer = self.access.get(key)
        if producer is None:
            return _NOTHING, None
        name = producer.name
        run_highest = _ascending_run(items)
        # items[0][0]: the first SEND's sequence id (an AppendItem is a plain tuple).
        if run_highest is not None and dedup.check_run(name, items[0][0], run_highest):
            return _NOTHING, Screened(name, frozenset(), run_highest)
        receipt = self.receipt
        decided: dict[int, Any] = {}
        partial = set()
        for index, item in enumerate(items):
            sequence_id, highest_sent, entry, _ = item
            if entry is None:
                continue
            last_chunk = True
            data = entry[0]
            if may_be_chunked(data):
                with contextlib.suppress(ProtocolError):
                    last_chunk = is_last_chunk(parse_metadata(data))
            if not last_chunk:
                partial.add(index)
            highest = _highest(item)
            verdict = dedup.check(name, sequence_id, highest, last_chunk=last_chunk)
            if verdict is Verdict.DUPLICATE:
                decided[index] = receipt(sequence_id, highest_sent, NO_ID, NO_ID)
            elif verdict is Verdict.UNKNOWN:
                decided[index] = receipt(
                    highest,
                    highest,
                    self.ledger.ledger_id,
                    -1,
                    pb.PersistenceError,
                    "Cannot determine whether the message is a duplicate at this time",
                )
        return decided, Screened(name, frozenset(partial))

    def appended(
        self,
        screened: Screened,
        items: Sequence[AppendItem],
        decided: dict[int, Any],
        result: int | BaseException,
        last_entry: int,
    ) -> None:
        """An Append screened by `screen` completed (``result``: its first entry id)."""
        dedup = self.dedup
        if dedup is None:
            return
        name = screened.name
        if isinstance(result, BaseException):
            dedup.failed(name)
            return
        if screened.run_highest is not None:
            count = len(items)
            dedup.stored(name, screened.run_highest)
        else:
            count = 0
            for index, item in enumerate(items):
                if item[2] is None or index in decided:
                    continue
                count += 1
                if index not in screened.partial:
                    dedup.stored(name, _highest(item))
        if count:
            self._last_stored = max(self._last_stored, last_entry)
            if dedup.entries_stored(count):
                self._snapshot()

    def _snapshot(self) -> None:
        assert self.dedup is not None
        self.store.set_property(DEDUP_KEY, self.dedup.snapshot(self._last_stored))

    # Observability.

    def stats(self) -> dict[str, Any]:
        publishers = [
            {
                "producerName": p.name,
                "producerId": p.producer_id,
                "address": p.peer,
                "accessMode": mode_name(p.access_mode),
                "connectedSince": p.connected_since,
            }
            for p in self.access.producers.values()
        ]
        return {
            "publishers": publishers,
            "waitingPublishers": len(self.access.waiting),
            "deduplicationStatus": "Disabled" if self.dedup is None else "Enabled",
            "topicEpoch": self.access.epoch,
        }


def _ascending_run(items: Sequence[AppendItem]) -> int | None:
    """The highest sequence id of ``items`` when `Deduplication.check_run` can take them
    together: every one a whole message to store (no refusal, no chunk), each id past the
    highest of the one before. None otherwise."""
    last = -1
    for item in items:
        sequence_id, _, entry, _ = item
        if entry is None or sequence_id <= last or may_be_chunked(entry[0]):
            return None
        last = _highest(item)
    return last if last >= 0 else None


def _highest(item: AppendItem) -> int:
    """A SEND's highest sequence id: its ``highest_sequence_id`` when set above the first
    (the Java client's batches), else first + messages - 1 (the C++ client sends no
    ``highest_sequence_id`` and numbers a batch's messages one by one)."""
    sequence_id, highest, entry, _ = item
    if highest > sequence_id:
        return highest
    messages = 1 if entry is None else entry[2]
    return sequence_id + max(messages, 1) - 1


def check_consumer_limits(settings: Settings, existing: Any, subscriptions: Iterable[Any]) -> None:
    """maxConsumersPerSubscription / maxConsumersPerTopic, checked before a SUBSCRIBE joins.

    Raises BrokerError ConsumerBusy, as Pulsar's AbstractTopic.isConsumersExceededOnTopic
    and the subscription's isConsumersExceededOnSubscription.
    """
    per_subscription = settings.max_consumers_per_subscription
    per_topic = settings.max_consumers_per_topic
    if not per_subscription and not per_topic:
        return

    def attached(dispatcher: Any) -> int:
        try:
            count: int = dispatcher.ask(CloseConsumers(False), block=True, timeout=5)
        except Exception:  # a dead or stuck dispatcher has no consumers to count
            return 0
        return count

    if per_subscription and existing is not None and attached(existing) >= per_subscription:
        raise BrokerError(pb.ConsumerBusy, "Subscription reached max consumers limit")
    if per_topic and sum(attached(d) for d in subscriptions) >= per_topic:
        raise BrokerError(pb.ConsumerBusy, "Topic reached max consumers limit")
