"""Exclusive and Failover: one active consumer gets every entry.

Exclusive refuses a second consumer with ConsumerBusy. Failover ranks the consumers by
priority level, then name, as Pulsar's ``AbstractDispatcherSingleActiveConsumer`` does. A
partition of a partitioned topic makes the consumer at its index (modulo how many share the
highest level) active, so the partitions spread over the consumers; any other topic makes the
first active (Pulsar hashes consumers onto a ring there instead; a sorted pick is
deterministic, see docs/architecture.md). When a new consumer takes over, the old active
consumer's unacked entries move to it.
"""

from __future__ import annotations

from collections.abc import Sequence

from brokerlet.actors.errors import BrokerError
from brokerlet.dispatch.consumer import Consumer
from brokerlet.dispatch.delivery import DeliveryBook
from brokerlet.dispatch.strategy import EXCLUSIVE, FAILOVER, InOrderChunks

__all__ = ["SingleActiveStrategy"]


class SingleActiveStrategy(InOrderChunks):
    def __init__(self, book: DeliveryBook, sub_type: int, partition: int = -1) -> None:
        """``partition``: the topic's index in its partitioned topic, or -1 for none."""
        super().__init__(book, sub_type)
        self.partition = partition
        self.active: Consumer | None = None
        self._announced: Consumer | None = None  # the active consumer everyone was told of

    def add(self, consumer: Consumer) -> None:
        super().add(consumer)
        if self.sub_type == EXCLUSIVE and self.book.consumers:
            raise BrokerError.consumer_busy(
                f"Exclusive consumer is already connected to subscription {consumer.subscription!r}"
            )

    def membership_changed(self) -> Consumer | None:
        previous = self.active
        consumers = self.book.consumers
        self.active = self._pick(consumers)
        if previous is not None and previous is not self.active and previous in consumers:
            return previous  # its unacked entries move to the new active consumer
        return None

    def _pick(self, consumers: Sequence[Consumer]) -> Consumer | None:
        if not consumers:
            return None
        ranked = sorted(consumers, key=lambda c: (c.priority, c.name))
        if self.partition < 0:
            return ranked[0]
        highest = ranked[0].priority
        return ranked[self.partition % sum(1 for c in ranked if c.priority == highest)]

    def active_notices(self, added: Consumer | None) -> list[tuple[Consumer, bool]]:
        # As Pulsar's AbstractDispatcherSingleActiveConsumer: a new pick is told to every
        # consumer; a consumer joining without a change hears who is active.
        if self.sub_type != FAILOVER:
            return []
        active = self.active
        if active is not self._announced:
            self._announced = active
            return [(c, c is active) for c in self.book.consumers]
        if added is not None:
            return [(added, added is active)]
        return []

    def candidates(self) -> Sequence[Consumer]:
        return () if self.active is None else (self.active,)

    def chunk(self, count: int) -> int:
        return count

    def next_consumer(self) -> Consumer | None:
        active = self.active
        if active is not None and self.book.available(active):
            return active
        return None

    def is_active(self, consumer: Consumer) -> bool:
        return consumer is self.active
