"""The dispatcher: one actor per subscription.

It owns the subscription's delivery state: the cursor (acknowledgements), the read position,
the replay set (entries to deliver again), each consumer's pending entries, and the conflated
read loop. One pass of the loop (:meth:`DispatcherActor._read_more`):

1. take the read request (the gate re-arms, so any later request queues exactly one more pass);
2. stop if a read is already pending, or no consumer can take anything
   (``max(total permits, first available consumer's permits) <= 0``);
3. read the replay set first, else up to ``dispatcher_max_read_batch_size`` new entries from the
   topic; at the end of the ledger that read waits for the next append (a long poll);
4. on completion, hand the entries out (round-robin over the lowest priority level for Shared,
   by sticky-key hash for Key_Shared (see :mod:`brokerlet.actors.keyshared`), the active
   consumer for Exclusive/Failover), one event-loop message per consumer batch; entries nobody
   could take go to the replay set; then read again at once if anything went out.

Wake-ups: FLOW, a consumer added or removed, acks moving entries, redelivery, a consumer's
write completion, a writable channel, the retry timer and the long poll.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gevent

from brokerlet.actors._conflate import ConflatedTell
from brokerlet.actors._runtime import GeventActor
from brokerlet.actors.consumer import ConnectionHandle, Consumer, PermitTotal
from brokerlet.actors.errors import BrokerError
from brokerlet.actors.keyshared import KeySharedMeta, KeySharedRules
from brokerlet.actors.ratelimit import DispatchRateLimiter, limiters_allowance, limiters_wait
from brokerlet.actors.replay import ReplaySet
from brokerlet.actors.stats import Cancellable, Rate
from brokerlet.actors.supervision import GetCursorState, dispatcher_failed, tell_quietly
from brokerlet.config import Settings
from brokerlet.storage.cursor import Cursor
from brokerlet.storage.disk import CursorStore
from brokerlet.storage.expiry import ExpiryCounter
from brokerlet.storage.ledger import Entry
from brokerlet.transport.protocol import pb

__all__ = [
    "Ack",
    "AddConsumer",
    "DispatcherActor",
    "EntriesRead",
    "ReadMore",
    "Redeliver",
    "RemoveConsumer",
    "SendMessages",
]

log = logging.getLogger(__name__)

SHARED = pb.CommandSubscribe.Shared
EXCLUSIVE = pb.CommandSubscribe.Exclusive
FAILOVER = pb.CommandSubscribe.Failover
KEY_SHARED = pb.CommandSubscribe.Key_Shared
SUB_TYPE_NAMES: dict[int, str] = {
    SHARED: "Shared",
    EXCLUSIVE: "Exclusive",
    FAILOVER: "Failover",
    KEY_SHARED: "Key_Shared",
}


# Messages handled by the dispatcher.


class ReadMore:
    """The conflated read request (a singleton per dispatcher, see :class:`ConflatedTell`)."""


@dataclass(frozen=True, slots=True)
class AddConsumer:
    consumer: Consumer


@dataclass(frozen=True, slots=True)
class RemoveConsumer:
    consumer: Consumer
    unsubscribe: bool = False


@dataclass(frozen=True, slots=True)
class EntriesRead:
    read_id: int
    entries: list[Entry] | BaseException
    replay: bool


@dataclass(frozen=True, slots=True)
class Ack:
    consumer: Consumer
    positions: Sequence[tuple[int, int]]  # (ledger id, entry id)
    cumulative: bool


@dataclass(frozen=True, slots=True)
class Redeliver:
    consumer: Consumer
    positions: Sequence[tuple[int, int]] | None  # None: every entry pending on the consumer


@dataclass(frozen=True, slots=True)
class Seek:
    """Reset the subscription so ``entry_id`` is the next entry delivered; asked."""

    entry_id: int
    requester: ConnectionHandle


@dataclass(frozen=True, slots=True)
class CloseConsumers:
    """Asked: how many consumers are attached; with ``close``, also close each of them the
    broker's way (CLOSE_CONSUMER; the client reconnects). Used before a topic is deleted."""

    close: bool


@dataclass(frozen=True, slots=True)
class ConsumerClosedByBroker:
    """Told to a connection actor: the broker closed this consumer (the client reconnects)."""

    consumer: Consumer


@dataclass(frozen=True, slots=True)
class GetStats:
    pass


class GetMarkDelete:
    """Asked: the subscription's mark-delete entry id."""


