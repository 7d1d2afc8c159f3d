"""A dispatcher's permit total: the sum of its consumers' FLOW balances, behind a lock.

FLOWs arrive on connection actors and dispatches happen on the dispatcher actor; both update
the total at once (see :class:`~brokerlet.dispatch.consumer.Consumer`), so the read loop sees
new permits without a message through its mailbox. The lock makes that hold on real threads
too, not only under gevent's cooperative scheduling.
"""

from __future__ import annotations

import threading

__all__ = ["PermitTotal"]


class PermitTotal:
    """A dispatcher's total of its consumers' permits, updated atomically by every writer.

    The total may go negative and is never clamped: it equals the sum of the accounted
    consumers' balances at every quiescent point.
    """

    __slots__ = ("_lock", "_value")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value = 0

    @property
    def value(self) -> int:
        return self._value

    def add(self, delta: int) -> int:
        with self._lock:
            self._value += delta
            return self._value
