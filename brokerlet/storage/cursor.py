"""A subscription's acknowledgement state over one ledger.

The cursor is the part of a subscription that a durable back-end must persist: the
mark-delete position (every entry up to it is acknowledged) and the individually acknowledged
entries above it. Read positions and pending deliveries are dispatcher state, not cursor state.
"""

from __future__ import annotations

from collections.abc import Iterable

from sortedcontainers import SortedSet

__all__ = ["Cursor"]


class Cursor:
    """Mark-delete position plus individually acknowledged entry ids above it.

    Args:
        mark_delete: id of the last entry acknowledged with everything before it
            (``first entry id - 1`` for a fresh subscription).
    """

    __slots__ = ("_acked", "mark_delete")

    def __init__(self, mark_delete: int) -> None:
        self.mark_delete = mark_delete
        self._acked: SortedSet = SortedSet()

    @classmethod
    def restore(cls, mark_delete: int, acked_ids: Iterable[int] = ()) -> Cursor:
        """A cursor in a saved state (see `acked_ids`); ids at or below ``mark_delete`` are
        ignored, and the mark-delete position moves over any run that continues it."""
        cursor = cls(mark_delete)
        for entry_id in sorted(acked_ids):
            cursor.ack(entry_id)
        return cursor

    def acked_ids(self) -> list[int]:
        """The individually acknowledged ids above the mark-delete position, ascending."""
        return list(self._acked)

    def is_acked(self, entry_id: int) -> bool:
        return entry_id <= self.mark_delete or entry_id in self._acked

    @property
    def individually_acked(self) -> int:
        """How many acknowledged entries sit above the mark-delete position."""
        return len(self._acked)

    def acked_up_to(self, entry_id: int) -> int:
        """How many individually acknowledged ids lie in ``(mark_delete, entry_id]``."""
        return int(self._acked.bisect_right(entry_id))

    def ack(self, entry_id: int) -> bool:
        """Acknowledge one entry. Returns True when the mark-delete position moved."""
        if entry_id <= self.mark_delete:
            return False
        if entry_id != self.mark_delete + 1:
            self._acked.add(entry_id)
            return False
        self.mark_delete = entry_id
        acked = self._acked
        while acked and acked[0] == self.mark_delete + 1:
            self.mark_delete = acked.pop(0)
        return True

    def ack_cumulative(self, entry_id: int) -> bool:
        """Acknowledge every entry up to ``entry_id``. Returns True when the position moved."""
        if entry_id <= self.mark_delete:
            return False
        acked = self._acked
        del acked[: acked.bisect_right(entry_id)]
        self.mark_delete = entry_id
        while acked and acked[0] == self.mark_delete + 1:
            self.mark_delete = acked.pop(0)
        return True

    def reset(self, mark_delete: int) -> None:
        """Forget every acknowledgement after ``mark_delete`` (a seek)."""
        self.mark_delete = mark_delete
        self._acked.clear()
