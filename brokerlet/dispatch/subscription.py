"""One subscription's membership, acknowledgements and redelivery, without an actor.

:class:`Subscription` joins a subscription's parts: its consumers and delivery bookkeeping
(:class:`~brokerlet.dispatch.delivery.DeliveryBook`), the strategy of its type, and the
permit total its consumers' FLOWs feed. The dispatcher actor calls it with each membership
or ack message and then does what the answer asks (wake the read loop, tell the topic).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from typing import TYPE_CHECKING

from brokerlet.actors.errors import BrokerError
from brokerlet.config import Settings
from brokerlet.dispatch.batch_acks import BatchAcks
from brokerlet.dispatch.consumer import Consumer
from brokerlet.dispatch.delivery import DeliveryBook
from brokerlet.dispatch.options import DispatchOptions
from brokerlet.dispatch.permits import PermitTotal
from brokerlet.dispatch.single_active import NO_PLACEMENT, Placement
from brokerlet.dispatch.strategy import Strategy, WakeAfter
from brokerlet.dispatch.types import strategy_for
from brokerlet.storage.cursor import Cursor
from brokerlet.transport.protocol import pb

if TYPE_CHECKING:
    from brokerlet.actors._conflate import ConflatedTell
    from brokerlet.actors.dispatcher import DispatcherActor

__all__ = ["Removal", "Subscription"]

log = logging.getLogger(__name__)


class Removal(Enum):
    """What removing a consumer left."""

    ALREADY_GONE = 0  # removed before: its pending entries were released then
    OTHERS_REMAIN = 1  # its pending entries are in the replay set for the others
    LAST = 2  # nobody is left: the caller rewinds (see ``rewind``)


class Subscription:
    """Consumers, the type's strategy and the delivery book of one subscription.

    Args:
        name: the subscription's name (for errors).
        sub_type: its type until the first consumer sets it.
        wake_after: a strategy calls it when entries in the replay set may go out after a
            delay (Key_Shared: a draining hash that blocked someone was released).
        placement: where the topic sits, for Failover's pick of its active consumer.
    """

    def __init__(
        self,
        name: str,
        settings: Settings,
        cursor: Cursor,
        *,
        ledger_id: int,
        last_entry_id: Callable[[], int] | None = None,
        sub_type: int,
        durable: bool,
        options: DispatchOptions,
        wake_after: WakeAfter,
        placement: Placement = NO_PLACEMENT,
    ) -> None:
        self.name = name
        self.settings = settings
        self.ledger_id = ledger_id
        self._last_entry_id = last_entry_id  # the topic's last confirmed entry, to bound acks
        self.book = DeliveryBook(
            settings, cursor, durable=durable, writability_gating=options.writability_gating
        )
        self.strategy = Strategy(self.book, sub_type)  # no consumer yet
        self.total_permits = PermitTotal()
        self._wake_after = wake_after
        self._placement = placement
        self.batch_acks = (
            BatchAcks() if settings.acknowledgment_at_batch_index_level_enabled else None
        )

    @property
    def consumers(self) -> list[Consumer]:
        return self.book.consumers

    # Membership.

    def add(self, consumer: Consumer, read_gate: ConflatedTell[DispatcherActor]) -> bool:
        """Join ``consumer`` (BrokerError if it may not); True if entries moved to replay."""
        book = self.book
        strategy = self.strategy
        if not book.consumers:  # the first consumer sets the subscription's type
            strategy = strategy_for(
                consumer, book, self.settings, self._wake_after, self._placement
            )
        strategy.add(consumer)  # raises BrokerError to refuse it
        self._use(strategy)
        consumer.attach(self.total_permits, read_gate)
        book.consumers.append(consumer)
        book.consumers.sort(key=lambda c: c.priority)  # stable: joining order within a level
        return self._membership_changed()

    def remove(self, consumer: Consumer, *, unsubscribe: bool) -> Removal:
        book = self.book
        if unsubscribe and any(c is not consumer for c in book.consumers):
            raise BrokerError(
                pb.MetadataError, f"Subscription {self.name!r} has other connected consumers"
            )
        if not consumer.detach():
            return Removal.ALREADY_GONE
        book.consumers.remove(consumer)
        book.release_pending(consumer, closing=True)
        self.strategy.remove(consumer)
        if not book.consumers:
            return Removal.LAST
        self._membership_changed()
        return Removal.OTHERS_REMAIN

    def close_all(self) -> list[Consumer]:
        """Seek: every consumer is detached and forgotten, with everything pending (the
        caller rewinds)."""
        closed = list(self.book.consumers)
        for consumer in closed:
            consumer.detach()
        self.book.forget_all()
        return closed

    def rewind(self) -> None:
        """No consumer is left: forget the replay set and the type's state."""
        self.book.replay.clear()
        self._use(Strategy(self.book, self.strategy.sub_type))

    def _membership_changed(self) -> bool:
        moved = self.strategy.membership_changed()
        if moved is None:
            return False
        self.book.release_pending(moved, count_redelivery=False)
        return True

    def _use(self, strategy: Strategy) -> None:
        self.strategy = strategy
        self.book.hooks = strategy

    # Acknowledgements and redelivery.

    def ack(
        self,
        positions: Sequence[tuple[int, int]],
        *,
        cumulative: bool,
        ack_sets: Mapping[tuple[int, int], Sequence[int]] | None = None,
    ) -> bool | None:
        """Apply an ACK; None if it changed nothing, else whether the mark-delete moved.

        ``ack_sets`` are batch-index acks (members of a batch entry); an entry whose members
        are all acked is acknowledged as a whole."""
        entry_ids = [e for ledger, e in positions if ledger == self.ledger_id]
        if self._last_entry_id is not None and entry_ids:
            # As Pulsar's cursor does: an entry not written yet cannot be acknowledged.
            last = self._last_entry_id()
            if max(entry_ids) > last:
                entry_ids = [e for e in entry_ids if e <= last]
        strategy = self.strategy
        if cumulative and not strategy.cumulative_acks:
            return None  # Pulsar ignores cumulative acks on Shared subscriptions
        partly = False
        if ack_sets and self.batch_acks is not None:
            partly = self._ack_members(ack_sets, entry_ids, cumulative=cumulative)
        if not entry_ids:
            return False if partly else None
        scope = strategy.ack_scope()
        if scope is None:
            moved = self.book.ack(entry_ids, cumulative=cumulative)
        else:
            with scope:
                moved = self.book.ack(entry_ids, cumulative=cumulative)
        batch_acks = self.batch_acks
        if batch_acks:
            batch_acks.forget_up_to(self.book.cursor.mark_delete)
            if not cumulative:
                for entry_id in entry_ids:
                    batch_acks.forget(entry_id)
        return moved

    def _ack_members(
        self,
        ack_sets: Mapping[tuple[int, int], Sequence[int]],
        entry_ids: list[int],
        *,
        cumulative: bool,
    ) -> bool:
        """Record batch-index acks; entries now wholly acked join ``entry_ids``. A cumulative
        one acks up to the entry before (the partial entry is recorded). True if any
        partial ack was recorded."""
        batch_acks = self.batch_acks
        assert batch_acks is not None
        cursor = self.book.cursor
        last = self._last_entry_id() if self._last_entry_id is not None else None
        recorded = False
        for (ledger, entry_id), words in ack_sets.items():
            if ledger != self.ledger_id or cursor.is_acked(entry_id):
                continue
            if last is not None and entry_id > last:
                continue
            size = batch_acks.size_of(entry_id) or self.book.charged(entry_id)
            if size is None:
                log.debug("%s: ack_set for entry %d not pending here ignored", self.name, entry_id)
                continue
            left = batch_acks.apply(entry_id, words, size)
            if left is None:
                continue
            if cumulative and entry_id - 1 > cursor.mark_delete:
                entry_ids.append(entry_id - 1)
            if left == 0:
                entry_ids.append(entry_id)
            else:
                self.book.partially_acked(entry_id, left)
                recorded = True
        return recorded

    def redeliver(self, consumer: Consumer, positions: Sequence[tuple[int, int]] | None) -> None:
        """``positions`` (None: all) of ``consumer``'s pending entries go back to replay."""
        if positions is None:
            ids: list[int] = list(consumer.pending)
        else:
            ids = [e for ledger, e in positions if ledger == self.ledger_id]
        self.book.redeliver(consumer, ids)