@dataclass(frozen=True, slots=True)
class ExpireUpTo:
    """Message TTL or expireMessages (storage/expiry.py): acknowledge every entry up to
    ``entry_id``, counting those not acknowledged yet as expired (unless ``expiry`` is
    False: a backlog-quota eviction)."""

    entry_id: int
    expiry: bool = True


class BatchWritten:
    """A consumer batch's write completed (only sent with COMPLETION_BARRIER)."""


class PersistCursor:
    """Time to write the subscription's acknowledgements to its cursor store."""


class HashesUnblocked:
    """Key_Shared: draining hashes were released; the unblocking interval has passed."""


# Message sent to a connection's event loop: one per consumer batch.


@dataclass(frozen=True, slots=True)
class SendMessages:
    consumer: Consumer
    entries: list[Entry]
    redelivery_counts: list[int]
    on_complete: Callable[[], object]


class Dispatcher:
    """Dispatch for one subscription (Shared, Key_Shared, Exclusive or Failover), runtime-neutral.

    Combined with an actor runtime below: :class:`DispatcherActor` on gevent for the broker;
    tests also run it on Pykka's ThreadingActor to prove the permit accounting does not depend
    on cooperative scheduling. Subclasses provide :meth:`call_later`.
    """

    actor_ref: Any

    def __init__(
        self,
        *,
        topic: Any,  # pykka.ActorRef of the TopicActor
        topic_name: str,
        ledger_id: int,
        name: str,
        sub_type: int,
        durable: bool,
        cursor: Cursor,
        read_position: int,
        settings: Settings,
        rate_limiters: Sequence[DispatchRateLimiter] = (),
        cursor_store: CursorStore | None = None,
        last_entry_id: Callable[[], int] | None = None,
    ) -> None:
        super().__init__()
        self.last_entry_id = last_entry_id  # the topic's last confirmed entry, to bound acks
        self.cursor_store = cursor_store
        self._cursor_dirty = cursor_store is not None  # a new durable subscription is saved
        self._persist_timer: Cancellable | None = None
        self.topic = topic
        self.topic_name = topic_name
        self.ledger_id = ledger_id
        self.name = name
        self.sub_type = sub_type
        self.durable = durable
        self.cursor = cursor
        self.read_position = read_position
        self.settings = settings

        self.consumers: list[Consumer] = []
        self.active: Consumer | None = None  # Exclusive/Failover only
        self.total_permits = PermitTotal()
        self.replay = ReplaySet()
        self.key_shared: KeySharedRules | None = None
        self.redelivery_counts: dict[int, int] = {}
        self.pending_owner: dict[int, Consumer] = {}
        self.unacked = 0  # the subscription's unacked messages, all consumers together
        self.blocked_on_unacked = False
        self.msg_out = 0
        self.bytes_out = 0
        self.reads_issued = 0
        self.read_passes = 0  # wake-ups of the read loop, productive or not
        self._rate_out = Rate()
        self._throughput_out = Rate()

        own = DispatchRateLimiter(
            "subscription",
            settings.dispatch_throttling_rate_per_subscription_in_msg,
            settings.dispatch_throttling_rate_per_subscription_in_byte,
        )
        self.rate_limiters = [lim for lim in (*rate_limiters, own) if lim.enabled]

        self._read_id = 0
        self.pending_read: str | None = None  # None, "normal" or "replay"
        self._next_index = 0  # round-robin position
        self._backoff_ms = 0.0
        self._failure_backoff_ms = 0.0
        self.read_batch_size = settings.dispatcher_max_read_batch_size
        self._retry: Cancellable | None = None
        self._unblock_timer: Cancellable | None = None
        self._writes_in_flight = 0  # only counted with COMPLETION_BARRIER
        self._min_replayed = -1  # the replay set's head when the replay read was issued
        self._gate: ConflatedTell | None = None
        self.expiry = ExpiryCounter()
        self._handlers: dict[type, Callable[[Any], Any]] = {
            ExpireUpTo: self._expire_up_to,
            ReadMore: self._read_more,
            EntriesRead: self._entries_read,
            Ack: self._ack,
            Redeliver: self._redeliver,
            AddConsumer: self._add_consumer,
            RemoveConsumer: self._remove_consumer,
            Seek: self._seek,
            CloseConsumers: self._close_consumers,
            HashesUnblocked: self._hashes_unblocked,
            BatchWritten: self._batch_written,
            PersistCursor: lambda _: self._persist_cursor(),
            GetStats: lambda _: self.stats(),
            GetMarkDelete: lambda _: self.cursor.mark_delete,
            GetCursorState: lambda _: (self.cursor.mark_delete, self.cursor.acked_ids()),
        }

    # Actor plumbing.

    def on_start(self) -> None:
        self._gate = ConflatedTell(self.actor_ref, ReadMore())
        if self._cursor_dirty:
            self._persist_cursor()

    def on_stop(self) -> None:
        if self._cursor_dirty:
            self._persist_cursor()
        for consumer in self.consumers:  # stopped under them (their topic failed): reconnect
            tell_quietly(consumer.connection.actor, ConsumerClosedByBroker(consumer))
        for timer in (self._retry, self._unblock_timer, self._persist_timer):
            if timer is not None:
                timer.cancel()

    def call_later(self, seconds: float, func: Callable[[], object]) -> Cancellable:
        """Run ``func`` (a thread-safe request) after ``seconds``; provided by the runtime."""
        raise NotImplementedError

    def on_receive(self, message: Any) -> Any:
        if message.__class__ is ReadMore:
            return self._read_more(message)
        return self._handlers[type(message)](message)

    @property
    def gate(self) -> ConflatedTell:
        assert self._gate is not None
        return self._gate

    # Membership.

    def _add_consumer(self, message: AddConsumer) -> None:
        consumer = message.consumer
        meta = consumer.key_shared or KeySharedMeta()
        if self.consumers:
            if consumer.sub_type != self.sub_type:
                raise BrokerError.consumer_busy(
                    f"Subscription {self.name!r} is of a different type "
                    f"({SUB_TYPE_NAMES.get(self.sub_type, self.sub_type)})"
                )
            if self.sub_type == EXCLUSIVE:
                raise BrokerError.consumer_busy(
                    f"Exclusive consumer is already connected to subscription {self.name!r}"
                )
            if self.key_shared is not None:
                self.key_shared.check_compatible(meta)
        else:
            self.sub_type = consumer.sub_type
            self.key_shared = None
            if consumer.sub_type == KEY_SHARED:
                self.key_shared = KeySharedRules(meta, self.settings, self._schedule_unblock)
        if self.key_shared is not None:
            try:
                self.key_shared.add_consumer(consumer, meta)
            except BrokerError:
                if not self.consumers:
                    self.key_shared = None
                raise
        consumer.attach(self.total_permits, self.gate)
        self.consumers.append(consumer)
        self.consumers.sort(key=lambda c: c.priority)  # stable: joining order within a level
        if self.sub_type in (EXCLUSIVE, FAILOVER):
            self._pick_active()
        log.debug("%s: added %r", self, consumer)
        self.gate.request()

    def _remove_consumer(self, message: RemoveConsumer) -> None:
        consumer = message.consumer
        if message.unsubscribe and any(c is not consumer for c in self.consumers):
            raise BrokerError(
                pb.MetadataError,
                f"Subscription {self.name!r} has other connected consumers",
            )
        if not consumer.detach():
            return  # removed already: its pending entries were released then
        self.consumers.remove(consumer)
        self._release_pending(consumer, closing=True)
        if self.key_shared is not None:
            self.key_shared.remove_consumer(consumer)
        log.debug("%s: removed %r", self, consumer)
        if not self.consumers:
            self._rewind()
            if not self.durable or message.unsubscribe:
                if message.unsubscribe:
                    self._cursor_dirty = False  # deleted, not saved
                self.topic.tell(SubscriptionClosed(self.name, self.actor_ref, deleted=True))
            return
        if self.sub_type in (EXCLUSIVE, FAILOVER):
            self._pick_active()
        self._wake_for_replay()

    def _seek(self, message: Seek) -> list[Consumer]:
        """Disconnect every consumer, forget in-flight state, and restart at ``entry_id``.

        As in Pulsar, the consumers are closed first (the client resubscribes with a full
        receiver queue), so no permits stay charged for messages the client dropped. Returns
        the requester's own consumers: it closes those itself, before answering the seek.
        """
        closed = list(self.consumers)
        for consumer in closed:
            consumer.detach()
            consumer.pending.clear()
            consumer.unacked = 0
        self.consumers.clear()
        self.active = None
        self.pending_owner.clear()
        self.unacked = 0
        self.blocked_on_unacked = False
        self.redelivery_counts.clear()
        self.cursor.reset(message.entry_id - 1)
        self._rewind()  # reads start again at entry_id
        self._cursor_changed()
        log.info("%s: reset to entry %d", self, message.entry_id)
        for consumer in closed:
            if consumer.connection is not message.requester and consumer.connection.actor:
                consumer.connection.actor.tell(ConsumerClosedByBroker(consumer))
        return [c for c in closed if c.connection is message.requester]

    def _close_consumers(self, message: CloseConsumers) -> int:
        count = len(self.consumers)
        if message.close:
            for consumer in self.consumers:
                consumer.detach()
                if consumer.connection.actor:
                    consumer.connection.actor.tell(ConsumerClosedByBroker(consumer))
        return count

    def _pick_active(self) -> None:
        # Failover on a non-partitioned topic: the lowest priority level wins, then the
        # lowest consumer name, so every broker picks the same consumer.
        previous = self.active
        self.active = min(self.consumers, key=lambda c: (c.priority, c.name), default=None)
        if previous is not None and previous is not self.active and previous in self.consumers:
            # The old active consumer's unacked entries move to the new one.
            self._release_pending(previous, count_redelivery=False)
            self._wake_for_replay()

    def _release_pending(
        self, consumer: Consumer, *, count_redelivery: bool = True, closing: bool = False
    ) -> None:
        self._unacked_changed(-consumer.unacked)
        for entry_id in consumer.pending:
            self._requeue(consumer, entry_id, closing=closing, count_redelivery=count_redelivery)
        consumer.pending.clear()
        consumer.unacked = 0
        consumer.unblock()

    def _requeue(
        self, consumer: Consumer, entry_id: int, *, closing: bool, count_redelivery: bool
    ) -> None:
        """Put ``consumer``'s pending ``entry_id`` back in the replay set (the caller settles
        the consumer's unacked count)."""
        del self.pending_owner[entry_id]
        key_shared = self.key_shared
        self.replay.add(
            entry_id, key_shared.released(consumer, entry_id, closing=closing) if key_shared else 0
        )
        if count_redelivery:
            self.redelivery_counts[entry_id] = self.redelivery_counts.get(entry_id, 0) + 1

    def _rewind(self) -> None:
        """No consumer is left: forget the in-flight state and re-read from the mark-delete."""
        self._cancel_pending_read()
        self.replay.clear()
        self.key_shared = None
        self.read_position = self.cursor.mark_delete + 1

    # The read loop.

    def _first_available(self) -> Consumer | None:
        for consumer in self._candidates():
            if _available(consumer):
                return consumer
        return None

    def _candidates(self) -> list[Consumer]:
        if self.sub_type in (EXCLUSIVE, FAILOVER):
            return [self.active] if self.active is not None else []
        return self.consumers

    def _read_more(self, _message: object) -> None:
        self.gate.taken()
        self.read_passes += 1
        if not self.consumers or (COMPLETION_BARRIER and self._writes_in_flight):
            return
        if self.pending_read is not None:
            if not (self.pending_read == "normal" and self._replay_ready()):
                return
            # Key_Shared looked ahead past held-back entries; now one of them can go out,
            # so the read waiting for new entries must not hold it (pain point 12).
            self._cancel_pending_read()
        first = self._first_available()
        if first is None:
            return  # a FLOW, a writable event, an ack or a completion will wake us
        permits = max(self.total_permits.value, first.permits)
        if permits <= 0:
            return
        batch = min(permits, self.read_batch_size)
        max_bytes = self.settings.dispatcher_max_read_size_bytes
        if self.rate_limiters:
            wait = limiters_wait(self.rate_limiters)
            if wait > 0:
                self._retry_later(wait * 1000)  # a writable event meanwhile dispatches nothing
                return
            batch, max_bytes = limiters_allowance(self.rate_limiters, batch, max_bytes)
        if self.key_shared is not None:
            self._read_more_key_shared(self.key_shared, batch, max_bytes)
            return
        ids = self.replay.head(batch)
        if ids:
            self._issue_read("replay", ReadIds(self.name, self._read_id + 1, ids, self.actor_ref))
            return
        if self.blocked_on_unacked:
            return  # acks below half the limit wake us
        self._issue_read(
            "normal",
            ReadEntries(
                self.name, self._read_id + 1, self.read_position, batch, max_bytes, self.actor_ref
            ),
        )

    def _read_more_key_shared(self, rules: KeySharedRules, batch: int, max_bytes: int) -> None:
        budgets = self._budgets()
        if self.replay:
            ids = rules.select_replay(self.replay, dict(budgets), batch)
            if ids:
                self._min_replayed = self.replay.first()
                self._issue_read(
                    "replay", ReadIds(self.name, self._read_id + 1, ids, self.actor_ref)
                )
                return
            # Nothing in the replay set can go out now: look ahead with a normal read.
        if self.blocked_on_unacked:
            return
        limit = rules.look_ahead_limit(len(self.consumers))
        if len(self.replay) >= limit or not any(b > 0 for b in budgets.values()):
            self._retry_with_backoff()
            return
        count = min(batch, max(limit - len(self.replay), 1))
        self._issue_read(
            "normal",
            ReadEntries(
                self.name, self._read_id + 1, self.read_position, count, max_bytes, self.actor_ref
            ),
        )

    def _replay_ready(self) -> bool:
        """Key_Shared: some entry of the replay set can go out now."""
        rules = self.key_shared
        if rules is None or not self.replay:
            return False
        return bool(rules.select_replay(self.replay, self._budgets(), 1))

    def _budgets(self) -> dict[Consumer, int]:
        """Effective permits of every consumer that can take entries now."""
        return {c: self._budget(c) for c in self.consumers if _available(c)}

    def _budget(self, consumer: Consumer) -> int:
        """Messages ``consumer`` may get now: its permits, capped by its unacked limit."""
        limit = self.settings.max_unacked_messages_per_consumer
        if limit > 0 and self.durable:
            return min(consumer.permits, limit - consumer.unacked)
        return consumer.permits

    def _issue_read(self, kind: str, request: ReadEntries | ReadIds) -> None:
        self._read_id = request.read_id
        self.pending_read = kind
        self.reads_issued += 1
        self.topic.tell(request)

    def _cancel_pending_read(self) -> None:
        if self.pending_read == "normal":
            self.topic.tell(CancelRead(self.name, self._read_id))
        self.pending_read = None
        self._read_id += 1  # a completion already on its way is stale now

    def _wake_for_replay(self) -> None:
        """Entries joined the replay set: a long poll waiting for new entries must not hold them."""
        if self.replay and self.pending_read == "normal":
            self._cancel_pending_read()
        self.gate.request()

    def _entries_read(self, message: EntriesRead) -> None:
        if message.read_id != self._read_id:
            return  # cancelled
        self.pending_read = None
        entries = message.entries
        if isinstance(entries, BaseException):
            self._read_failed(entries)
            return
        self._read_succeeded()
        if message.replay:
            if (
                self.key_shared is not None
                and self.replay
                and self.replay.first() < (self._min_replayed)
            ):
                # An older entry was redelivered meanwhile; sending these could overtake it.
                self.gate.request()
                return
            entries = [e for e in entries if e.entry_id in self.replay]
        else:
            if entries:
                self.read_position = entries[-1].entry_id + 1
            is_acked = self.cursor.is_acked
            entries = [e for e in entries if not is_acked(e.entry_id)]
        if not entries:
            self.gate.request()
            return
        if self._send(entries, replay=message.replay):
            self._backoff_ms = 0
            self.gate.request()
        elif any(c.writable for c in self._candidates()):
            self._retry_with_backoff()
        # else: nothing writable; the writable event requests the next read.

    def _read_failed(self, error: BaseException) -> None:
        """As Pulsar: read one entry at a time, after an exponentially growing delay."""
        settings = self.settings
        self.read_batch_size = settings.dispatcher_min_read_batch_size
        self._failure_backoff_ms = min(
            settings.dispatcher_read_failure_backoff_max_time_ms,
            max(
                settings.dispatcher_read_failure_backoff_initial_time_ms,
                self._failure_backoff_ms * 2,
            ),
        )
        log.warning(
            "%s: read failed, retrying in %.0f ms: %s", self, self._failure_backoff_ms, error
        )
        self._retry_later(self._failure_backoff_ms)

    def _read_succeeded(self) -> None:
        """The read size doubles back towards the maximum; the failure backoff halves."""
        maximum = self.settings.dispatcher_max_read_batch_size
        if self.read_batch_size < maximum:
            self.read_batch_size = min(maximum, self.read_batch_size * 2)
        self._failure_backoff_ms /= 2

    def _retry_with_backoff(self) -> None:
        initial = self.settings.dispatcher_retry_backoff_initial_time_ms
        ceiling = self.settings.dispatcher_retry_backoff_max_time_ms
        self._backoff_ms = min(ceiling, max(initial, self._backoff_ms * 2))
        self._retry_later(self._backoff_ms)

    def _retry_later(self, delay_ms: float) -> None:
        """Request a read after ``delay_ms``. One timer at a time, and it only ever makes a
        conflated request, so a timer can never start a second pending read."""
        if self._retry is not None and not self._retry.done:
            return
        if delay_ms <= 0:
            self.gate.request()
            return
        self._retry = self.call_later(delay_ms / 1000.0, self.gate.request)

    # Handing entries out.

    def _send(self, entries: list[Entry], *, replay: bool) -> bool:
        """Assign ``entries`` in order to consumers; the rest go to replay. True if any went out."""
        if self.key_shared is not None:
            return self._send_key_shared(self.key_shared, entries, replay=replay)
        index = 0
        count = len(entries)
        sent_any = False
        single = self.sub_type in (EXCLUSIVE, FAILOVER)
        chunk = count if single else self.settings.dispatcher_max_round_robin_batch_size
        while index < count:
            consumer = self._next_consumer()
            if consumer is None:
                break
            budget = self._budget(consumer)
            batch: list[Entry] = []
            messages = 0
            while index < count and len(batch) < chunk and (messages < budget or not batch):
                entry = entries[index]
                batch.append(entry)
                messages += entry.num_messages
                index += 1
            self._deliver(consumer, batch, messages)
            sent_any = True
        if index < count:
            for entry in entries[index:]:
                self.replay.add(entry.entry_id)
        if replay:
            for entry in entries[:index]:
                self.replay.discard(entry.entry_id)
        return sent_any

    def _send_key_shared(
        self, rules: KeySharedRules, entries: list[Entry], *, replay: bool
    ) -> bool:
        if replay:
            rules.remember(entries, self.replay)
        batches, held = rules.assign(entries, self._budgets(), self.replay, from_replay=replay)
        for consumer, batch in batches.items():
            self._deliver(consumer, batch, sum(e.num_messages for e in batch))
            if replay:
                for entry in batch:
                    self.replay.discard(entry.entry_id)
        for entry, key_hash in held:
            self.replay.add(entry.entry_id, key_hash)
        rules.forget_read(entry for entry, _ in held)
        return bool(batches)

    def _next_consumer(self) -> Consumer | None:
        if self.sub_type in (EXCLUSIVE, FAILOVER):
            active = self.active
            if active is not None and _available(active):
                return active
            return None
        # Shared: round-robin over the available consumers of the lowest priority level
        # that has any (Pulsar's priorityLevel; usually every consumer is at level 0).
        consumers = self.consumers
        size = len(consumers)
        level = None
        if consumers and consumers[0].priority != consumers[-1].priority:
            level = min((c.priority for c in consumers if _available(c)), default=None)
            if level is None:
                return None
        start = self._next_index
        for step in range(size):
            index = (start + step) % size
            consumer = consumers[index]
            if (level is None or consumer.priority == level) and _available(consumer):
                self._next_index = (index + 1) % size
                return consumer
        return None

    def _deliver(self, consumer: Consumer, batch: list[Entry], messages: int) -> None:
        counts = self.redelivery_counts
        owner = self.pending_owner
        pending = consumer.pending
        redelivery = []
        size = 0
        key_shared = self.key_shared
        for entry in batch:
            entry_id = entry.entry_id
            if key_shared is not None:
                key_shared.delivered(consumer, entry)
            owner[entry_id] = consumer
            pending[entry_id] = entry.num_messages
            redelivery.append(counts.get(entry_id, 0))
            size += len(entry.data)
        consumer.unacked += messages
        consumer.msg_out += messages
        consumer.bytes_out += size
        consumer.debit(messages)
        limit = self.settings.max_unacked_messages_per_consumer
        if limit > 0 and self.durable and consumer.unacked >= limit:
            consumer.block()
        self._unacked_changed(messages)
        self.msg_out += messages
        self.bytes_out += size
        for limiter in self.rate_limiters:
            limiter.charge(messages, size)
        on_complete: Callable[[], object] = self.gate.request
        if COMPLETION_BARRIER:
            self._writes_in_flight += 1
            tell = self.actor_ref.tell
            on_complete = lambda: tell(BatchWritten())  # noqa: E731
        consumer.connection.event_loop.tell(SendMessages(consumer, batch, redelivery, on_complete))

    # Acknowledgements and redelivery.

    def _ack(self, message: Ack) -> None:
        if self.key_shared is not None:
            with self.key_shared.draining.batch():  # one unblock notification per ACK
                self._apply_ack(message)
        else:
            self._apply_ack(message)

    def _apply_ack(self, message: Ack) -> None:
        cursor = self.cursor
        moved = False
        entry_ids = [e for ledger, e in message.positions if ledger == self.ledger_id]
        if self.last_entry_id is not None:
            # As Pulsar's cursor does: an entry not written yet cannot be acknowledged.
            last = self.last_entry_id()
            if any(e > last for e in entry_ids):
                log.debug("%s: ignored acks beyond the last entry %d", self, last)
                entry_ids = [e for e in entry_ids if e <= last]
        if not entry_ids:
            return
        if message.cumulative:
            if self.sub_type not in (EXCLUSIVE, FAILOVER):
                return  # Pulsar ignores cumulative acks on Shared subscriptions
            upto = max(entry_ids)
            for entry_id in [e for e in self.pending_owner if e <= upto]:
                self._forget(entry_id)
            for entry_id in self.replay.up_to(upto):
                self._forget(entry_id)
            moved = cursor.ack_cumulative(upto)
        else:
            for entry_id in entry_ids:
                self._forget(entry_id)
                moved = cursor.ack(entry_id) or moved
        if moved:
            self.topic.tell(MarkDeleteMoved(self.name, cursor.mark_delete))
        self._cursor_changed()

    def _expire_up_to(self, message: ExpireUpTo) -> int:
        """PersistentMessageExpiryMonitor's mark-delete move; answers how many expired."""
        cursor = self.cursor
        upto = message.entry_id
        if self.last_entry_id is not None:
            upto = min(upto, self.last_entry_id())
        if upto <= cursor.mark_delete:
            return 0
        expired = upto - cursor.mark_delete - cursor.acked_up_to(upto)
        for entry_id in [e for e in self.pending_owner if e <= upto]:
            self._forget(entry_id)
        for entry_id in self.replay.up_to(upto):
            self._forget(entry_id)
        cursor.ack_cumulative(upto)
        self.read_position = max(self.read_position, upto + 1)
        if message.expiry:
            self.expiry.record(expired)
        self.topic.tell(MarkDeleteMoved(self.name, cursor.mark_delete))
        self._cursor_changed()
        return expired

    def _cursor_changed(self) -> None:
        """Save the cursor soon: at most once per ``cursor_flush_ms``, whatever the ack rate."""
        if self.cursor_store is None:
            return
        self._cursor_dirty = True
        if self._persist_timer is None or self._persist_timer.done:
            tell = self.actor_ref.tell
            self._persist_timer = self.call_later(
                self.settings.cursor_flush_ms / 1000, lambda: tell(PersistCursor())
            )

    def _persist_cursor(self) -> None:
        if self.cursor_store is not None and self._cursor_dirty:
            self._cursor_dirty = False
            self.cursor_store.save(self.name, self.cursor.mark_delete, self.cursor.acked_ids())

    def _forget(self, entry_id: int) -> None:
        owner = self.pending_owner.pop(entry_id, None)
        if owner is not None:
            if self.key_shared is not None:
                self.key_shared.released(owner, entry_id)
            self._consumer_acked(owner, owner.pending.pop(entry_id, 0))
        self.replay.discard(entry_id)
        self.redelivery_counts.pop(entry_id, None)

    def _redeliver(self, message: Redeliver) -> None:
        consumer = message.consumer
        if message.positions is None:
            ids = list(consumer.pending)
        else:
            ids = [e for ledger, e in message.positions if ledger == self.ledger_id]
        for entry_id in ids:
            if self.pending_owner.get(entry_id) is consumer:
                self._consumer_acked(consumer, consumer.pending.pop(entry_id))
                self._requeue(consumer, entry_id, closing=False, count_redelivery=True)
        self._wake_for_replay()

    def _batch_written(self, _message: object) -> None:
        self._writes_in_flight -= 1
        if not self._writes_in_flight:
            self.gate.request()

    def _schedule_unblock(self) -> None:
        """A draining hash that blocked someone was released: read again soon (merged)."""
        interval = self.settings.key_shared_unblocking_interval_ms
        if interval <= 0:
            self._hashes_unblocked(None)
        elif self._unblock_timer is None or self._unblock_timer.done:
            tell = self.actor_ref.tell
            self._unblock_timer = self.call_later(interval / 1000, lambda: tell(HashesUnblocked()))

    def _hashes_unblocked(self, _message: object) -> None:
        self._wake_for_replay()

    def _consumer_acked(self, consumer: Consumer, messages: int) -> None:
        """``messages`` of ``consumer`` left its unacked set (acked or sent back to replay)."""
        consumer.unacked -= messages
        self._unacked_changed(-messages)
        limit = self.settings.max_unacked_messages_per_consumer
        if consumer.blocked and consumer.unacked <= limit // 2:
            consumer.unblock()

    def _unacked_changed(self, delta: int) -> None:
        self.unacked += delta
        limit = self.settings.max_unacked_messages_per_subscription
        if limit <= 0 or not self.durable:
            return
        if not self.blocked_on_unacked and self.unacked >= limit:
            self.blocked_on_unacked = True
        elif self.blocked_on_unacked and self.unacked <= limit // 2:
            self.blocked_on_unacked = False
            self.gate.request()

    # Observability.

    def stats(self) -> dict[str, Any]:
        """This subscription's part of the topic stats, shaped like Pulsar's."""
        consumers = []
        for c in self.consumers:
            channel = c.connection.channel.statistics()
            consumers.append(
                {
                    "consumerName": c.name,
                    "consumerId": c.consumer_id,
                    "address": c.connection.peer,
                    "priorityLevel": c.priority,
                    "availablePermits": c.permits,
                    "unackedMessages": c.unacked,
                    "blockedConsumerOnUnackedMsgs": c.blocked,
                    "parkedPermits": c.parked_permits,
                    "msgOutCounter": c.msg_out,
                    "bytesOutCounter": c.bytes_out,
                    "msgRateOut": c.rate_out.sample(c.msg_out),
                    "msgThroughputOut": c.throughput_out.sample(c.bytes_out),
                    "isActive": c is self.active if self.sub_type != SHARED else True,
                    "writable": channel.writable,
                    "pendingOutboundBytes": channel.pending_bytes,
                    "writabilityChanges": channel.writability_changes,
                    **(self.key_shared.consumer_stats(c) if self.key_shared else {}),
                }
            )
        return {
            "type": SUB_TYPE_NAMES.get(self.sub_type, str(self.sub_type)),
            "isDurable": self.durable,
            "msgOutCounter": self.msg_out,
            "bytesOutCounter": self.bytes_out,
            "msgRateOut": self._rate_out.sample(self.msg_out),
            "msgThroughputOut": self._throughput_out.sample(self.bytes_out),
            "markDeletePosition": f"{self.ledger_id}:{self.cursor.mark_delete}",
            "readPosition": f"{self.ledger_id}:{self.read_position}",
            "individuallyAcked": self.cursor.individually_acked,
            "msgRedeliverQueue": len(self.replay),
            **self.expiry.stats(),
            "totalAvailablePermits": self.total_permits.value,
            "unackedMessages": self.unacked,
            "blockedSubscriptionOnUnackedMsgs": self.blocked_on_unacked,
            "readsIssued": self.reads_issued,
            "readPasses": self.read_passes,
            "readBatchSize": self.read_batch_size,
            "consumers": consumers,
            **(self.key_shared.stats() if self.key_shared else {}),
        }

    def __str__(self) -> str:
        return f"{self.topic_name} / {self.name}"


