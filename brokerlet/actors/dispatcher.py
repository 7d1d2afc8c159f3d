"""The dispatcher: one actor per subscription, the shell around :mod:`brokerlet.dispatch`.

It owns the conflated read loop and carries out what the subscription type's strategy
decides. One pass of the loop (:meth:`Dispatcher._read_more`):

1. take the read request (the gate re-arms, so any later request queues exactly one more pass);
2. stop if a read is already pending, or no consumer can take anything
   (``max(total permits, first available consumer's permits) <= 0``);
3. cap the read by the rate limits, then ask the strategy what to read: the replay set first,
   else up to ``dispatcher_max_read_batch_size`` new entries from the topic; at the end of the
   ledger that read waits for the next append (a long poll);
4. on completion, run the entries through the delivery filters and hand them to the strategy,
   which selects a consumer for each; every consumer batch is one event-loop message; entries
   nobody could take go to the replay set.

The next pass is requested by whatever makes delivery possible again, one trigger per path:
a consumer batch's write completion, FLOW, a consumer added or removed, acks moving entries
or releasing a limit, redelivery, a writable channel, the retry timer and the long poll.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import gevent
import pykka

from brokerlet.actors._conflate import ConflatedTell
from brokerlet.actors._runtime import GeventActor, GreenletTimer
from brokerlet.actors.messages import (
    Ack,
    AddConsumer,
    BatchWritten,
    CancelRead,
    CloseConsumers,
    ConsumerClosedByBroker,
    EntriesRead,
    ExpireUpTo,
    GetCursorState,
    GetMarkDelete,
    GetStats,
    Handlers,
    MarkDeleteMoved,
    PersistCursor,
    ReadEntries,
    ReadIds,
    ReadMore,
    Redeliver,
    RemoveConsumer,
    ReplayReady,
    Seek,
    SendMessageBatches,
    SendMessages,
    SubscriptionClosed,
    UnexpectedMessage,
    WriteAfterMessages,
    WriteCompletion,
)
from brokerlet.actors.supervision import QuietRef, dispatcher_failed, tell_quietly
from brokerlet.config import Settings
from brokerlet.dispatch.batch_acks import BatchAckFilter
from brokerlet.dispatch.consumer import ConnectionHandle, Consumer
from brokerlet.dispatch.cursor_saver import CursorSaver
from brokerlet.dispatch.delayed import DelayedDelivery
from brokerlet.dispatch.filters import DeliveryFilter, SkipSettled
from brokerlet.dispatch.key_shared import KeySharedRules, KeySharedStrategy
from brokerlet.dispatch.options import DEFAULT_OPTIONS, DispatchOptions
from brokerlet.dispatch.ratelimit import DispatchRateLimiter, limiters_allowance, limiters_wait
from brokerlet.dispatch.read_backoff import ReadBackoff
from brokerlet.dispatch.replay import ReplaySet
from brokerlet.dispatch.single_active import NO_PLACEMENT, Placement
from brokerlet.dispatch.stats import Cancellable, SubscriptionStats
from brokerlet.dispatch.strategy import Strategy
from brokerlet.dispatch.subscription import Removal, Subscription
from brokerlet.storage.cursor import Cursor
from brokerlet.storage.disk import CursorStore
from brokerlet.storage.expiry import ExpiryCounter
from brokerlet.storage.ledger import Entry
from brokerlet.topicops.subscription_side import SubscriptionOps, subscription_handlers
from brokerlet.transport.protocol import encode_command, pb

if TYPE_CHECKING:
    from brokerlet.actors.topic import TopicActor

__all__ = ["Dispatcher", "DispatcherActor"]

log = logging.getLogger(__name__)


class Dispatcher:
    """Dispatch for one subscription, runtime-neutral.

    Combined with an actor runtime below: :class:`DispatcherActor` on gevent for the broker;
    tests also run it on Pykka's ThreadingActor to prove the permit accounting does not depend
    on cooperative scheduling. Subclasses provide :meth:`call_later`.
    """

    actor_ref: pykka.ActorRef[DispatcherActor]  # or a test runtime's actor of this class

    def __init__(
        self,
        *,
        topic: pykka.ActorRef[TopicActor] | QuietRef,
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
        options: DispatchOptions = DEFAULT_OPTIONS,
        last_entry_id: Callable[[], int] | None = None,
        placement: Placement = NO_PLACEMENT,
    ) -> None:
        super().__init__()
        self.cursor_saver = CursorSaver(cursor_store, name, cursor)
        self._persist_timer: Cancellable | None = None
        self.topic = topic
        self.topic_name = topic_name
        self.ledger_id = ledger_id
        self.name = name
        self.durable = durable
        self.cursor = cursor
        self.read_position = read_position
        self.settings = settings
        self.options = options

        self.subscription = Subscription(
            name,
            settings,
            cursor,
            ledger_id=ledger_id,
            last_entry_id=last_entry_id,
            sub_type=sub_type,
            durable=durable,
            options=options,
            wake_after=self._wake_after,
            placement=placement,
        )
        self.book = self.subscription.book
        self.total_permits = self.subscription.total_permits
        self.delayed = DelayedDelivery(
            settings,
            applies=lambda: self.subscription.strategy.delays_delivery,
            replay=self.book.replay,
            cursor=cursor,
            wake_after=self._wake_for_delayed,
        )
        self.filters: list[DeliveryFilter] = [SkipSettled(cursor, self.book.replay), self.delayed]
        self.batch_acks = self.subscription.batch_acks
        if self.batch_acks is not None:
            self.filters.append(BatchAckFilter(self.batch_acks))
            self.cursor_saver.restore_batch_acks(self.batch_acks)  # partial acks survive restarts
        self.reads_issued = 0
        self.read_passes = 0  # wake-ups of the read loop, productive or not
        self._stats = SubscriptionStats()

        own = DispatchRateLimiter(
            "subscription",
            settings.dispatch_throttling_rate_per_subscription_in_msg,
            settings.dispatch_throttling_rate_per_subscription_in_byte,
        )
        self.rate_limiters = [lim for lim in (*rate_limiters, own) if lim.enabled]

        self._read_id = 0
        self._read_count = 0  # max_entries of the normal read pending
        self.pending_read: str | None = None  # None, "normal" or "replay"
        # Standing reads (see ReadEntries) unless a diagnostic option or a rate limit (whose
        # wait a push would skip) is in the way.
        self._may_stand = not (options.completion_barrier or options.read_after_dispatch)
        self.backoff = ReadBackoff(settings)
        self._retry: Cancellable | None = None
        self._replay_timer: Cancellable | None = None
        self._delay_timer: Cancellable | None = None  # the next delayed entry's time
        self._delay_timer_at = 0.0  # its monotonic deadline
        self._writes_in_flight = 0  # only counted with the completion barrier
        self._batches: list[SendMessages] = []  # this pass's, handed over once it ends
        self._gate: ConflatedTell[DispatcherActor] | None = None
        self.expiry = ExpiryCounter()
        # Admin operations: skips, expiry, non-persistent drops, end of topic.
        self.ops = SubscriptionOps(self)
        self._handlers: Handlers = Dispatcher.HANDLERS

    # Actor plumbing.

    def on_start(self) -> None:
        self._gate = ConflatedTell(self.actor_ref, ReadMore())
        self.book.wake = self._gate.request
        if self.cursor_saver.dirty:
            # A new durable subscription is saved with the acks of its first moment: a
            # short-lived one (a test's) then costs one rewrite of the cursors file, not two.
            self._persist_soon()

    def on_stop(self) -> None:
        self.cursor_saver.save()
        for consumer in self.book.consumers:  # stopped under them (their topic failed): reconnect
            tell_quietly(consumer.connection.actor, ConsumerClosedByBroker(consumer))
        for timer in (self._retry, self._replay_timer, self._persist_timer, self._delay_timer):
            if timer is not None:
                timer.cancel()

    def call_later(self, seconds: float, func: Callable[[], object]) -> Cancellable:
        """Run ``func`` (a thread-safe request) after ``seconds``; provided by the runtime."""
        raise NotImplementedError

    def on_receive(self, message: Any) -> Any:
        if message.__class__ is ReadMore:
            return self._read_more(message)
        handler = self._handlers.get(type(message))
        if handler is None:
            raise UnexpectedMessage(self, message)
        return handler(self, message)

    @property
    def gate(self) -> ConflatedTell[DispatcherActor]:
        assert self._gate is not None
        return self._gate

    # The state tests and stats look at, kept in the delivery book and the strategy.

    @property
    def strategy(self) -> Strategy:
        return self.subscription.strategy

    @property
    def replay(self) -> ReplaySet:
        return self.book.replay

    @property
    def pending_owner(self) -> dict[int, Consumer]:
        return self.book.pending_owner

    @property
    def unacked(self) -> int:
        return self.book.unacked

    @property
    def blocked_on_unacked(self) -> bool:
        return self.book.blocked_on_unacked

    @property
    def key_shared(self) -> KeySharedRules | None:
        strategy = self.strategy
        return strategy.rules if isinstance(strategy, KeySharedStrategy) else None

    # Membership.

    def _add_consumer(self, message: AddConsumer) -> list[bytes]:
        """Join a consumer; answers the ACTIVE_CONSUMER_CHANGE frames for its own connection,
        which the connection writes after the SUBSCRIBE's SUCCESS."""
        if self.subscription.add(message.consumer, self.gate):
            self._wake_for_replay()
        own = self._announce_active(message.consumer, message.consumer.connection)
        log.debug("%s: added %r", self, message.consumer)
        self.gate.request()
        return own

    def _remove_consumer(self, message: RemoveConsumer) -> None:
        removal = self.subscription.remove(message.consumer, unsubscribe=message.unsubscribe)
        if removal is Removal.ALREADY_GONE:
            return
        log.debug("%s: removed %r", self, message.consumer)
        if removal is Removal.OTHERS_REMAIN:
            self._announce_active(None)
            self._wake_for_replay()
            return
        self._rewind()
        if not self.durable or message.unsubscribe:
            if message.unsubscribe:
                self.cursor_saver.forget()  # deleted, not saved
            self.topic.tell(SubscriptionClosed(self.name, self.actor_ref, deleted=True))

    def _announce_active(
        self, added: Consumer | None, requester: ConnectionHandle | None = None
    ) -> list[bytes]:
        """Failover: ACTIVE_CONSUMER_CHANGE to whom the strategy says, after the MESSAGE
        frames already queued for them (so a listener sees it in order); the frames for
        ``requester``'s consumers are returned instead, for it to write after its reply."""
        own: list[bytes] = []
        for consumer, is_active in self.strategy.active_notices(added):
            change = pb.CommandActiveConsumerChange(
                consumer_id=consumer.consumer_id, is_active=is_active
            )
            frame = encode_command(
                pb.BaseCommand(
                    type=pb.BaseCommand.ACTIVE_CONSUMER_CHANGE, active_consumer_change=change
                )
            )
            handle = consumer.connection
            if handle is requester:
                own.append(frame)
            else:
                tell_quietly(handle.event_loop, WriteAfterMessages(handle, [frame]))
        return own

    def _seek(self, message: Seek) -> list[Consumer]:
        """Disconnect every consumer, forget in-flight state, and restart at ``entry_id``.

        As in Pulsar, the consumers are closed first (the client resubscribes with a full
        receiver queue), so no permits stay charged for messages the client dropped. Returns
        the requester's own consumers: it closes those itself, before answering the seek.
        """
        closed = self.subscription.close_all()
        self.cursor.reset(message.entry_id - 1)
        if self.batch_acks is not None:
            self.batch_acks.clear()  # as Pulsar's cursor reset drops batch-deleted indexes
        self._rewind()  # reads start again at entry_id
        self._cursor_changed()
        self.topic.tell(MarkDeleteMoved(self.name, self.cursor.mark_delete))  # stats, retention
        log.info("%s: reset to entry %d", self, message.entry_id)
        for consumer in closed:
            if consumer.connection is not message.requester and consumer.connection.actor:
                consumer.connection.actor.tell(ConsumerClosedByBroker(consumer))
        return [c for c in closed if c.connection is message.requester]

    def _close_consumers(self, message: CloseConsumers) -> int:
        """Close every consumer the broker's way (delete, unload); their unacked entries come
        again when they reconnect. Answers how many were attached."""
        attached = len(self.book.consumers)
        if not message.close or (message.only_if_idle and attached):
            return attached
        if message.forget_cursor:
            self.cursor_saver.forget()  # the subscription is being deleted
        closed = self.subscription.close_all()
        self._rewind()
        for consumer in closed:
            tell_quietly(consumer.connection.actor, ConsumerClosedByBroker(consumer))
        return attached

    def _rewind(self) -> None:
        """No consumer is left: cancel the read in flight and re-read from the mark-delete."""
        self._cancel_pending_read()
        self.subscription.rewind()
        for rule in self.filters:
            rule.reset()
        self.read_position = self.cursor.mark_delete + 1

    # The read loop.

    def _read_more(self, _message: object) -> None:
        self.gate.taken()
        self.read_passes += 1
        for rule in self.filters:
            rule.release_due()
        if not self.book.consumers or (self.options.completion_barrier and self._writes_in_flight):
            return
        strategy = self.strategy
        if self.pending_read is not None:
            if not (self.pending_read == "normal" and strategy.replay_ready()):
                return
            # Key_Shared looked ahead past held-back entries and one of them can go out now:
            # the read waiting for new entries must not hold it back.
            self._cancel_pending_read()
        available = self.book.available
        first = next((c for c in strategy.candidates() if available(c)), None)
        if first is None:
            return  # a FLOW, a writable event, an ack or a completion will wake us
        permits = max(self.total_permits.value, first.permits)
        if permits <= 0:
            return
        batch = permits
        if self.settings.precise_dispatcher_flow_control:
            per_entry = first.messages_per_entry
            if per_entry > 1:  # batches: the permits cover fewer entries
                batch = -(-permits // per_entry)
        batch = min(batch, self.backoff.read_batch_size)
        max_bytes = self.settings.dispatcher_max_read_size_bytes
        if self.rate_limiters:
            wait = limiters_wait(self.rate_limiters)
            if wait > 0:
                self._retry_later(wait * 1000)  # a writable event meanwhile dispatches nothing
                return
            batch, max_bytes = limiters_allowance(self.rate_limiters, batch, max_bytes)
        plan = strategy.plan_read(batch)
        read_id = self._read_id + 1
        if plan.replay_ids:
            self._issue_read("replay", ReadIds(self.name, read_id, plan.replay_ids, self.actor_ref))
        elif plan.count:
            start = self.read_position
            standing = self._may_stand and strategy.reads_after_dispatch and not self.rate_limiters
            self._read_count = plan.count
            self._issue_read(
                "normal",
                ReadEntries(
                    self.name, read_id, start, plan.count, max_bytes, self.actor_ref, standing
                ),
            )
        elif plan.backoff:
            self._retry_later(self.backoff.retry_delay_ms())

    def _issue_read(self, kind: str, request: ReadEntries | ReadIds) -> None:
        self._read_id = request.read_id
        self.pending_read = kind
        self.reads_issued += 1
        if kind == "normal" and not self.strategy.looks_ahead:
            # Until it completes, a pass would find this read pending and stop: FLOWs, write
            # completions and writable events need not wake us for that. Its completion or
            # cancellation decides afresh from the state then.
            self.gate.hold()
        self.topic.tell(request)

    def _cancel_pending_read(self) -> None:
        if self.pending_read == "normal":
            self.topic.tell(CancelRead(self.name, self._read_id))
        self.gate.release()
        self.pending_read = None
        self._read_id += 1  # a completion already on its way is stale now

    def _wake_for_replay(self) -> None:
        """Entries joined the replay set: a long poll waiting for new entries must not hold them."""
        for rule in self.filters:
            rule.release_due()
        if self.book.replay and self.pending_read == "normal":
            self._cancel_pending_read()
        self.gate.request()

    def _entries_read(self, message: EntriesRead) -> None:
        if message.read_id != self._read_id:
            return  # cancelled
        self.gate.release()
        self.pending_read = None
        entries = message.entries
        if isinstance(entries, BaseException):
            delay = self.backoff.read_failed()
            log.warning("%s: read failed, retrying in %.0f ms: %s", self, delay, entries)
            self._retry_later(delay)
            return
        self.backoff.read_succeeded()
        replay = message.replay
        if replay and self.strategy.replay_stale():
            self.gate.request()  # an older entry was redelivered meanwhile: read again
            return
        if not replay and entries:
            self.read_position = entries[-1].entry_id + 1
        for rule in self.filters:
            entries = rule.admit(entries, replay=replay)
        if not entries:
            if not (message.standing and self._stay_parked(handed_out=True)):
                self.gate.request()
            return
        sent = self._send(entries, replay=replay)
        if message.standing and self._stay_parked(handed_out=sent):
            self.backoff.dispatched()
            return  # the topic pushes what comes next
        if sent:
            self.backoff.dispatched()
            if self.options.read_after_dispatch:
                self.gate.request()
            # else the batches' write completions request the next pass
        elif any(c.writable for c in self.strategy.candidates()):
            self._retry_later(self.backoff.retry_delay_ms())
        # else: nothing writable; the writable event requests the next read.

    def _stay_parked(self, *, handed_out: bool) -> bool:
        """After a push of a standing read: stay parked on it while every entry went out
        and the permits still cover its size; otherwise cancel it and go on as after any
        read (the entries held back are replayed, a smaller read waits for permits)."""
        book = self.book
        if (
            handed_out
            and not book.replay
            and not book.blocked_on_unacked
            and self.total_permits.value >= self._read_count
        ):
            self.pending_read = "normal"
            self.gate.hold()
            return True
        self.topic.tell(CancelRead(self.name, self._read_id))
        self._read_id += 1  # a push already on its way is stale now
        return False

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
        """Hand ``entries`` to the strategy; the rest go to replay. True if any went out."""
        try:
            held = self.strategy.assign(entries, self._deliver, replay=replay)
        finally:
            if self._batches:  # what was recorded as delivered must reach its consumers
                self._hand_over()
        waiting = self.book.replay
        if replay:
            kept = {entry.entry_id for entry, _ in held}
            for entry in entries:
                if entry.entry_id not in kept:
                    waiting.discard(entry.entry_id)
        for entry, key_hash in held:
            waiting.add(entry.entry_id, key_hash)
        return len(held) < len(entries)

    def _deliver(self, consumer: Consumer, batch: list[Entry], messages: int) -> None:
        redelivery = self.book.record(consumer, batch, messages)
        if self.rate_limiters:
            size = sum(len(entry.data) for entry in batch)
            for limiter in self.rate_limiters:
                limiter.charge(messages, size)
        completion: WriteCompletion = self.gate
        if self.options.completion_barrier:
            self._writes_in_flight += 1
            completion = _BatchWrittenNotice(self.actor_ref)
        ack_sets = None
        batch_acks = self.batch_acks
        if batch_acks:  # partly acked batches tell the client which members to skip
            ack_sets = {}
            for entry in batch:
                words = batch_acks.words(entry.entry_id)
                if words is not None:
                    ack_sets[entry.entry_id] = words
        self._batches.append(
            SendMessages(consumer, batch, redelivery, completion, ack_sets or None, consumer.epoch)
        )

    def _hand_over(self) -> None:
        """Tell the event loops this pass's batches: a connection's several batches as one
        message (one write, see actors/eventloop.py), a lone batch as itself."""
        batches = self._batches
        if len(batches) == 1:
            only = batches.pop()
            only.consumer.connection.event_loop.tell(only)
            return
        self._batches = []
        by_connection: dict[ConnectionHandle, list[SendMessages]] = {}
        for message in batches:
            connection = message.consumer.connection
            queued = by_connection.get(connection)
            if queued is None:
                by_connection[connection] = [message]
            else:
                queued.append(message)
        for connection, queued in by_connection.items():
            connection.event_loop.tell(
                queued[0] if len(queued) == 1 else SendMessageBatches(queued)
            )

    def _batch_written(self, _message: object) -> None:
        self._writes_in_flight -= 1
        if not self._writes_in_flight:
            self.gate.request()

    # Acknowledgements and redelivery.

    def _ack(self, message: Ack) -> None:
        moved = self.subscription.ack(
            message.positions, cumulative=message.cumulative, ack_sets=message.ack_sets
        )
        if moved is None:
            return
        if moved:
            self.topic.tell(MarkDeleteMoved(self.name, self.cursor.mark_delete))
        self._cursor_changed()

    def _expire_up_to(self, message: ExpireUpTo) -> int:
        """PersistentMessageExpiryMonitor's mark-delete move; answers how many expired."""
        cursor = self.cursor
        upto = message.entry_id
        if upto <= cursor.mark_delete:
            return 0
        expired = upto - cursor.mark_delete - cursor.acked_up_to(upto)
        scope = self.strategy.ack_scope()
        if scope is None:
            self.book.ack([upto], cumulative=True)
        else:
            with scope:
                self.book.ack([upto], cumulative=True)
        self.read_position = max(self.read_position, upto + 1)
        if message.expiry:
            self.expiry.record(expired)
        self.topic.tell(MarkDeleteMoved(self.name, cursor.mark_delete))
        self._cursor_changed()
        return expired

    def _redeliver(self, message: Redeliver) -> None:
        consumer = message.consumer
        if message.epoch is not None and consumer.epoch is not None:
            # As Pulsar's Consumer: a newer epoch is taken; MESSAGE frames of the old one
            # still on their way are dropped by the client.
            consumer.epoch = max(consumer.epoch, message.epoch)
        self.subscription.redeliver(consumer, message.positions)
        self._wake_for_replay()

    def _wake_after(self, delay_ms: float) -> None:
        """The strategy says replayed entries may go out after ``delay_ms``: read again then
        (one timer at a time, so wake-ups meanwhile merge)."""
        if delay_ms <= 0:
            self._wake_for_replay()
        elif self._replay_timer is None or self._replay_timer.done:
            tell = self.actor_ref.tell
            self._replay_timer = self.call_later(delay_ms / 1000, lambda: tell(ReplayReady()))

    def _replay_ready(self, _message: ReplayReady) -> None:
        """A strategy's delayed wake-up: what it held may go out (and Failover's hold over,
        its change is announced)."""
        self._announce_active(None)
        self._wake_for_replay()

    def _wake_for_delayed(self, delay_ms: float) -> None:
        """The delay tracker's next entry is due after ``delay_ms``: a timer of its own (so
        the strategy's wake-ups never cancel it), an earlier time replacing a later one."""
        if delay_ms <= 0:
            self._wake_for_replay()
            return
        deadline = time.monotonic() + delay_ms / 1000
        timer = self._delay_timer
        if timer is not None and not timer.done:
            if self._delay_timer_at <= deadline:
                return
            timer.cancel()
        ref = self.actor_ref
        self._delay_timer_at = deadline
        self._delay_timer = self.call_later(
            delay_ms / 1000, lambda: tell_quietly(ref, ReplayReady())
        )

    def _cursor_changed(self) -> None:
        if self.cursor_saver.changed():
            self._persist_soon()

    def _persist_soon(self) -> None:
        """Save the cursor soon: at most once per ``cursor_flush_ms``, whatever the ack rate."""
        if self._persist_timer is None or self._persist_timer.done:
            tell = self.actor_ref.tell
            self._persist_timer = self.call_later(
                self.settings.cursor_flush_ms / 1000, lambda: tell(PersistCursor())
            )

    # Observability.

    def stats(self) -> dict[str, Any]:
        """This subscription's part of the topic stats, shaped like Pulsar's."""
        snapshot: dict[str, Any] = self._stats.snapshot(
            strategy=self.strategy,
            book=self.book,
            ledger_id=self.ledger_id,
            read_position=self.read_position,
            total_permits=self.total_permits.value,
            durable=self.durable,
            loop={
                "readsIssued": self.reads_issued,
                "readPasses": self.read_passes,
                "readBatchSize": self.backoff.read_batch_size,
                "msgDelayed": self.delayed.delayed,
            },
        )
        snapshot.update(self.expiry.stats())
        return snapshot

    def __str__(self) -> str:
        return f"{self.topic_name} / {self.name}"

    # With the admin operations' handlers and checks (brokerlet.topicops.subscription_side).
    HANDLERS: ClassVar[Handlers] = subscription_handlers(
        {
            ExpireUpTo: _expire_up_to,
            ReadMore: _read_more,
            EntriesRead: _entries_read,
            Ack: _ack,
            Redeliver: _redeliver,
            AddConsumer: _add_consumer,
            RemoveConsumer: _remove_consumer,
            Seek: _seek,
            ReplayReady: _replay_ready,
            BatchWritten: _batch_written,
            PersistCursor: lambda d, _m: d.cursor_saver.save(),
            GetStats: lambda d, _m: d.stats(),
            GetMarkDelete: lambda d, _m: d.cursor.mark_delete,
            GetCursorState: lambda d, _m: (d.cursor.mark_delete, d.cursor.acked_ranges()),
            CloseConsumers: _close_consumers,
        }
    )


class DispatcherActor(Dispatcher, GeventActor):
    """The broker's dispatcher: :class:`Dispatcher` on a gevent actor."""

    def call_later(self, seconds: float, func: Callable[[], object]) -> Cancellable:
        return GreenletTimer(gevent.spawn_later(seconds, func))

    def on_failure(self, exc_type: object, exc: object, _tb: object) -> None:
        dispatcher_failed(self, ConsumerClosedByBroker)


class _BatchWrittenNotice:
    """The completion barrier's write completion: one :class:`BatchWritten` per batch."""

    __slots__ = ("_actor_ref",)

    def __init__(self, actor_ref: pykka.ActorRef[DispatcherActor]) -> None:
        self._actor_ref = actor_ref

    def request(self) -> None:
        self._actor_ref.tell(BatchWritten())
