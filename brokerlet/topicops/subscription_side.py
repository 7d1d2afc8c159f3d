"""The dispatcher's part of the topic operations: cursor moves and end of topic.

:func:`subscription_handlers` adds handlers to the dispatcher's table and :class:`SubscriptionOps`
keeps one subscription's part of their state (its actor runs them, so they touch the
subscription's state like the dispatcher's own handlers do). Skips and expiry acknowledge
entries through the delivery book, as a consumer's acks would. Broker-initiated closes are the
dispatcher's own ``CloseConsumers``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from brokerlet.actors.messages import (
    Ack,
    AckDropped,
    AckUpTo,
    AddConsumer,
    EndOfTopicReached,
    ExpireUpTo,
    GetPermitTotal,
    Handlers,
    MarkDeleteMoved,
    SkipEntriesOf,
    TopicTerminated,
    on_ops,
)
from brokerlet.actors.supervision import tell_quietly

if TYPE_CHECKING:
    from brokerlet.actors.dispatcher import Dispatcher
    from brokerlet.dispatch.consumer import Consumer

__all__ = ["SubscriptionOps", "subscription_handlers"]

log = logging.getLogger(__name__)


def subscription_handlers(existing: Handlers) -> Handlers:
    """The dispatcher's table (``existing``) with the operations' handlers added; built once
    for the class. Expiry is counted in one place, the dispatcher's ExpiryCounter (issue 14's
    ExpireUpTo): message TTL, backlog eviction and the admin operation share it."""
    add_consumer = existing[AddConsumer]

    def add_then_check(dispatcher: Dispatcher, message: Any) -> Any:
        result = add_consumer(dispatcher, message)
        dispatcher.ops._check_end()
        return result

    return {
        **existing,
        AddConsumer: add_then_check,
        AckUpTo: on_ops(SubscriptionOps._ack_up_to),
        AckDropped: on_ops(SubscriptionOps._ack_dropped),
        SkipEntriesOf: on_ops(SubscriptionOps._skip),
        TopicTerminated: on_ops(SubscriptionOps._terminated),
        GetPermitTotal: lambda d, _message: d.total_permits,
    }


class SubscriptionOps:
    """Topic operations on one dispatcher's subscription."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.d = dispatcher
        self.terminated_at: int | None = None  # the topic's last entry once terminated
        self._told_end: set[Consumer] = set()  # consumers sent REACHED_END_OF_TOPIC

    # Cursor moves.

    def _ack_up_to(self, message: AckUpTo) -> None:
        d = self.d
        upto = message.entry_id
        if upto <= d.cursor.mark_delete:
            return
        if message.expiry:
            # One expiry path: the dispatcher's ExpireUpTo counts what it marks deleted
            # (PersistentMessageExpiryMonitor) and tells the topic.
            d._expire_up_to(ExpireUpTo(upto))
            return
        self._moved(d.book.ack([upto], cumulative=True))

    def _ack_dropped(self, message: AckDropped) -> None:
        if message.entry_ids:
            self._moved(self.d.book.ack(message.entry_ids, cumulative=False))

    def _skip(self, message: SkipEntriesOf) -> int:
        """Acknowledge the next ``count`` unacknowledged entries; answers how many."""
        cursor = self.d.cursor
        skipped: list[int] = []
        entry_id = cursor.mark_delete
        while len(skipped) < message.count and entry_id < message.last_entry_id:
            entry_id += 1
            if not cursor.is_acked(entry_id):
                skipped.append(entry_id)
        if skipped:
            self._moved(self.d.book.ack(skipped, cumulative=False))
        return len(skipped)

    def _moved(self, moved: bool) -> None:
        d = self.d
        if moved:
            d.topic.tell(MarkDeleteMoved(d.name, d.cursor.mark_delete))
        d._cursor_changed()
        if d.read_position <= d.cursor.mark_delete:
            d.read_position = d.cursor.mark_delete + 1
        self._check_end()
        d.gate.request()

    # Termination.

    def _terminated(self, message: TopicTerminated) -> None:
        if self.terminated_at is None:
            # From now on every ACK may reach the end; until then ACKs pay nothing for it.
            d = self.d
            ack = d._handlers[Ack]

            def ack_then_check(dispatcher: Dispatcher, ack_message: Any) -> Any:
                result = ack(dispatcher, ack_message)
                dispatcher.ops._check_end()
                return result

            d._handlers = {**d._handlers, Ack: ack_then_check}
        self.terminated_at = message.last_entry_id
        self._check_end()

    def _check_end(self) -> None:
        """Consumers of a terminated topic that acknowledged everything are told so.

        As Pulsar's dispatchers do once there is no backlog (Consumer#reachedEndOfTopic); the
        connection sends REACHED_END_OF_TOPIC only to clients that can take it.
        """
        if self.terminated_at is None or self.d.cursor.mark_delete < self.terminated_at:
            return
        for consumer in self.d.book.consumers:
            if consumer not in self._told_end:
                self._told_end.add(consumer)
                tell_quietly(consumer.connection.actor, EndOfTopicReached(consumer))
