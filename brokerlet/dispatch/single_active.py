"""Exclusive and Failover: one active consumer gets every entry.

Exclusive refuses a second consumer with ConsumerBusy. Failover picks its active consumer as
Pulsar's ``AbstractDispatcherSingleActiveConsumer`` does: the consumers are ranked by
priority level, then name, and only the highest level's take part. A partition of a
partitioned topic makes the one at its index modulo their count active, so the partitions
spread over the consumers; any other topic (and every partition, with
``active_consumer_failover_consistent_hashing``) puts each of them on a hash ring
(`RING_REPLICAS` points each) and makes the owner of the first point at or after the
topic name's hash active, so the topics of a namespace spread too. When a new consumer
takes over, the old active consumer's unacked entries move to it. Failover then holds
every delivery for ``active_consumer_failover_delay_time_millis`` (the first consumer's too,
as Pulsar's ``scheduleReadOnActiveConsumer`` does), so acks still on their way from the old
active consumer land before its entries go out again; the change is announced when the
hold ends.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import NamedTuple

from brokerlet.actors.errors import BrokerError
from brokerlet.dispatch.consumer import Consumer
from brokerlet.dispatch.delivery import DeliveryBook
from brokerlet.dispatch.strategy import EXCLUSIVE, FAILOVER, InOrderChunks, WakeAfter
from brokerlet.keyshared.hashing import sticky_key_hash

__all__ = ["NO_PLACEMENT", "RING_REPLICAS", "Placement", "SingleActiveStrategy", "ring_pick"]

RING_REPLICAS = 100
"""Ring points per consumer (Pulsar's ``CONSUMER_CONSISTENT_HASH_REPLICAS``)."""


class Placement(NamedTuple):
    """What Failover's pick needs to know of its topic; fixed for the topic's life."""

    partition: int = -1
    """The topic's index in its partitioned topic; -1 for none."""
    topic_hash: int = 0
    """Murmur3 (31 bits) of the topic's full name: where the ring is read."""
    ring: bool = True
    """Whether the ring picks (else the partition index does)."""

    @classmethod
    def of(cls, topic: str, partition: int, consistent_hashing: bool = False) -> Placement:
        """The placement of ``topic`` (its full name) at ``partition`` (-1: none);
        ``consistent_hashing`` is ``active_consumer_failover_consistent_hashing``."""
        ring = partition < 0 or consistent_hashing
        return cls(partition, sticky_key_hash(topic.encode()), ring)


NO_PLACEMENT = Placement()
"""A topic of no partition whose name hashes to 0 (tests build strategies without topics)."""


def ring_pick(names: Sequence[str], topic_hash: int) -> int:
    """The index in ``names`` of the consumer that owns ``topic_hash`` on the ring.

    Each name gets the points ``hash(name + str(j))`` for ``j`` below `RING_REPLICAS` (the
    hash Key_Shared uses); the first point at or after ``topic_hash``, else the lowest, is
    the owner's. Of two names on one point the later in ``names`` keeps it.
    """
    owners: dict[int, int] = {}
    for index, name in enumerate(names):
        for replica in range(RING_REPLICAS):
            owners[sticky_key_hash(f"{name}{replica}".encode())] = index
    points = sorted(owners)
    return owners[points[bisect_left(points, topic_hash) % len(points)]]


class SingleActiveStrategy(InOrderChunks):
    def __init__(
        self,
        book: DeliveryBook,
        sub_type: int,
        placement: Placement = NO_PLACEMENT,
        *,
        hold_ms: int = 0,
        wake_after: WakeAfter | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``hold_ms``: Failover's hold after each change of the active consumer;
        ``wake_after`` asks the dispatcher for a pass once it is over; ``clock`` times the
        hold (monotonic seconds)."""
        super().__init__(book, sub_type)
        self.placement = placement
        self.active: Consumer | None = None
        self._announced: Consumer | None = None  # the active consumer everyone was told of
        self.hold_ms = hold_ms if sub_type == FAILOVER and wake_after is not None else 0
        self._wake_after = wake_after
        self._clock = clock
        self._held_until = 0.0  # monotonic end of the last hold; 0.0 for none yet
        self._changed = False  # whether the last membership change moved the pick

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
        self._changed = self.active is not previous
        if self._changed and self.active is not None and self.hold_ms and not self.holding:
            self._held_until = self._clock() + self.hold_ms / 1000
            self._wake_at_hold_end()
        if previous is not None and self._changed and previous in consumers:
            return previous  # its unacked entries move to the new active consumer
        return None

    @property
    def holding(self) -> bool:
        """Whether Failover's hold after a change is on: nothing goes out meanwhile."""
        return self._held_until != 0.0 and self._clock() < self._held_until

    @property
    def _waiting(self) -> bool:
        """Whether delivery waits: the hold is on, or over with its change not yet told (a
        pass before the timer's must not deliver ahead of the ACTIVE_CONSUMER_CHANGE)."""
        return self.holding or (self.hold_ms != 0 and self.active is not self._announced)

    def _wake_at_hold_end(self) -> None:
        # At least 1 ms: the wake-up must come by the timer, whose pass announces the change.
        if self._wake_after is not None:
            self._wake_after(max(1.0, (self._held_until - self._clock()) * 1000))

    def _pick(self, consumers: Sequence[Consumer]) -> Consumer | None:
        if not consumers:
            return None
        ranked = sorted(consumers, key=lambda c: (c.priority, c.name))
        highest = ranked[0].priority
        count = sum(1 for c in ranked if c.priority == highest)
        if count == 1:
            return ranked[0]
        placement = self.placement
        if placement.ring:
            return ranked[ring_pick([c.name for c in ranked[:count]], placement.topic_hash)]
        return ranked[placement.partition % count]

    def active_notices(self, added: Consumer | None) -> list[tuple[Consumer, bool]]:
        # As Pulsar's AbstractDispatcherSingleActiveConsumer: a new pick is told to every
        # consumer; a consumer joining without a change hears who is active.
        if self.sub_type != FAILOVER:
            return []
        active = self.active
        if self.holding:  # a change is told when the hold ends; a joiner that made none, now
            return [(added, added is active)] if added is not None and not self._changed else []
        if active is not self._announced:
            self._announced = active
            return [(c, c is active) for c in self.book.consumers]
        if added is not None:
            return [(added, added is active)]
        return []

    def candidates(self) -> Sequence[Consumer]:
        if self.active is None:
            return ()
        if self._waiting:
            self._wake_at_hold_end()  # this pass found the hold on: the next comes at its end
            return ()
        return (self.active,)

    def chunk(self, count: int) -> int:
        return count

    def next_consumer(self) -> Consumer | None:
        active = self.active
        if active is not None and self.book.available(active) and not self._waiting:
            return active
        return None

    def is_active(self, consumer: Consumer) -> bool:
        return consumer is self.active
