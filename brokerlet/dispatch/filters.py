"""Delivery filters: rules that decide which entries of a completed read may be handed out.

A dispatcher runs every entry it read through its filters, in order, before the selection
strategy sees them. A rule that holds entries back or drops them (delayed delivery holding an
entry until its time, batch-index acks trimming acknowledged messages) is a new filter here,
not a branch in the dispatcher.
"""

from __future__ import annotations

from typing import Protocol

from brokerlet.dispatch.replay import ReplaySet
from brokerlet.storage.cursor import Cursor
from brokerlet.storage.ledger import Entry

__all__ = ["DeliveryFilter", "SkipSettled"]


class DeliveryFilter(Protocol):
    """Decides which entries of one read go on to selection."""

    def admit(self, entries: list[Entry], *, replay: bool) -> list[Entry]:
        """The entries that may be delivered now, in order; ``replay`` for a replay read."""
        ...

    def release_due(self) -> None:
        """Before a read pass: entries this rule held that may go now rejoin the replay set."""
        ...

    def reset(self) -> None:
        """The dispatcher reads again from the mark-delete position: forget held entries."""
        ...


class SkipSettled:
    """Entries settled since they were asked for are not delivered again.

    A normal read skips entries already acknowledged individually (they may lie past the
    mark-delete position); a replay read keeps only entries still waiting in the replay set
    (an ack or a cumulative ack may have taken them out meanwhile).
    """

    __slots__ = ("_cursor", "_replay")

    def __init__(self, cursor: Cursor, replay: ReplaySet) -> None:
        self._cursor = cursor
        self._replay = replay

    def release_due(self) -> None:
        pass

    def reset(self) -> None:
        pass

    def admit(self, entries: list[Entry], *, replay: bool) -> list[Entry]:
        if replay:
            waiting = self._replay
            return [e for e in entries if e.entry_id in waiting]
        cursor = self._cursor
        # A normal read's entries ascend: past the highest acked id, none can be acked.
        if not entries or not cursor.acked_from(entries[0].entry_id):
            return entries
        is_acked = cursor.is_acked
        return [e for e in entries if not is_acked(e.entry_id)]
