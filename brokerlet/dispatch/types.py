"""Which strategy serves which subscription type: the one place a new type is registered."""

from __future__ import annotations

from brokerlet.config import Settings
from brokerlet.dispatch.consumer import Consumer
from brokerlet.dispatch.delivery import DeliveryBook
from brokerlet.dispatch.key_shared import KeySharedStrategy
from brokerlet.dispatch.shared import SharedStrategy
from brokerlet.dispatch.single_active import NO_PLACEMENT, Placement, SingleActiveStrategy
from brokerlet.dispatch.strategy import EXCLUSIVE, FAILOVER, KEY_SHARED, Strategy, WakeAfter
from brokerlet.keyshared import KeySharedMeta

__all__ = ["strategy_for"]


def strategy_for(
    first: Consumer,
    book: DeliveryBook,
    settings: Settings,
    wake_after: WakeAfter,
    placement: Placement = NO_PLACEMENT,
) -> Strategy:
    """The strategy of a subscription whose first consumer is ``first``; its type (and, for
    Key_Shared, its mode) fixes the subscription's until every consumer has left.
    ``placement``: where the topic sits, for Failover's pick."""
    sub_type = first.sub_type
    if sub_type in (EXCLUSIVE, FAILOVER):
        return SingleActiveStrategy(
            book,
            sub_type,
            placement,
            hold_ms=settings.active_consumer_failover_delay_time_millis,
            wake_after=wake_after,
        )
    if sub_type == KEY_SHARED:
        meta = first.key_shared or KeySharedMeta()
        return KeySharedStrategy(book, meta, settings, wake_after)
    return SharedStrategy(book, settings.dispatcher_max_round_robin_batch_size)
