"""The topic: one actor per topic, owning its ledger, its producers and its subscriptions.

Appends arrive as one message per received chunk of SENDs and are answered with one message of
receipts. Reads come from the topic's dispatchers; a read at the end of the ledger waits here
until the next append (the long poll) or until its dispatcher cancels it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from operator import itemgetter
from typing import TYPE_CHECKING, Any, ClassVar

import gevent
import pykka

from brokerlet.actors._runtime import GeventActor
from brokerlet.actors.dispatcher import DispatcherActor
from brokerlet.actors.errors import BrokerError
from brokerlet.actors.messages import (
    AddProducer,
    Append,
    AppendDone,
    Appended,
    AppendedAll,
    BacklogQuotaReport,
    CancelRead,
    CloseClients,
    CloseConsumers,
    Compact,
    CompactionDone,
    CompactionStatus,
    CursorState,
    DispatcherFailed,
    EntriesRead,
    ExpireEntries,
    ExpireUpTo,
    FindByPublishTime,
    GetCursorState,
    GetLastEntry,
    Handlers,
    IsIdle,
    MarkDeleteMoved,
    MaybeCompact,
    ReadEntries,
    ReadIds,
    Receipt,
    RemoveProducer,
    ResolvePosition,
    Subscribe,
    SubscriptionClosed,
    TopicClosedByBroker,
    TopicFailed,
    TopicStats,
    TopicStatsPart,
    UnexpectedMessage,
)
from brokerlet.actors.supervision import (
    QuietRef,
    record_failure,
    stop_quietly,
    tell_quietly,
)
from brokerlet.compaction.state import (
    COMPACTION_SUBSCRIPTION,
    CompactionRunningError,
    TopicCompaction,
)
from brokerlet.config import Settings
from brokerlet.dispatch.options import DEFAULT_OPTIONS, DispatchOptions
from brokerlet.dispatch.ratelimit import DispatchRateLimiter
from brokerlet.dispatch.single_active import Placement
from brokerlet.dispatch.stats import Rate
from brokerlet.metadata.naming import TopicName
from brokerlet.producers import hooks as producer_hooks
from brokerlet.storage.backlog_quota import QuotaState, refusal, size_exceeded_now
from brokerlet.storage.cursor import Cursor
from brokerlet.storage.disk import CursorStore
from brokerlet.storage.ledger import Entry, Ledger, new_entry_data, new_entry_messages
from brokerlet.storage.marks import MarkDeletes
from brokerlet.storage.retention import RetentionService
from brokerlet.storage.time_search import PublishTimeSearch
from brokerlet.topicops.topic_side import TopicOps, topic_handlers
from brokerlet.transport.protocol import pb, publish_time

if TYPE_CHECKING:
    from brokerlet.actors.broker import BrokerActor

__all__ = ["TopicActor"]

log = logging.getLogger(__name__)

_ENTRY_OF = itemgetter(2)  # an AppendItem's NewEntry, None if refused

# start_message_id values the official client uses for readers.
EARLIEST_ID = 2**64 - 1
LATEST_ID = 2**63 - 1


class TopicActor(GeventActor):
    """The managed ledger of one topic: appends, reads and subscription cursors."""

    def __init__(
        self,
        name: str,
        ledger: Ledger,
        settings: Settings,
        broker_limiter: DispatchRateLimiter | None = None,
        cursors: CursorStore | None = None,
        *,
        dispatch_options: DispatchOptions = DEFAULT_OPTIONS,
        supervisor: pykka.ActorRef[BrokerActor] | None = None,  # told if this actor fails
        restored: dict[str, CursorState] | None = None,  # cursors of a failed predecessor
        retention: RetentionService | None = None,  # told when the slowest cursor moves
        deduplication: bool | None = None,  # the namespace's policy; None: the setting's
    ) -> None:
        super().__init__()
        self.supervisor = supervisor
        self.restored = restored or {}
        self.name = name
        self.placement = Placement.of(  # where Failover's pick looks
            name,
            TopicName.parse(name).partition_index,
            settings.active_consumer_failover_consistent_hashing,
        )
        self.dispatch_options = dispatch_options
        self.cursors = cursors  # durable subscriptions' acknowledgements, with a disk ledger
        self.saved: dict[str, CursorState] = {}
        self.ledger = ledger
        self.settings = settings
        # Access modes, topic epoch and deduplication (brokerlet.producers).
        self.producer_state = producer_hooks.TopicProducers(
            name, ledger, settings, cursors, deduplication, receipt=Receipt
        )
        self.subscriptions: dict[str, pykka.ActorRef[DispatcherActor]] = {}
        self.mark_deletes = MarkDeletes()  # readers' marks are released: no data held back
        self.retention = retention
        self.quota = QuotaState()  # the backlog-quota check's last finding
        self.read_compacted: set[str] = set()  # subscriptions reading the compacted view
        self.compaction = TopicCompaction(
            name,
            ledger,
            retain_null_key=settings.topic_compaction_retain_null_key,
            cpu_share=settings.compaction_cpu_share,
        )
        self.waiting: dict[str, ReadEntries] = {}  # long polls at the end of the ledger
        # Standing reads being answered: subscription -> read id; re-armed when their read
        # completes at the end of the ledger, unless cancelled or replaced meanwhile.
        self.standing: dict[str, int] = {}
        self.msg_in = 0
        self.bytes_in = 0
        self._rate_in = Rate()
        self._throughput_in = Rate()
        topic_limiter = DispatchRateLimiter(
            "topic",
            settings.dispatch_throttling_rate_per_topic_in_msg,
            settings.dispatch_throttling_rate_per_topic_in_byte,
        )
        self.rate_limiters = [
            lim for lim in (broker_limiter, topic_limiter) if lim is not None and lim.enabled
        ]
        # Admin operations (terminate, unload, skip, peek, ...) and the non-persistent rule.
        self.ops = TopicOps(self)
        self._handlers = self.ops.handlers(TopicActor.HANDLERS)

    def on_start(self) -> None:
        self.compaction.load()
        self._compaction_holds()
        self.producer_state.start()
        if self.cursors is None:
            self._restore()
            return
        # Durable subscriptions stored before a restart: they hold back retention from the
        # start, and their cursors are restored when a consumer comes back.
        for subscription in self.cursors.subscriptions():
            state = self.cursors.load(subscription)
            if state is not None:
                self.saved[subscription] = state
                self.mark_deletes[subscription] = state[0]
        self._restore()

    def _restore(self) -> None:
        # A failed predecessor's cursors are newer than any stored copy.
        for subscription, state in self.restored.items():
            self.saved[subscription] = state
            self.mark_deletes[subscription] = state[0]
        self._trim()

    def on_receive(self, message: Any) -> Any:
        handler = self._handlers.get(type(message))
        if handler is None:
            raise UnexpectedMessage(self, message)
        return handler(self, message)

    def _on_actor(self, handle: Callable[[Any], None]) -> Callable[[Any], None]:
        """A storage callback that runs ``handle`` on this actor.

        The in-memory ledger completes at once, inside our handler; a disk ledger completes
        later on the hub, outside the actor, so the result comes back as a message.
        """
        greenlet = getattr(self, "actor_greenlet", None)

        def callback(result: Any) -> None:
            if gevent.getcurrent() is greenlet:
                handle(result)
            else:
                tell_quietly(self.actor_ref, AppendDone(handle, result))  # it may have failed

        return callback

    def on_stop(self) -> None:
        # Dispatchers save their cursors as they stop; the ledger closes after them.
        for dispatcher in self.subscriptions.values():
            with contextlib.suppress(pykka.ActorDeadError):
                dispatcher.stop(block=True, timeout=5)
        self.producer_state.stop()
        self.ledger.close()

    def on_failure(self, exc_type: object, exc: object, _tb: object) -> None:
        """Hand the cursors to the broker and have every client reconnect to a fresh actor.

        The ledger stays open: the replacement reuses it (supervision.py).
        """
        record_failure("topic")
        cursors: dict[str, CursorState] = dict(self.saved)
        for subscription, dispatcher in list(self.subscriptions.items()):
            try:
                state: CursorState = dispatcher.ask(GetCursorState(), block=True, timeout=1)
                cursors[subscription] = state
            except Exception:  # dead or stuck: the stored cursor is what is left
                log.warning("%s: no cursor from subscription %r", self.name, subscription)
            stop_quietly(dispatcher)  # it closes its consumers as it stops
        for connection in self.producer_state.connections():
            tell_quietly(connection, TopicClosedByBroker(self.actor_ref))
        if self.supervisor is not None:
            tell_quietly(self.supervisor, TopicFailed(self.name, self.actor_ref, cursors))

    # Producing.

    def _append(self, message: Append) -> None:
        items = message.items
        ledger_id = self.ledger.ledger_id
        # Answers decided before storage: fenced producers, repeated sequence ids.
        decided, screened = self.producer_state.screen(message.reply_to, message.producer_id, items)
        if decided:
            new = [
                item[2] for i, item in enumerate(items) if item[2] is not None and i not in decided
            ]
        else:
            new = list(filter(None, map(_ENTRY_OF, items)))  # a NewEntry is never empty

        def appended(result: int | BaseException) -> None:
            if isinstance(result, int) and not decided and len(new) == len(items):
                answer: Any = AppendedAll(message.producer_id, items, ledger_id, result)
            else:
                answer = Appended(message.producer_id, receipts(result))
            # The producer's connection may be gone (a reset mid-append): not our failure.
            tell_quietly(message.reply_to, answer)
            if screened is not None:
                last_id = result + len(new) - 1 if isinstance(result, int) else -2
                self.producer_state.appended(screened, items, decided, result, last_id)
            if isinstance(result, int):
                self.msg_in += sum(map(new_entry_messages, new))
                self.bytes_in += sum(map(len, map(new_entry_data, new)))
                self._complete_waiting_reads()

        def receipts(result: int | BaseException) -> list[Receipt]:
            """One per item, in order: refusals and answers decided before storage among them."""
            receipts = []
            next_id = result if isinstance(result, int) else -1
            for index, (sequence_id, highest, entry, refused) in enumerate(items):
                if decided and index in decided:
                    receipts.append(decided[index])
                    continue
                if entry is None:
                    error = refused or (pb.ChecksumError, "Checksum verification failed")
                elif isinstance(result, BaseException):
                    error = (pb.PersistenceError, f"Append failed: {result}")
                else:
                    receipts.append(Receipt(sequence_id, highest, ledger_id, next_id))
                    next_id += 1
                    continue
                receipts.append(Receipt(sequence_id, highest, ledger_id, -1, *error))
            return receipts

        if new:
            self.ledger.append(new, self._on_actor(appended))
        else:
            appended(0)

    def _backlog_quota(self, message: BacklogQuotaReport) -> None:
        self.quota = message.state
        if message.evict_to >= 0:
            log.info(
                "%s: backlog quota exceeded, evicting up to entry %d", self.name, message.evict_to
            )
            self._expire_messages(ExpireEntries(message.evict_to, expiry=False))
        elif refusal(message.state) is not None and len(self.producer_state.access):
            # BacklogQuotaManager#disconnectProducers: they reconnect and are refused.
            log.info("%s: backlog quota exceeded, disconnecting producers", self.name)
            self.close_producers()

    def _add_producer(self, message: AddProducer) -> Any:
        if self.quota.exceeded == "destination_storage" and not size_exceeded_now(
            self.quota, self._backlog_bytes()
        ):
            self.quota = QuotaState()  # drained since the last check
        refused = refusal(self.quota)
        if refused is not None:
            raise BrokerError(*refused)
        self.producer_state.set_deduplication(message.deduplication)
        return self.producer_state.add(message)

    def _remove_producer(self, message: RemoveProducer) -> None:
        self.producer_state.remove(message.name, message.connection, message.producer_id)

    def _close_clients(self, message: CloseClients) -> int:
        count = len(self.producer_state.access)
        for dispatcher in list(self.subscriptions.values()):
            with contextlib.suppress(pykka.ActorDeadError):
                attached: int = dispatcher.ask(CloseConsumers(message.close), block=True)
                count += attached
        if message.close:
            self.close_producers()
        return count

    def close_producers(self) -> int:
        """CLOSE_PRODUCER to every producer (delete, unload, terminate); they reconnect."""
        for connection in self.producer_state.connections():
            tell_quietly(connection, TopicClosedByBroker(self.actor_ref))
        closed = len(self.producer_state.access)
        self.producer_state.clear()
        return closed

    # Subscriptions.

    def _subscribe(self, message: Subscribe) -> pykka.ActorRef[DispatcherActor]:
        existing = self.subscriptions.get(message.subscription)
        if message.read_compacted and message.sub_type not in (
            pb.CommandSubscribe.Exclusive,
            pb.CommandSubscribe.Failover,
        ):
            raise BrokerError(
                pb.NotAllowedError,
                "readCompacted only allowed on failover or exclusive subscriptions",
            )
        producer_hooks.check_consumer_limits(
            self.settings, existing, list(self.subscriptions.values())
        )
        if existing is not None:
            return existing
        first = self.ledger.first_entry_id
        if message.read_compacted:
            first = self.compaction.first_id(first)
        last = self.ledger.last_entry_id
        start = first if message.initial_position == pb.CommandSubscribe.Earliest else last + 1
        if message.start_message_id is not None:
            start = self._start_of(message.start_message_id)
            if message.read_compacted and start == self.ledger.first_entry_id:
                start = min(start, first)
        cursor = Cursor(start - 1)
        saved = self.saved.pop(message.subscription, None) if message.durable else None
        if saved is not None:
            cursor = Cursor.restore(*saved)
            start = cursor.mark_delete + 1
        dispatcher = DispatcherActor.start(
            topic=QuietRef(self.actor_ref),
            topic_name=self.name,
            ledger_id=self.ledger.ledger_id,
            name=message.subscription,
            sub_type=message.sub_type,
            durable=message.durable,
            cursor=cursor,
            read_position=start,
            settings=self.settings,
            rate_limiters=self.rate_limiters,
            cursor_store=self.cursors if message.durable else None,
            options=self.dispatch_options,
            last_entry_id=lambda: self.ledger.last_entry_id,
            placement=self.placement,
        )
        self.subscriptions[message.subscription] = dispatcher
        self.mark_deletes[message.subscription] = cursor.mark_delete
        if not message.durable:
            self.mark_deletes.release(message.subscription)
        if message.read_compacted:
            self.read_compacted.add(message.subscription)
        self._trim()
        log.info("%s: created subscription %r at entry %d", self.name, message.subscription, start)
        return dispatcher

    def _start_of(self, message_id: tuple[int, int]) -> int:
        ledger_id, entry_id = message_id
        if ledger_id == EARLIEST_ID and entry_id == EARLIEST_ID:
            return self.ledger.first_entry_id
        if ledger_id == LATEST_ID and entry_id == LATEST_ID:
            return self.ledger.last_entry_id + 1
        if ledger_id < self.ledger.ledger_id:
            return self.ledger.first_entry_id
        if ledger_id > self.ledger.ledger_id:
            return self.ledger.last_entry_id + 1
        # Inclusive: an exclusive reader's client drops the start message itself.
        return max(self.ledger.first_entry_id, min(entry_id, self.ledger.last_entry_id + 1))

    def _subscription_closed(self, message: SubscriptionClosed) -> None:
        dispatcher = self.subscriptions.get(message.subscription)
        if dispatcher is not None and dispatcher is message.dispatcher:
            del self.subscriptions[message.subscription]
            self.mark_deletes.pop(message.subscription, None)
            self.read_compacted.discard(message.subscription)
            self.waiting.pop(message.subscription, None)
            self.standing.pop(message.subscription, None)
            if message.deleted and self.cursors is not None:
                self.cursors.delete(message.subscription)
            dispatcher.stop(block=False)
            self._trim()

    def _dispatcher_failed(self, message: DispatcherFailed) -> None:
        if self.subscriptions.get(message.subscription) is not message.dispatcher:
            return
        del self.subscriptions[message.subscription]
        self.waiting.pop(message.subscription, None)
        self.standing.pop(message.subscription, None)
        if message.cursor is not None:
            # Resumed from here by the next SUBSCRIBE; retention keeps holding its backlog.
            self.saved[message.subscription] = message.cursor
        else:
            self.mark_deletes.pop(message.subscription, None)
            self._trim()

    def _mark_delete_moved(self, message: MarkDeleteMoved) -> None:
        if message.subscription in self.mark_deletes:
            self.mark_deletes[message.subscription] = message.mark_delete
            self._trim()

    def _trim(self) -> None:
        # Retention (storage/retention.py) decides which whole segments go, on the storage
        # side; the topic only tells it how far every durable subscription has consumed.
        consumed = self.mark_deletes.slowest()
        if consumed != self.ledger.consumed_up_to:
            self.ledger.consumed_up_to = consumed
            if self.retention is not None:
                self.retention.poke(self.name)

    def _expire_messages(self, message: ExpireEntries) -> None:
        for dispatcher in list(self.subscriptions.values()):
            tell_quietly(dispatcher, ExpireUpTo(message.entry_id, message.expiry))
        # Stored subscriptions without a consumer (after a restart) expire too.
        for name, (mark_delete, acked) in list(self.saved.items()):
            if message.entry_id <= mark_delete:
                continue
            cursor = Cursor.restore(mark_delete, acked)
            cursor.ack_cumulative(message.entry_id)
            self.saved[name] = (cursor.mark_delete, cursor.acked_ranges())
            self.mark_deletes[name] = cursor.mark_delete
            if self.cursors is not None:
                self.cursors.save(name, cursor.mark_delete, cursor.acked_ranges())
        self._trim()

    # Reading.

    def _read_entries(self, message: ReadEntries) -> None:
        self.standing.pop(message.subscription, None)  # a new read replaces a standing one
        if max(message.start, self.ledger.first_entry_id) > self.ledger.last_entry_id:
            self.waiting[message.subscription] = message
            return
        self.waiting.pop(message.subscription, None)
        self._read_now(message)

    def _read_now(self, message: ReadEntries) -> None:
        def done(result: list[Entry] | BaseException) -> None:
            tell_quietly(message.reply_to, EntriesRead(message.read_id, result, replay=False))

        start = message.start
        if message.subscription in self.read_compacted:
            compacted, start = self.compaction.read(start, message.max_entries)
            if compacted:
                done(compacted)
                return
            if start > self.ledger.last_entry_id:
                self.waiting[message.subscription] = message.resumed_at(start)
                return
        self.ledger.read(start, message.max_entries, message.max_bytes, done)

    def _complete_waiting_reads(self) -> None:
        if not self.waiting:
            return
        last = self.ledger.last_entry_id
        ready = [read for read in self.waiting.values() if read.start <= last]
        for read in ready:
            del self.waiting[read.subscription]
            if read.standing and read.subscription not in self.read_compacted:
                self._read_standing(read)
            else:
                self._read_now(read)

    def _read_standing(self, read: ReadEntries) -> None:
        """Answer a standing read and arm it again from the result, if the result reached
        the end of the ledger and nothing cancelled or replaced the read meanwhile (a cut
        by ``max_entries`` or ``max_bytes`` leaves the rest to the dispatcher's next read)."""
        subscription = read.subscription
        self.standing[subscription] = read.read_id

        def done(result: list[Entry] | BaseException) -> None:
            armed = False
            if self.standing.get(subscription) == read.read_id:
                del self.standing[subscription]
                if (
                    isinstance(result, list)
                    and result
                    and result[-1].entry_id == self.ledger.last_entry_id
                    and subscription in self.subscriptions
                ):
                    self.waiting[subscription] = read.resumed_at(result[-1].entry_id + 1)
                    armed = True
            tell_quietly(
                read.reply_to, EntriesRead(read.read_id, result, replay=False, standing=armed)
            )

        self.ledger.read(read.start, read.max_entries, read.max_bytes, self._on_actor(done))

    def _read_ids(self, message: ReadIds) -> None:
        def done(result: list[Entry] | BaseException) -> None:
            tell_quietly(message.reply_to, EntriesRead(message.read_id, result, replay=True))

        view = self.compaction.view
        if message.subscription in self.read_compacted and view is not None:
            # Redeliveries within the horizon come from the view (the topic may have
            # trimmed them).
            found = view.read_ids([i for i in message.entry_ids if i <= view.horizon])
            later = [i for i in message.entry_ids if i > view.horizon]

            def merged(result: list[Entry] | BaseException) -> None:
                if isinstance(result, BaseException):
                    done(result)
                    return
                found.update((entry.entry_id, entry) for entry in result)
                done([found[i] for i in message.entry_ids if i in found])

            self.ledger.read_ids(later, merged)
            return
        self.ledger.read_ids(message.entry_ids, done)

    def _find_by_publish_time(self, message: FindByPublishTime) -> None:
        ledger = self.ledger
        search = PublishTimeSearch(
            ledger.first_entry_id, ledger.last_entry_id, message.publish_time, publish_time
        )
        tell = self.actor_ref.tell

        def step() -> None:
            # Probes completing at once (memory, the disk tail cache) loop here; a disk read
            # comes back as an AppendDone, so the search continues on this actor.
            while (probe := search.probe()) is not None:
                answer: list[list[Entry] | BaseException] = []
                later = [False]

                def done(
                    result: list[Entry] | BaseException,
                    probe: int = probe,
                    answer: list[list[Entry] | BaseException] = answer,
                    later: list[bool] = later,
                ) -> None:
                    if later[0]:
                        tell(AppendDone(lambda r: resume(probe, r), result))
                    else:
                        answer.append(result)

                ledger.read_ids([probe], done)
                if not answer:
                    later[0] = True
                    return  # resumed by the completion
                if not observe(probe, answer[0]):
                    return
            message.reply((ledger.ledger_id, search.result))

        def observe(probe: int, result: list[Entry] | BaseException) -> bool:
            if isinstance(result, BaseException):
                message.reply(result)
                return False
            search.observe(probe, result)
            return True

        def resume(probe: int, result: list[Entry] | BaseException) -> None:
            if observe(probe, result):
                step()

        step()

    def _last_entry(self, message: GetLastEntry) -> tuple[int, int]:
        last = self.ledger.last_entry_id
        view = self.compaction.view
        # As Pulsar's handleGetLastMessageId for readCompacted: within the horizon the last
        # message is the view's (the topic's may have been compacted away).
        if (
            message.subscription in self.read_compacted
            and view is not None
            and last <= view.horizon
        ):
            last = view.ids[-1] if view.ids else -1
        return self.ledger.ledger_id, last

    # Compaction (brokerlet/compaction/).

    def _compact(self) -> None:
        try:
            self.compaction.start(
                self._on_actor(lambda r: self._compaction_done(CompactionDone(r)))
            )
        except CompactionRunningError as error:
            raise BrokerError(pb.ServiceNotReady, str(error)) from None

    def _maybe_compact(self, message: MaybeCompact) -> None:
        if message.threshold <= 0 or self.compaction.running is not None:
            return
        horizon = self.compaction.horizon
        bytes_from = getattr(self.ledger, "bytes_from", None)
        if bytes_from is None or self.ledger.last_entry_id <= (
            horizon if horizon is not None else -1
        ):
            return
        if bytes_from((horizon if horizon is not None else -1) + 1) > message.threshold:
            self._compact()

    def _compaction_done(self, message: CompactionDone) -> None:
        self.compaction.finished(message.result)
        self._compaction_holds()
        self._trim()

    def _compaction_holds(self) -> None:
        # The compactor's cursor is a durable cursor at the horizon (as Pulsar's
        # __compaction subscription): the topic's data after it stays until compacted.
        horizon = self.compaction.horizon
        if horizon is not None:
            self.mark_deletes[COMPACTION_SUBSCRIPTION] = horizon

    def _cancel_read(self, message: CancelRead) -> None:
        waiting = self.waiting.get(message.subscription)
        if waiting is not None and waiting.read_id == message.read_id:
            del self.waiting[message.subscription]
        if self.standing.get(message.subscription) == message.read_id:
            del self.standing[message.subscription]  # being answered: not armed again

    # Observability.

    def _backlog_bytes(self) -> int:
        slowest = self.mark_deletes.slowest()
        bytes_from = getattr(self.ledger, "bytes_from", None)
        if slowest is None or bytes_from is None:
            return 0
        size: int = bytes_from(slowest + 1)
        return size

    def stats(self) -> TopicStatsPart:
        """The topic's own stats and its subscriptions' dispatchers, at once: the caller asks
        the dispatchers, so a stats request never holds this actor (and its appends) up."""
        own = {
            "msgRateIn": self._rate_in.sample(self.msg_in),
            "msgThroughputIn": self._throughput_in.sample(self.bytes_in),
            "msgInCounter": self.msg_in,
            "bytesInCounter": self.bytes_in,
            "storageSize": getattr(self.ledger, "size_bytes", 0),
            # Bytes from the slowest durable subscription's position (Pulsar's backlogSize);
            # entries kept beyond it are retained by the retention policy.
            "backlogSize": self._backlog_bytes(),
            "firstEntryId": self.ledger.first_entry_id,
            "backlogQuotaLimitSize": self.quota.limit_size,
            "backlogQuotaLimitTime": self.quota.limit_time,
            "oldestBacklogMessageAgeSeconds": self.quota.oldest_age_s,
            "backlogQuotaExceeded": self.quota.exceeded,  # brokerlet's: the type, or null
            "compaction": self.compaction.stats(),
            "ledgerId": self.ledger.ledger_id,
            "lastEntryId": self.ledger.last_entry_id,
            **self.producer_state.stats(),
        }
        last = self.ledger.last_entry_id
        subscriptions = {
            name: (ref, self.mark_deletes.get(name, last))
            for name, ref in self.subscriptions.items()
        }
        return TopicStatsPart(own, last, subscriptions)

    def _is_idle(self, _message: IsIdle) -> bool:
        # A running compaction keeps the topic open: its outcome comes back here.
        return not (
            len(self.producer_state.access)
            or self.subscriptions
            or self.waiting
            or self.compaction.running
        )

    # With the admin operations' handlers and checks (brokerlet.topicops.topic_side).
    HANDLERS: ClassVar[Handlers] = topic_handlers(
        {
            Append: _append,
            ReadEntries: _read_entries,
            ReadIds: _read_ids,
            CancelRead: _cancel_read,
            MarkDeleteMoved: _mark_delete_moved,
            SubscriptionClosed: _subscription_closed,
            AddProducer: _add_producer,
            RemoveProducer: _remove_producer,
            Subscribe: _subscribe,
            AppendDone: lambda _topic, m: m.handle(m.result),
            GetLastEntry: _last_entry,
            ResolvePosition: lambda topic, m: topic._start_of(m.message_id),
            FindByPublishTime: _find_by_publish_time,
            TopicStats: lambda topic, _m: topic.stats(),
            DispatcherFailed: _dispatcher_failed,
            IsIdle: _is_idle,
            CloseClients: _close_clients,
            ExpireEntries: _expire_messages,
            BacklogQuotaReport: _backlog_quota,
            Compact: lambda topic, _m: topic._compact(),
            CompactionStatus: lambda topic, _m: topic.compaction.status_document(),
            CompactionDone: _compaction_done,
            MaybeCompact: _maybe_compact,
        }
    )
