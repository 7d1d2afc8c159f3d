"""Stats: rates of growing counters, a subscription's stats snapshot, timer handles."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from brokerlet.dispatch.delivery import DeliveryBook
    from brokerlet.dispatch.strategy import Strategy

__all__ = ["Cancellable", "Rate", "SubscriptionStats"]


class Cancellable(Protocol):
    """A timer handle: ``done`` once it has fired or been cancelled."""

    @property
    def done(self) -> bool: ...

    def cancel(self) -> None: ...


class Rate:
    """A per-second rate of a growing counter, over at least ``window`` seconds.

    ``sample(counter)`` returns the rate measured between the previous sample that is at least
    ``window`` old and now; calls in between return the last figure, so frequent readers (a
    dashboard and an operator at once) do not shorten each other's window.
    """

    __slots__ = ("_clock", "_count", "_last", "_stamp", "window")

    def __init__(self, window: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self._clock = clock
        self._stamp = clock()
        self._count = 0
        self._last = 0.0

    def sample(self, counter: int) -> float:
        now = self._clock()
        elapsed = now - self._stamp
        if elapsed >= self.window:
            self._last = (counter - self._count) / elapsed
            self._stamp = now
            self._count = counter
        return self._last


class SubscriptionStats:
    """A subscription's part of the topic stats, shaped like Pulsar's, from its state.

    Holds the rate windows between calls; the dispatcher builds one snapshot per request.
    """

    __slots__ = ("_rate_out", "_throughput_out")

    def __init__(self) -> None:
        self._rate_out = Rate()
        self._throughput_out = Rate()

    def snapshot(
        self,
        *,
        strategy: Strategy,
        book: DeliveryBook,
        ledger_id: int,
        read_position: int,
        total_permits: int,
        durable: bool,
        loop: dict[str, int],
    ) -> dict[str, Any]:
        """``loop`` holds the read loop's own counters (``readsIssued`` and friends)."""
        consumers = []
        for c in book.consumers:
            channel = c.connection.channel.statistics()
            consumers.append(
                {
                    "consumerName": c.name,
                    "consumerId": c.consumer_id,
                    "address": c.connection.peer,
                    "priorityLevel": c.priority,
                    "availablePermits": c.permits,
                    "unackedMessages": c.unacked,
                    "blockedConsumerOnUnackedMsgs": c.blocked,
                    "parkedPermits": c.parked_permits,
                    "msgOutCounter": c.msg_out,
                    "bytesOutCounter": c.bytes_out,
                    "avgMessagesPerEntry": c.messages_per_entry,
                    "msgRateOut": c.rate_out.sample(c.msg_out),
                    "msgThroughputOut": c.throughput_out.sample(c.bytes_out),
                    "isActive": strategy.is_active(c),
                    "writable": channel.writable,
                    "sendBlocked": c.connection.channel.send_blocked,  # the kernel buffer is full
                    "pendingOutboundBytes": channel.pending_bytes,
                    "writabilityChanges": channel.writability_changes,
                    **strategy.consumer_stats(c),
                }
            )
        cursor = book.cursor
        return {
            "type": strategy.type_name,
            "isDurable": durable,
            "msgOutCounter": book.msg_out,
            "bytesOutCounter": book.bytes_out,
            "msgRateOut": self._rate_out.sample(book.msg_out),
            "msgThroughputOut": self._throughput_out.sample(book.bytes_out),
            "markDeletePosition": f"{ledger_id}:{cursor.mark_delete}",
            "readPosition": f"{ledger_id}:{read_position}",
            "individuallyAcked": cursor.individually_acked,
            "msgRedeliverQueue": len(book.replay),
            "totalAvailablePermits": total_permits,
            "unackedMessages": book.unacked,
            "blockedSubscriptionOnUnackedMsgs": book.blocked_on_unacked,
            **loop,
            "consumers": consumers,
            **strategy.stats(),
        }
