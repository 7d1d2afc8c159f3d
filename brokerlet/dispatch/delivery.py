"""Delivery bookkeeping of one subscription: who holds what, how often it went out, limits.

:class:`DeliveryBook` keeps the subscription's consumers, each entry's pending owner, the
replay set, redelivery counts and the unacked-message limits (Pulsar's
``maxUnackedMessagesPerConsumer`` and ``...PerSubscription``: a consumer or subscription at
its limit is blocked until acks bring it to half). It is the dispatcher actor's state and is
only touched there; the one exception is each consumer's permit balance, which has its own lock
(:mod:`brokerlet.dispatch.consumer`).

The selection strategy learns about each batch it hands out and each entry that comes back
(acked or requeued) through :class:`EntryHooks`; Key_Shared uses them for its hashes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from itertools import repeat
from typing import Any, Protocol

from brokerlet.config import Settings
from brokerlet.dispatch.consumer import Consumer
from brokerlet.dispatch.replay import ReplaySet
from brokerlet.storage.cursor import Cursor
from brokerlet.storage.ledger import Entry

__all__ = ["DeliveryBook", "EntryHooks"]


class EntryHooks(Protocol):
    """What a selection strategy is told about entries changing hands."""

    tracks_entries: bool  # False: the call below does nothing and is skipped

    def released(self, consumer: Consumer, entry_id: int, *, closing: bool) -> int:
        """``consumer``'s pending ``entry_id`` was sent back; returns its key hash (0: none),
        which the replay set keeps."""
        ...

    def acked(self, entry_ids: list[int], owners: Mapping[int, Consumer]) -> None:
        """``entry_ids`` were acknowledged; those in ``owners`` were pending there."""
        ...


class _NoHooks:
    tracks_entries = False

    def released(self, consumer: Consumer, entry_id: int, *, closing: bool) -> int:
        return 0

    def acked(self, entry_ids: list[int], owners: Mapping[int, Consumer]) -> None:
        pass


def _nothing() -> None:
    pass


class DeliveryBook:
    """Pending entries per consumer, the replay set, redelivery counts and unacked limits.

    Args:
        settings: the broker's settings (the unacked limits).
        cursor: the subscription's acknowledgements.
        durable: limits apply to durable subscriptions only, as in Pulsar.
        writability_gating: whether a consumer over its connection's high watermark is
            unavailable (always, except to show what happens without it).
    """

    def __init__(
        self, settings: Settings, cursor: Cursor, *, durable: bool, writability_gating: bool
    ) -> None:
        self.cursor = cursor
        self.durable = durable
        self.consumers: list[Consumer] = []  # by priority level, joining order within a level
        self.replay = ReplaySet()
        self.pending_owner: dict[int, Consumer] = {}
        self.redelivery_counts: dict[int, int] = {}
        self.unacked = 0  # the subscription's unacked messages, all consumers together
        self.blocked_on_unacked = False
        self.msg_out = 0
        self.bytes_out = 0
        self.hooks: EntryHooks = _NoHooks()
        self.wake: Callable[[], object] = _nothing  # the dispatcher's read request
        limit = settings.max_unacked_messages_per_consumer
        self._consumer_limit = limit if limit > 0 and durable else 0
        limit = settings.max_unacked_messages_per_subscription
        self._subscription_limit = limit if limit > 0 and durable else 0
        self._gating = writability_gating

    # Who can take entries.

    def available(self, consumer: Consumer) -> bool:
        """Can take entries now: permits left, not blocked on unacked messages, accepting
        writes (see `Consumer.accepting`), not closed by its client (`Consumer.closed`)."""
        return (
            consumer.permits > 0
            and not consumer.blocked
            and (consumer.accepting or not self._gating)
            and not consumer.closed
        )

    def budget(self, consumer: Consumer) -> int:
        """Messages ``consumer`` may get now: its permits, capped by its unacked limit."""
        if self._consumer_limit:
            return min(consumer.permits, self._consumer_limit - consumer.unacked)
        return consumer.permits

    def budgets(self) -> dict[Consumer, int]:
        """Effective permits of every consumer that can take entries now."""
        return {c: self.budget(c) for c in self.consumers if self.available(c)}

    # Handing out.

    def record(self, consumer: Consumer, batch: list[Entry], messages: int) -> list[int]:
        """``batch`` (``messages`` in all) goes to ``consumer``: charge it, and return each
        entry's redelivery count."""
        owner = self.pending_owner
        pending = consumer.pending
        size = 0
        # Compiled, an id unpacked as an int would be boxed anew (allocated) for each dict;
        # typed Any, it stays the object the entry holds.
        entry_id: Any
        # An Entry's fields unpacked at once: an attribute read is a descriptor call.
        for _, entry_id, data, _, num_messages, _ in batch:
            owner[entry_id] = consumer
            pending[entry_id] = num_messages
            size += len(data)
        counts = self.redelivery_counts
        if counts:
            redelivery = [counts.get(entry.entry_id, 0) for entry in batch]
        else:
            redelivery = [0] * len(batch)  # nothing was ever redelivered
        consumer.unacked += messages
        consumer.msg_out += messages
        consumer.bytes_out += size
        per_entry = messages / len(batch)
        average = consumer.avg_messages_per_entry
        # As Pulsar's Consumer: the first delivery sets it, later ones weigh a tenth.
        consumer.avg_messages_per_entry = (
            per_entry if average < 1 else average * 0.9 + per_entry * 0.1
        )
        consumer.debit(messages)
        if self._consumer_limit and consumer.unacked >= self._consumer_limit:
            consumer.block()
        self._unacked_changed(messages)
        self.msg_out += messages
        self.bytes_out += size
        return redelivery

    # Coming back.

    def requeue(
        self, consumer: Consumer, entry_id: int, *, closing: bool, count_redelivery: bool
    ) -> None:
        """Put ``consumer``'s pending ``entry_id`` back in the replay set (the caller settles
        the consumer's unacked count)."""
        del self.pending_owner[entry_id]
        hooks = self.hooks
        key_hash = (
            hooks.released(consumer, entry_id, closing=closing) if hooks.tracks_entries else 0
        )
        self.replay.add(entry_id, key_hash)
        if count_redelivery:
            self.redelivery_counts[entry_id] = self.redelivery_counts.get(entry_id, 0) + 1

    def release_pending(
        self, consumer: Consumer, *, count_redelivery: bool = True, closing: bool = False
    ) -> None:
        """Every entry pending at ``consumer`` goes back to the replay set."""
        self._unacked_changed(-consumer.unacked)
        for entry_id in consumer.pending:
            self.requeue(consumer, entry_id, closing=closing, count_redelivery=count_redelivery)
        consumer.pending.clear()
        consumer.unacked = 0
        consumer.unblock()

    def redeliver(self, consumer: Consumer, entry_ids: Iterable[int]) -> None:
        """The consumer asked for these of its pending entries again."""
        for entry_id in entry_ids:
            if self.pending_owner.get(entry_id) is consumer:
                self._consumer_acked(consumer, consumer.pending.pop(entry_id))
                self.requeue(consumer, entry_id, closing=False, count_redelivery=True)

    def ack(self, entry_ids: list[int], *, cumulative: bool) -> bool:
        """Acknowledge entries (cumulatively: everything up to the highest); True if the
        mark-delete position moved."""
        cursor = self.cursor
        if cumulative:
            upto = max(entry_ids)
            self._forget([e for e in self.pending_owner if e <= upto])
            self._forget(self.replay.up_to(upto))
            return cursor.ack_cumulative(upto)
        self._forget(entry_ids)
        return cursor.ack_many(entry_ids)

    def partially_acked(self, entry_id: int, left: int) -> None:
        """Members of a pending batch were acked: it now counts ``left`` unacked messages."""
        owner = self.pending_owner.get(entry_id)
        if owner is None:
            return
        charged = owner.pending.get(entry_id, 0)
        if left < charged:
            owner.pending[entry_id] = left
            self._consumer_acked(owner, charged - left)

    def charged(self, entry_id: int) -> int | None:
        """Messages ``entry_id`` counts while pending, or None if it is not pending."""
        owner = self.pending_owner.get(entry_id)
        return None if owner is None else owner.pending.get(entry_id)

    def _forget(self, entry_ids: list[int]) -> None:
        """Acknowledged entries leave the pending and replay sets; each owner's unacked
        count is settled once for all of its entries (an ACK carries many)."""
        owners = self.pending_owner
        if self.hooks.tracks_entries:
            self.hooks.acked(entry_ids, owners)
        popped = list(map(owners.pop, entry_ids, repeat(None)))
        only = popped[0] if popped else None
        settled: dict[Consumer, int] = {}
        if only is not None and popped.count(only) == len(popped):
            # Nearly every ACK: its ids were all pending at the consumer that sent it, so
            # they are settled in C-level loops.
            settled[only] = sum(map(only.pending.pop, entry_ids, repeat(0)))
        else:
            for entry_id, owner in zip(entry_ids, popped, strict=True):
                if owner is not None:
                    settled[owner] = settled.get(owner, 0) + owner.pending.pop(entry_id, 0)
        replay = self.replay
        if replay:
            for entry_id in entry_ids:
                replay.discard(entry_id)
        counts = self.redelivery_counts
        if counts:
            for entry_id in entry_ids:
                counts.pop(entry_id, None)
        for owner, messages in settled.items():
            self._consumer_acked(owner, messages)

    def forget_all(self) -> None:
        """Seek: nothing is pending or counted any more (the consumers are gone)."""
        for consumer in self.consumers:
            consumer.pending.clear()
            consumer.unacked = 0
        self.consumers.clear()
        self.pending_owner.clear()
        self.unacked = 0
        self.blocked_on_unacked = False
        self.redelivery_counts.clear()

    # Unacked limits.

    def _consumer_acked(self, consumer: Consumer, messages: int) -> None:
        """``messages`` of ``consumer`` left its unacked set (acked or sent back to replay)."""
        consumer.unacked -= messages
        self._unacked_changed(-messages)
        if consumer.blocked and consumer.unacked <= self._consumer_limit // 2:
            consumer.unblock()

    def _unacked_changed(self, delta: int) -> None:
        self.unacked += delta
        limit = self._subscription_limit
        if not limit:
            return
        if not self.blocked_on_unacked and self.unacked >= limit:
            self.blocked_on_unacked = True
        elif self.blocked_on_unacked and self.unacked <= limit // 2:
            self.blocked_on_unacked = False
            self.wake()
