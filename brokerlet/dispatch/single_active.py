"""Exclusive and Failover: one active consumer gets every entry.

Exclusive refuses a second consumer with ConsumerBusy. Failover makes the consumer with the
lowest priority level, then the lowest name, active (on a non-partitioned topic Pulsar hashes
consumers onto a ring instead; a sorted pick is deterministic, see docs/architecture.md); when
a new consumer takes over, the old active consumer's unacked entries move to it.
"""

from __future__ import annotations

from collections.abc import Sequence

from brokerlet.actors.errors import BrokerError
from brokerlet.dispatch.consumer import Consumer
from brokerlet.dispatch.delivery import DeliveryBook
from brokerlet.dispatch.strategy import EXCLUSIVE, InOrderChunks

__all__ = ["SingleActiveStrategy"]


class SingleActiveStrategy(InOrderChunks):
    def __init__(self, book: DeliveryBook, sub_type: int) -> None:
        super().__init__(book, sub_type)
        self.active: Consumer | None = None

    def add(self, consumer: Consumer) -> None:
        super().add(consumer)
        if self.sub_type == EXCLUSIVE and self.book.consumers:
            raise BrokerError.consumer_busy(
                f"Exclusive consumer is already connected to subscription {consumer.subscription!r}"
            )

    def membership_changed(self) -> Consumer | None:
        previous = self.active
        consumers = self.book.consumers
        self.active = min(consumers, key=lambda c: (c.priority, c.name), default=None)
        if previous is not None and previous is not self.active and previous in consumers:
            return previous  # its unacked entries move to the new active consumer
        return None

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