COMPLETION_BARRIER = False
"""Wait for every consumer batch's write to complete before the next read, as Key_Shared did
before Pulsar #26635. Only tests turn this on, to show a slow socket stalling everyone."""

WRITABILITY_GATING = True
"""Skip consumers whose connection is over its high watermark. Only tests and the backpressure
diagnostic turn this off, to show what happens without it."""


def _available(consumer: Consumer) -> bool:
    """Can take entries now: permits left, not blocked on unacked messages, socket writable."""
    return (
        consumer.permits > 0
        and not consumer.blocked
        and (consumer.writable or not WRITABILITY_GATING)
    )


class DispatcherActor(Dispatcher, GeventActor):
    """The broker's dispatcher: :class:`Dispatcher` on a gevent actor."""

    def call_later(self, seconds: float, func: Callable[[], object]) -> Cancellable:
        return GreenletTimer(gevent.spawn_later(seconds, func))

    def on_failure(self, exc_type: object, exc: object, _tb: object) -> None:
        dispatcher_failed(self, ConsumerClosedByBroker)


class GreenletTimer:
    """A ``call_later`` handle on gevent."""

    __slots__ = ("_greenlet",)

    def __init__(self, greenlet: gevent.Greenlet) -> None:
        self._greenlet = greenlet

    @property
    def done(self) -> bool:
        return bool(self._greenlet.dead)

    def cancel(self) -> None:
        self._greenlet.kill(block=False)


# Messages sent to the topic (defined here, where they are composed; the topic imports them).


@dataclass(frozen=True, slots=True)
class ReadEntries:
    subscription: str
    read_id: int
    start: int
    max_entries: int
    max_bytes: int
    reply_to: Any


@dataclass(frozen=True, slots=True)
class ReadIds:
    subscription: str
    read_id: int
    entry_ids: list[int]
    reply_to: Any


@dataclass(frozen=True, slots=True)
class CancelRead:
    subscription: str
    read_id: int


@dataclass(frozen=True, slots=True)
class MarkDeleteMoved:
    subscription: str
    mark_delete: int


@dataclass(frozen=True, slots=True)
class SubscriptionClosed:
    subscription: str
    dispatcher: Any
    deleted: bool = False  # unsubscribed (or non-durable): forget its stored cursor too
