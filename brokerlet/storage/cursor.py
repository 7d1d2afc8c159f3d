"""A subscription's acknowledgement state over one ledger.

The cursor is the part of a subscription that a durable back-end must persist: the
mark-delete position (every entry up to it is acknowledged) and the individually acknowledged
entries above it. Read positions and pending deliveries are dispatcher state, not cursor state.

The individually acknowledged entries are kept as disjoint ranges, as Pulsar's
``individuallyDeletedMessages`` range set is: one unacknowledged entry followed by a million
acknowledged ones is two numbers, so saving the cursor costs the number of gaps, not the
number of acknowledgements.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from typing import Any, Final

__all__ = ["AckedRanges", "Cursor", "CursorState"]

AckedRanges = list[tuple[int, int]]
"""Disjoint, non-adjacent inclusive ``(low, high)`` runs of entry ids, ascending."""

CursorState = tuple[int, AckedRanges]
"""What a cursor is saved and handed over as: ``(mark_delete, acked_ranges())``."""


def _bisect_right(values: list[int], x: int, lo: int = 0) -> int:
    """`bisect.bisect_right` typed: compiled, ids compared as C integers, not objects."""
    hi = len(values)
    while lo < hi:
        mid = (lo + hi) // 2
        if x < values[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


_COMPILED: Final = type(_bisect_right).__name__ != "function"  # else bisect's C search wins


def _consecutive(ids: list[int], first: int) -> bool:
    """Whether ``ids`` are ``first, first + 1, ...``. Compiled, a typed loop; from source, one
    comparison of lists in C (it makes an int per id, which compiled code need not)."""
    if not _COMPILED:
        return ids == list(range(first, first + len(ids)))
    expected = first
    for entry_id in ids:
        if entry_id != expected:
            return False
        expected += 1
    return True


class Cursor:
    """Mark-delete position plus individually acknowledged entry ids above it.

    The runs' first ids are a plain sorted list searched with `bisect`: acknowledging next to
    a run (the usual case) changes only the run's end, and starting or merging runs moves
    the list's tail, a memmove that stays small while the gaps number in the thousands.

    Args:
        mark_delete: id of the last entry acknowledged with everything before it
            (``first entry id - 1`` for a fresh subscription).
    """

    __slots__ = ("_count", "_highs", "_lows", "mark_delete")

    def __init__(self, mark_delete: int) -> None:
        self.mark_delete = mark_delete
        self._lows: list[int] = []  # the first id of each acknowledged run, ascending
        self._highs: dict[int, int] = {}  # a run's first id -> its last id
        self._count = 0  # ids in all runs

    @classmethod
    def restore(cls, mark_delete: int, acked: Iterable[tuple[int, int]] = ()) -> Cursor:
        """A cursor in a saved state (see `acked_ranges`); ids at or below ``mark_delete``
        are ignored, and the mark-delete position moves over any run that continues it.
        Runs may come in any order and may overlap or touch."""
        cursor = cls(mark_delete)
        for low, high in sorted(acked):
            cursor.ack_range(low, high)
        return cursor

    def acked_ranges(self, limit: int | None = None) -> AckedRanges:
        """The individually acknowledged ids above the mark-delete position, as runs: all of
        them, or the lowest ``limit``."""
        highs = self._highs
        return [(low, highs[low]) for low in self._lows[:limit]]

    def is_acked(self, entry_id: int) -> bool:
        if entry_id <= self.mark_delete:
            return True
        lows = self._lows
        if not lows:
            return False
        at = bisect_right(lows, entry_id)
        return at > 0 and self._highs[lows[at - 1]] >= entry_id

    def acked_from(self, entry_id: int) -> bool:
        """Whether any id at or above ``entry_id`` is acknowledged: False for a read of
        new entries past everything acked, which then needs no `is_acked` per entry."""
        if entry_id <= self.mark_delete:
            return True
        lows = self._lows
        return bool(lows) and self._highs[lows[-1]] >= entry_id

    @property
    def individually_acked(self) -> int:
        """How many acknowledged entries sit above the mark-delete position."""
        return self._count

    @property
    def acked_runs(self) -> int:
        """How many runs the individually acknowledged entries make (the gaps between)."""
        return len(self._lows)

    def acked_up_to(self, entry_id: int) -> int:
        """How many individually acknowledged ids lie in ``(mark_delete, entry_id]``."""
        lows, highs = self._lows, self._highs
        count = 0
        for low in lows[: bisect_right(lows, entry_id)]:
            count += min(highs[low], entry_id) - low + 1
        return count

    def ack(self, entry_id: int) -> bool:
        """Acknowledge one entry. Returns True when the mark-delete position moved."""
        return self._ack_each((entry_id,))

    def ack_many(self, entry_ids: list[int]) -> bool:
        """Acknowledge entries (an ACK carries up to a thousand). Returns True when the
        mark-delete position moved.

        The ids a consumer received in order and acked as a group (the official client
        sends them ascending) are one `ack_range`; any other list is acked id by id.
        """
        if not entry_ids:
            return False
        first, last = entry_ids[0], entry_ids[-1]
        if last - first + 1 == len(entry_ids) and _consecutive(entry_ids, first):
            return self.ack_range(first, last)
        return self._ack_each(entry_ids)

    def _ack_each(self, entry_ids: Iterable[int]) -> bool:
        """`ack_range` for one id at a time, in one loop: a Key_Shared or out-of-order
        consumer's ACK is scattered ids, each its own run or the end of one."""
        lows, highs = self._lows, self._highs
        # Compiled, an int read from a list is unboxed, and boxed anew (allocated) each time
        # it is stored again: the ids and run starts that are stored are kept as the objects
        # they are (typed Any), and compared as ints.
        low_objects: list[Any] = lows
        ids: Iterable[Any] = entry_ids
        moved = False
        added = 0
        lo = 0  # ascending ids (as the official client sends them) search from the last one's run
        previous = -1
        for boxed in ids:
            entry_id: int = boxed
            if entry_id < previous:
                lo = 0
            previous = entry_id
            mark_delete = self.mark_delete
            if entry_id <= mark_delete:
                continue
            if entry_id == mark_delete + 1:
                self.mark_delete = entry_id
                self._absorb()
                lo = 0  # the first run may have gone
                moved = True
                continue
            if _COMPILED:
                at = _bisect_right(lows, entry_id, lo)
            else:
                at = bisect_right(lows, entry_id, lo)
            lo = at
            if at:
                first = low_objects[at - 1]
                end: int = highs[first]
                if end >= entry_id:
                    continue  # acknowledged already
                if end == entry_id - 1:  # the run before grows, and may meet the one after
                    if at < len(lows) and lows[at] == entry_id + 1:
                        highs[first] = highs.pop(low_objects.pop(at))
                    else:
                        highs[first] = boxed
                    added += 1
                    continue
            if at < len(lows) and lows[at] == entry_id + 1:  # the run after starts one earlier
                following = low_objects[at]
                lows[at] = boxed
                highs[boxed] = highs.pop(following)
            else:
                lows.insert(at, boxed)
                highs[boxed] = boxed
            added += 1
        # _absorb subtracts what it takes from the runs; the ids added are counted once here.
        self._count += added
        return moved

    def ack_range(self, low: int, high: int) -> bool:
        """Acknowledge ``low..high``. Returns True when the mark-delete position moved."""
        low = max(low, self.mark_delete + 1)
        if low > high:
            return False
        lows, highs = self._lows, self._highs
        at = bisect_right(lows, low)
        if at > 0 and highs[lows[at - 1]] >= low - 1:
            # Overlaps or continues the run before: that run grows, and swallows any after it
            # that the new end now reaches.
            first = lows[at - 1]
            end = highs[first]
            if high <= end:
                return False
            self._count += high - end
            highs[first] = high
            self._merge_after(at, first)
            return False
        lows.insert(at, low)
        highs[low] = high
        self._count += high - low + 1
        self._merge_after(at + 1, low)
        if low == self.mark_delete + 1:
            self._absorb()
            return True
        return False

    def ack_cumulative(self, entry_id: int) -> bool:
        """Acknowledge every entry up to ``entry_id``. Returns True when the position moved."""
        if entry_id <= self.mark_delete:
            return False
        lows, highs = self._lows, self._highs
        covered = bisect_right(lows, entry_id)  # the runs that start at or below entry_id
        self.mark_delete = entry_id
        for first in lows[:covered]:
            last = highs.pop(first)
            self._count -= last - first + 1
            # Only the last of them can go on past entry_id; the position moves over it.
            self.mark_delete = max(self.mark_delete, last)
        del lows[:covered]
        self._absorb()
        return True

    def reset(self, mark_delete: int) -> None:
        """Forget every acknowledgement after ``mark_delete`` (a seek)."""
        self.mark_delete = mark_delete
        self._lows.clear()
        self._highs.clear()
        self._count = 0

    def _merge_after(self, at: int, first: int) -> None:
        """Fold the runs from index ``at`` that the run starting at ``first`` now reaches."""
        lows, highs = self._lows, self._highs
        end = highs[first]
        stop = at
        while stop < len(lows) and lows[stop] <= end + 1:
            following = lows[stop]
            last = highs.pop(following)
            self._count -= min(last, end) - following + 1
            end = max(end, last)
            stop += 1
        if stop > at:
            del lows[at:stop]
            highs[first] = end

    def _absorb(self) -> None:
        """Move the mark-delete position over a run that now continues it."""
        lows = self._lows
        if lows and lows[0] == self.mark_delete + 1:
            first = lows.pop(0)
            last = self._highs.pop(first)
            self._count -= last - first + 1
            self.mark_delete = last
