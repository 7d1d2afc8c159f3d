"""Shared: round-robin over the consumers of the lowest priority level that can take entries.

As Pulsar's ``PersistentDispatcherMultipleConsumers``: each consumer in turn gets a chunk of up
to ``dispatcher_max_round_robin_batch_size`` entries, within its permits; a consumer at a
higher ``priority_level`` number only gets entries while no consumer of a lower level can
take any. Usually every consumer is at level 0.
"""

from __future__ import annotations

from collections.abc import Sequence

from brokerlet.dispatch.consumer import Consumer
from brokerlet.dispatch.delivery import DeliveryBook
from brokerlet.dispatch.strategy import SHARED, InOrderChunks

__all__ = ["SharedStrategy"]


class SharedStrategy(InOrderChunks):
    delays_delivery = True
    reads_after_dispatch = True

    def __init__(self, book: DeliveryBook, chunk: int) -> None:
        super().__init__(book, SHARED)
        self._chunk = chunk
        self._next_index = 0  # round-robin position

    def candidates(self) -> Sequence[Consumer]:
        return self.book.consumers

    def chunk(self, count: int) -> int:
        return self._chunk

    def next_consumer(self) -> Consumer | None:
        consumers = self.book.consumers
        available = self.book.available
        size = len(consumers)
        level = None
        if consumers and consumers[0].priority != consumers[-1].priority:
            level = min((c.priority for c in consumers if available(c)), default=None)
            if level is None:
                return None
        start = self._next_index
        for step in range(size):
            index = (start + step) % size
            consumer = consumers[index]
            if (level is None or consumer.priority == level) and available(consumer):
                self._next_index = (index + 1) % size
                return consumer
        return None

    def is_active(self, consumer: Consumer) -> bool:
        return True
