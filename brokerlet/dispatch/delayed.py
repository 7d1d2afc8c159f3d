"""Delayed delivery: entries with a ``deliver_at_time`` wait in a tracker until their time.

As in Pulsar (``InMemoryDelayedDeliveryTracker``): only Shared and Key_Shared subscriptions
hold messages back, Exclusive and Failover deliver at once. A normal read passes every entry
through :class:`DelayedDelivery`; an entry due later than ``now + tick`` leaves the read and
joins the :class:`DelayTracker` (its id only), so entries after it go out as usual. When
entries fall due they join the replay set and come back through the ordinary replay read.

Nothing is persisted: after a restart (or a rewind) the dispatcher reads again from the
mark-delete position, and every unacknowledged delayed entry meets this filter again, so the
tracker is rebuilt from the ledger and nothing is lost or delivered early.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from operator import attrgetter

from brokerlet.config import Settings
from brokerlet.dispatch.replay import ReplaySet
from brokerlet.dispatch.strategy import WakeAfter
from brokerlet.storage.cursor import Cursor
from brokerlet.storage.ledger import Entry, key_hash_of
from brokerlet.transport.protocol import deliver_at_time, may_deliver_later

__all__ = ["MAX_WAKE_MS", "DelayTracker", "DelayedDelivery"]

_ID_BITS = 48  # an entry id below 2**48; the delivery time sits above it
_ID_MASK = (1 << _ID_BITS) - 1
_DATA = attrgetter("data")
MAX_WAKE_MS = 3_600_000.0
"""Longest single wait: an entry due years ahead is looked at again every hour, harmlessly."""


class DelayTracker:
    """Entry ids ordered by delivery time (epoch ms), in one heap of packed integers.

    One ``time << 48 | entry_id`` int per entry (about 44 bytes with its list slot), no
    per-entry tuple or dict.
    """

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[int] = []

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, deliver_at: int, entry_id: int) -> None:
        heapq.heappush(self._heap, deliver_at << _ID_BITS | (entry_id & _ID_MASK))

    def next_time(self) -> int | None:
        """Delivery time of the earliest entry, or None when empty."""
        return self._heap[0] >> _ID_BITS if self._heap else None

    def pop_due(self, now_ms: int) -> list[int]:
        """Remove and return (in time order) the ids of entries due at ``now_ms``."""
        heap = self._heap
        due: list[int] = []
        limit = (now_ms + 1) << _ID_BITS
        while heap and heap[0] < limit:
            due.append(heapq.heappop(heap) & _ID_MASK)
        return due

    def clear(self) -> None:
        self._heap.clear()


class DelayedDelivery:
    """The delivery filter of delayed delivery, one per dispatcher.

    Args:
        applies: whether the subscription's current type delays (Shared, Key_Shared).
        replay: the subscription's replay set, where due entries go.
        cursor: acknowledged entries are dropped when they fall due.
        wake_after: asks the read loop to run again after a delay in ms.
        clock: epoch seconds (tests pass a fake).
    """

    __slots__ = (
        "_applies",
        "_clock",
        "_cursor",
        "_enabled",
        "_replay",
        "_tick",
        "_wake_after",
        "_wake_at",
        "tracker",
    )

    def __init__(
        self,
        settings: Settings,
        *,
        applies: Callable[[], bool],
        replay: ReplaySet,
        cursor: Cursor,
        wake_after: WakeAfter,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._enabled = settings.delayed_delivery_enabled
        self._tick = settings.delayed_delivery_tick_time_millis
        self._applies = applies
        self._replay = replay
        self._cursor = cursor
        self._wake_after = wake_after
        self._clock = clock
        self._wake_at: int | None = None  # epoch ms of the wake-up asked for
        self.tracker = DelayTracker()

    @property
    def delayed(self) -> int:
        """Messages held (Pulsar's ``msgDelayed``; acked ones count until they fall due)."""
        return len(self.tracker)

    def admit(self, entries: list[Entry], *, replay: bool) -> list[Entry]:
        if replay or not self._enabled or not self._applies():
            return entries  # a replayed entry was due already (or is a redelivery)
        if 0 not in map(key_hash_of, entries):
            return entries  # all were checked plain on SEND: no delivery times (in C)
        if not may_deliver_later(map(_DATA, entries)):
            return entries
        now = int(self._clock() * 1000)
        cutoff = now + self._tick  # Pulsar's non-strict cut-off: due within a tick, now
        kept: list[Entry] = []
        track = self.tracker.add
        held = False
        for entry in entries:
            at = deliver_at_time(entry.data)
            if at > cutoff:
                track(at, entry.entry_id)
                held = True
            else:
                kept.append(entry)
        if held:
            self._schedule(now)
        return kept

    def release_due(self) -> None:
        """Entries whose time has come join the replay set; the next wake-up is asked for."""
        tracker = self.tracker
        if not tracker:  # the common case: one check per read pass
            return
        now = int(self._clock() * 1000)
        wake_at = self._wake_at
        if wake_at is not None:
            if now < wake_at:
                return  # nothing is due before the wake-up asked for (it is the earliest)
            self._wake_at = None
        next_time = tracker.next_time()
        if next_time is not None and next_time <= now:
            is_acked = self._cursor.is_acked
            waiting = self._replay
            for entry_id in tracker.pop_due(now):
                if not is_acked(entry_id):
                    waiting.add(entry_id)
        self._schedule(now)

    def reset(self) -> None:
        """The dispatcher reads again from the mark-delete position: forget what is held."""
        self.tracker.clear()
        self._wake_at = None

    def _schedule(self, now: int) -> None:
        next_time = self.tracker.next_time()
        if next_time is None:
            return
        if self._wake_at is not None and self._wake_at <= next_time:
            return  # an earlier (or the same) wake-up is already asked for
        delay = min(float(max(0, next_time - now)), MAX_WAKE_MS)
        self._wake_at = now + int(delay)
        self._wake_after(delay)
