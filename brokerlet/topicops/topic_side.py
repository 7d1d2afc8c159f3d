"""The topic actor's part of the topic operations.

:func:`topic_handlers` adds handlers to :class:`~brokerlet.actors.topic.TopicActor`'s table
(and wraps a few of its own); :class:`TopicOps` keeps one topic's part of their state:
terminate, unload, delete, subscription management, cursor moves, peeks and stats. Handlers
run on the topic's actor; they ask the topic's dispatchers (which never ask the topic back)
and may wait for a disk read of a single entry.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gevent
import pykka

from brokerlet.actors.errors import BrokerError
from brokerlet.actors.messages import (
    AckUpTo,
    AddProducer,
    Append,
    Appended,
    CancelRead,
    CloseConsumers,
    CreateSubscription,
    DeleteSubscription,
    EntriesRead,
    ExamineMessage,
    ExpireMessages,
    GetMarkDelete,
    GetMessage,
    GetPermitTotal,
    GetStats,
    Handlers,
    InternalStats,
    LastMessageId,
    ListSubscriptions,
    PeekMessage,
    ReadEntries,
    ReadIds,
    Receipt,
    ResetCursor,
    Seek,
    SkipEntries,
    SkipEntriesOf,
    Subscribe,
    SubscriptionClosed,
    TerminateTopic,
    TopicStats,
    TopicStatsPart,
    TopicTerminated,
    UnloadTopic,
    on_ops,
)
from brokerlet.storage._io import FileOps, write_file_atomically
from brokerlet.storage.ledger import Entry
from brokerlet.topicops import stats as stats_shape
from brokerlet.topicops.entries import StoredMessage, find_newest_at_or_before, read_entry, stored
from brokerlet.topicops.errors import (
    TopicOpError,
    message_not_found,
    subscription_not_found,
)
from brokerlet.topicops.nonpersistent import NonPersistentRule, is_non_persistent
from brokerlet.transport.protocol import pb

if TYPE_CHECKING:
    from brokerlet.actors.dispatcher import DispatcherActor
    from brokerlet.actors.topic import TopicActor

__all__ = ["TopicOps", "topic_handlers"]

log = logging.getLogger(__name__)

TERMINATED_FILE = "terminated"


def topic_handlers(existing: Handlers) -> Handlers:
    """The topic actor's table (``existing``) with the operations' handlers and checks added.

    Built once for the class; what varies per topic (termination, the non-persistent rule)
    is :meth:`TopicOps.handlers`.
    """
    add_producer = existing[AddProducer]
    subscribe = existing[Subscribe]
    closed = existing[SubscriptionClosed]
    raw_stats = existing[TopicStats]

    def on_add_producer(topic: TopicActor, message: Any) -> Any:
        if topic.ops.terminated_at is not None:
            raise BrokerError(pb.TopicTerminatedError, "Topic was already terminated")
        return add_producer(topic, message)

    def on_subscribe(topic: TopicActor, message: Any) -> Any:
        ops = topic.ops
        if ops.non_persistent:
            # No cursor to keep: a non-persistent subscription goes with its last consumer.
            message = dataclasses.replace(message, durable=False)
        dispatcher = subscribe(topic, message)
        if ops.rule is not None:
            permits = dispatcher.ask(GetPermitTotal())
            ops.rule.subscribed(message.subscription, dispatcher, permits)
        if ops.terminated_at is not None:
            dispatcher.tell(TopicTerminated(ops.terminated_at))
        return dispatcher

    def on_closed(topic: TopicActor, message: Any) -> Any:
        result = closed(topic, message)
        rule = topic.ops.rule
        if rule is not None and message.subscription not in topic.subscriptions:
            rule.unsubscribed(message.subscription)
        return result

    def stats_part(topic: TopicActor, message: Any) -> TopicStatsPart:
        part: TopicStatsPart = raw_stats(topic, message)
        ops = topic.ops
        drops: dict[str, tuple[int, float]] = {}
        if ops.rule is not None:
            drops = {name: ops.rule.dropped(name) for name in part.subscriptions}
        extra = {"terminated": ops.terminated_at is not None, "drops": drops}
        return dataclasses.replace(part, extra=extra)

    return {
        **existing,
        AddProducer: on_add_producer,
        Subscribe: on_subscribe,
        SubscriptionClosed: on_closed,
        TopicStats: stats_part,
        TerminateTopic: on_ops(TopicOps._terminate),
        UnloadTopic: on_ops(TopicOps._unload),
        CreateSubscription: on_ops(TopicOps._create_subscription),
        DeleteSubscription: on_ops(TopicOps._delete_subscription),
        ListSubscriptions: lambda topic, _m: sorted({*topic.subscriptions, *topic.saved}),
        SkipEntries: on_ops(TopicOps._skip),
        ResetCursor: on_ops(TopicOps._reset_cursor),
        ExpireMessages: on_ops(TopicOps._expire),
        PeekMessage: on_ops(TopicOps._peek),
        ExamineMessage: on_ops(TopicOps._examine),
        GetMessage: on_ops(TopicOps._get_message),
        InternalStats: on_ops(TopicOps._internal_stats),
        LastMessageId: on_ops(TopicOps._last_message_id),
    }


class TopicOps:
    """Topic operations on one topic actor's state."""

    def __init__(self, topic: TopicActor) -> None:
        self.t = topic
        self.non_persistent = is_non_persistent(topic.name)
        self.rule: NonPersistentRule | None = None
        if self.non_persistent:
            self.rule = NonPersistentRule(topic.ledger, self._reply_read)
        self.terminated_at: int | None = self._load_terminated()
        self.created_at = time.time()

    def handlers(self, table: Handlers) -> Handlers:
        """The class's ``table`` as this topic runs it: a copy where the topic differs."""
        if self.terminated_at is None and self.rule is None:
            return table
        own = dict(table)
        if self.terminated_at is not None:
            own[Append] = on_ops(TopicOps._refuse_append)
        if self.rule is not None:
            rule = self.rule
            append, cancel = table[Append], table[CancelRead]

            def on_append(topic: TopicActor, message: Any) -> Any:
                before = topic.ledger.last_entry_id
                result = append(topic, message)  # the in-memory ledger completes at once
                after = topic.ledger.last_entry_id
                if after > before:
                    got: list[Entry] = []
                    topic.ledger.read(before + 1, after - before, 0, _collect(got))
                    rule.appended(got)
                return result

            def on_cancel(topic: TopicActor, message: Any) -> Any:
                rule.cancel(message.subscription, message.read_id)
                return cancel(topic, message)

            own[Append] = on_append
            own[ReadEntries] = lambda _topic, message: rule.read_entries(message)
            own[ReadIds] = lambda _topic, message: rule.read_ids(message)
            own[CancelRead] = on_cancel
        return own

    def _reply_read(self, reply_to: Any, read_id: int, entries: list[Entry], replay: bool) -> None:
        reply_to.tell(EntriesRead(read_id, entries, replay=replay))

    # Termination.

    def _load_terminated(self) -> int | None:
        path = self._terminated_path()
        if path is None or self.t.ledger.new or not os.path.exists(path):
            return None
        with open(path, encoding="ascii") as file:
            return int(file.read().strip())

    def _terminated_path(self) -> str | None:
        directory = getattr(self.t.ledger, "directory", None)
        return None if directory is None else os.path.join(directory, TERMINATED_FILE)

    def _terminate(self, _message: TerminateTopic) -> tuple[int, int]:
        ledger = self.t.ledger
        if self.non_persistent:
            raise TopicOpError(405, "Termination of a non-persistent topic is not allowed")
        if self.terminated_at is None:
            self.terminated_at = ledger.last_entry_id
            path = self._terminated_path()
            if path is not None:
                data = f"{self.terminated_at}\n".encode()
                gevent.get_hub().threadpool.apply(
                    write_file_atomically, (FileOps(), path, data), {"sync": True}
                )
            log.info("%s: terminated at entry %d", self.t.name, self.terminated_at)
            # SENDs are refused from now on; until now appends paid nothing for the check.
            self.t._handlers = self.handlers(self.t._handlers)
            # PersistentTopic#terminate: producers are disconnected (they reconnect and are
            # refused with TopicTerminatedError); subscriptions learn the end.
            self._close_producers()
            for dispatcher in list(self.t.subscriptions.values()):
                dispatcher.tell(TopicTerminated(self.terminated_at))
        return ledger.ledger_id, self.terminated_at

    def _refuse_append(self, message: Any) -> None:
        receipts = [
            Receipt(
                sequence_id,
                highest,
                self.t.ledger.ledger_id,
                -1,
                pb.TopicTerminatedError,
                "Topic was already terminated",
            )
            for sequence_id, highest, _, _ in message.items
        ]
        message.reply_to.tell(Appended(message.producer_id, receipts))

    # Broker-initiated closes.

    def _close_producers(self) -> int:
        return self.t.close_producers()

    def _close_all_consumers(self) -> int:
        closed = 0
        for dispatcher in list(self.t.subscriptions.values()):
            try:
                closed += dispatcher.ask(CloseConsumers(), block=True)
            except pykka.ActorDeadError:
                continue
        return closed

    def _drop_subscription(self, name: str, *, forget_cursor: bool) -> None:
        dispatcher = self.t.subscriptions.get(name)
        if dispatcher is not None:
            # The same path as a subscription whose last consumer left.
            self.t.on_receive(SubscriptionClosed(name, dispatcher, deleted=forget_cursor))
        elif name in self.t.saved:
            del self.t.saved[name]
            self.t.mark_deletes.pop(name, None)
            if forget_cursor and self.t.cursors is not None:
                self.t.cursors.delete(name)
            self.t._trim()

    def _unload(self, _message: UnloadTopic) -> None:
        producers = self._close_producers()
        consumers = self._close_all_consumers()
        for name, dispatcher in list(self.t.subscriptions.items()):
            with_cursor = dispatcher.ask(GetStats(), block=True)["isDurable"]
            if not with_cursor:
                self._drop_subscription(name, forget_cursor=True)
        log.info(
            "%s: unloaded (%d producer(s), %d consumer(s) closed)",
            self.t.name,
            producers,
            consumers,
        )

    # Subscriptions.

    def _dispatcher(self, subscription: str) -> Any:
        """The subscription's dispatcher, opened from its stored cursor if it has none yet."""
        dispatcher = self.t.subscriptions.get(subscription)
        if dispatcher is not None:
            return dispatcher
        if subscription in self.t.saved:
            return self.t.on_receive(
                Subscribe(
                    subscription, pb.CommandSubscribe.Shared, True, pb.CommandSubscribe.Latest
                )
            )
        raise subscription_not_found(self.t.name, subscription)

    def _persistent_only(self, what: str) -> None:
        if self.non_persistent:
            raise TopicOpError(405, f"{what} on a non-persistent topic is not allowed")

    def _create_subscription(self, message: CreateSubscription) -> None:
        if self.non_persistent:
            raise TopicOpError(
                400, "Create subscription on non-persistent topic can only be done through client"
            )
        name = message.subscription
        if name in self.t.subscriptions or name in self.t.saved:
            raise TopicOpError(409, "Subscription already exists for topic")
        position = message.position
        initial = pb.CommandSubscribe.Latest
        start = None
        if position == "earliest":
            initial = pb.CommandSubscribe.Earliest
        elif isinstance(position, tuple):
            start = position
        self.t.on_receive(Subscribe(name, pb.CommandSubscribe.Shared, True, initial, start))

    def _delete_subscription(self, message: DeleteSubscription) -> None:
        name = message.subscription
        dispatcher = self._dispatcher(name)
        if not message.force and dispatcher.ask(CloseConsumers(only_if_idle=True)):
            # PersistentSubscription#delete: SubscriptionBusyException
            raise TopicOpError(412, "Subscription has active connected consumers")
        dispatcher.ask(CloseConsumers(forget_cursor=True))
        self._drop_subscription(name, forget_cursor=True)

    # Cursor moves.

    def _skip(self, message: SkipEntries) -> None:
        self._persistent_only("Skip messages")
        dispatcher = self._dispatcher(message.subscription)
        last = self.t.ledger.last_entry_id
        if message.count is None:
            dispatcher.ask(AckUpTo(last))
        else:
            dispatcher.ask(SkipEntriesOf(message.count, last))

    def _reset_cursor(self, message: ResetCursor) -> None:
        self._persistent_only("Reset cursor")
        dispatcher = self._dispatcher(message.subscription)
        ledger = self.t.ledger
        if message.message_id is not None:
            entry_id = self.t._start_of(message.message_id)
            if message.excluded and message.message_id[0] == ledger.ledger_id:
                entry_id = min(entry_id + 1, ledger.last_entry_id + 1)
        else:
            assert message.publish_time_ms is not None
            # PersistentSubscription#resetCursor(timestamp): the entry after the newest one
            # published at or before the time.
            entry_id = find_newest_at_or_before(ledger, message.publish_time_ms) + 1
        # As Pulsar's resetCursor: every consumer is disconnected (they reconnect and read
        # from the new position).
        dispatcher.ask(Seek(entry_id, _NO_REQUESTER))

    def _expire(self, message: ExpireMessages) -> None:
        self._persistent_only("Expire messages")
        if message.subscription is None:
            dispatchers = [
                self._dispatcher(n) for n in sorted({*self.t.subscriptions, *self.t.saved})
            ]
        else:
            dispatchers = [self._dispatcher(message.subscription)]
        # PersistentMessageExpiryMonitor: mark-delete up to the newest expired entry.
        cutoff = int(time.time() * 1000) - message.seconds * 1000
        newest = find_newest_at_or_before(self.t.ledger, cutoff)
        if newest >= self.t.ledger.first_entry_id:
            for dispatcher in dispatchers:
                dispatcher.ask(AckUpTo(newest, expiry=True))

    # Reading single messages.

    def _message_at(self, entry_id: int) -> StoredMessage:
        entry = read_entry(self.t.ledger, entry_id)
        if entry is None:
            raise message_not_found()
        return stored(entry)

    def _peek(self, message: PeekMessage) -> StoredMessage:
        self._persistent_only("Peek messages")
        mark_delete = self._dispatcher(message.subscription).ask(GetMarkDelete())
        # PersistentSubscription#peekNthMessage: the n-th entry after the mark-delete position,
        # individually acknowledged ones included.
        return self._message_at(
            max(mark_delete, self.t.ledger.first_entry_id - 1) + message.position
        )

    def _examine(self, message: ExamineMessage) -> StoredMessage:
        self._persistent_only("Examine messages")
        ledger = self.t.ledger
        if message.initial_position == "earliest":
            entry_id = ledger.first_entry_id + message.position - 1
        else:
            entry_id = ledger.last_entry_id - message.position + 1
        return self._message_at(entry_id)

    def _get_message(self, message: GetMessage) -> StoredMessage:
        self._persistent_only("Get message by id")
        if message.ledger_id != self.t.ledger.ledger_id:
            raise message_not_found()
        return self._message_at(message.entry_id)

    # Stats.

    def _last_message_id(self, _message: LastMessageId) -> dict[str, int]:
        ledger = self.t.ledger
        return {"ledgerId": ledger.ledger_id, "entryId": ledger.last_entry_id, "partitionIndex": -1}

    def _internal_stats(
        self, _message: InternalStats
    ) -> tuple[dict[str, Any], dict[str, pykka.ActorRef[DispatcherActor]]]:
        """The ledger's part (stored cursors included) and the dispatchers to ask for the
        open cursors: the caller asks them, so this actor never waits on a dispatcher."""
        shaped = stats_shape.internal_stats(
            self.t.ledger,
            {},
            saved={n: s[0] for n, s in self.t.saved.items()},
            msg_in=self.t.msg_in,
            terminated=self.terminated_at is not None,
            created_at=self.created_at,
        )
        return shaped, dict(self.t.subscriptions)


def _collect(into: list[Entry]) -> Callable[[list[Entry] | BaseException], None]:
    def done(result: list[Entry] | BaseException) -> None:
        if not isinstance(result, BaseException):
            into.extend(result)

    return done


class _NoRequester:
    """A Seek requester that is no connection: every consumer is closed by the broker."""


_NO_REQUESTER: Any = _NoRequester()
