"""The dispatcher's part of the topic operations: cursor moves and broker-initiated closes.

:class:`SubscriptionOps` adds handlers to one dispatcher (its actor runs them, so they touch
the dispatcher's state like its own handlers do). Skips and expiry acknowledge entries as a
consumer's acks would; closes send CLOSE_CONSUMER through each consumer's connection actor,
and the client reconnects, as after a Pulsar topic unload.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import brokerlet.actors.dispatcher as dispatcher_mod
from brokerlet.actors.stats import Rate
from brokerlet.topicops.messages import (
    AckDropped,
    AckUpTo,
    CloseConsumers,
    EndOfTopicReached,
    GetPermitTotal,
    SkipEntriesOf,
    TopicTerminated,
)

if TYPE_CHECKING:
    from brokerlet.actors.consumer import Consumer
    from brokerlet.actors.dispatcher import Dispatcher

__all__ = ["SubscriptionOps"]

log = logging.getLogger(__name__)


class SubscriptionOps:
    """Topic operations on one dispatcher's state."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.d = dispatcher
        self.terminated_at: int | None = None  # the topic's last entry once terminated
        self._told_end: set[Consumer] = set()  # consumers sent REACHED_END_OF_TOPIC
        self._existing: dict[type, Callable[[Any], Any]] = {}  # the dispatcher's handlers
        self.expired = 0  # entries acknowledged by expiry
        self.last_expire_ms = 0
        self._expiry_rate = Rate()

    def handlers(
        self, existing: dict[type, Callable[[Any], Any]]
    ) -> dict[type, Callable[..., Any]]:
        add_consumer = existing[dispatcher_mod.AddConsumer]
        get_stats = existing[dispatcher_mod.GetStats]
        self._existing = existing

        def stats_with_expiry(message: Any) -> Any:
            result = get_stats(message)
            result["totalMsgExpired"] = self.expired
            result["lastExpireTimestamp"] = self.last_expire_ms
            result["msgRateExpired"] = self._expiry_rate.sample(self.expired)
            return result

        def add_then_check(message: Any) -> Any:
            result = add_consumer(message)
            self._check_end()
            return result

        return {
            dispatcher_mod.AddConsumer: add_then_check,
            dispatcher_mod.GetStats: stats_with_expiry,
            AckUpTo: self._ack_up_to,
            AckDropped: self._ack_dropped,
            SkipEntriesOf: self._skip,
            CloseConsumers: self._close_consumers,
            TopicTerminated: self._terminated,
            GetPermitTotal: lambda _: self.d.total_permits,
        }

    # Cursor moves.

    def _ack_up_to(self, message: AckUpTo) -> None:
        d = self.d
        upto = message.entry_id
        if message.expiry:
            # PersistentMessageExpiryMonitor counts the entries it marks deleted.
            newly = sum(
                1 for e in range(d.cursor.mark_delete + 1, upto + 1) if not d.cursor.is_acked(e)
            )
            self.expired += newly
            self.last_expire_ms = int(time.time() * 1000)
        for entry_id in [e for e in d.pending_owner if e <= upto]:
            d._forget(entry_id)
        for entry_id in d.replay.up_to(upto):
            d._forget(entry_id)
        self._moved(d.cursor.ack_cumulative(upto))

    def _ack_dropped(self, message: AckDropped) -> None:
        d = self.d
        moved = False
        for entry_id in message.entry_ids:
            moved = d.cursor.ack(entry_id) or moved
        if moved:
            d.topic.tell(dispatcher_mod.MarkDeleteMoved(d.name, d.cursor.mark_delete))

    def _skip(self, message: SkipEntriesOf) -> int:
        """Acknowledge the next ``count`` unacknowledged entries; answers how many."""
        d = self.d
        skipped = 0
        moved = False
        entry_id = d.cursor.mark_delete
        while skipped < message.count and entry_id < message.last_entry_id:
            entry_id += 1
            if d.cursor.is_acked(entry_id):
                continue
            d._forget(entry_id)
            moved = d.cursor.ack(entry_id) or moved
            skipped += 1
        self._moved(moved)
        return skipped

    def _moved(self, moved: bool) -> None:
        d = self.d
        if moved:
            d.topic.tell(dispatcher_mod.MarkDeleteMoved(d.name, d.cursor.mark_delete))
        d._cursor_changed()
        if d.read_position <= d.cursor.mark_delete:
            d.read_position = d.cursor.mark_delete + 1
        self._check_end()
        d.gate.request()

    # Broker-initiated closes.

    def _close_consumers(self, message: CloseConsumers) -> int:
        """CLOSE_CONSUMER to every consumer; their unacked entries come again on reconnect."""
        d = self.d
        closed = list(d.consumers)
        if message.only_if_idle and closed:
            return len(closed)
        if message.forget_cursor:
            d._cursor_dirty = False
            d.cursor_store = None
        for consumer in closed:
            consumer.detach()
            consumer.pending.clear()
            consumer.unacked = 0
        d.consumers.clear()
        d.active = None
        d.pending_owner.clear()
        d.unacked = 0
        d.blocked_on_unacked = False
        d.redelivery_counts.clear()
        d._rewind()
        for consumer in closed:
            if consumer.connection.actor is not None:
                consumer.connection.actor.tell(dispatcher_mod.ConsumerClosedByBroker(consumer))
        if closed:
            log.info("%s: closed %d consumer(s)", d, len(closed))
        return len(closed)

    # Termination.

    def _terminated(self, message: TopicTerminated) -> None:
        if self.terminated_at is None:
            # From now on every ACK may reach the end; until then ACKs pay nothing for it.
            ack = self._existing[dispatcher_mod.Ack]

            def ack_then_check(ack_message: Any) -> Any:
                result = ack(ack_message)
                self._check_end()
                return result

            self._existing[dispatcher_mod.Ack] = ack_then_check
        self.terminated_at = message.last_entry_id
        self._check_end()

    def _check_end(self) -> None:
        """Consumers of a terminated topic that acknowledged everything are told so.

        As Pulsar's dispatchers do once there is no backlog (Consumer#reachedEndOfTopic); the
        connection sends REACHED_END_OF_TOPIC only to clients of protocol v9 or later.
        """
        if self.terminated_at is None or self.d.cursor.mark_delete < self.terminated_at:
            return
        for consumer in self.d.consumers:
            self._tell_end(consumer)

    def _tell_end(self, consumer: Consumer) -> None:
        if consumer in self._told_end or consumer.connection.actor is None:
            return
        self._told_end.add(consumer)
        consumer.connection.actor.tell(EndOfTopicReached(consumer))
