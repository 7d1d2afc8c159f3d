"""When a durable subscription's acknowledgements reach its cursor store.

At most once per ``cursor_flush_ms`` whatever the ack rate (the dispatcher's timer calls
:meth:`CursorSaver.save`; a new durable subscription is saved by the first such timer, with
the acks of its first moment) and when the dispatcher stops. An unsubscribed subscription is
deleted, not saved.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from brokerlet.dispatch.batch_acks import BatchAcks
from brokerlet.storage.cursor import Cursor

if TYPE_CHECKING:
    from brokerlet.storage import CursorStore

__all__ = ["CursorSaver"]


class CursorSaver:
    __slots__ = ("_cursor", "_name", "_store", "batch_acks", "dirty")

    def __init__(self, store: CursorStore | None, name: str, cursor: Cursor) -> None:
        self._store = store
        self._name = name
        self._cursor = cursor
        self.dirty = store is not None  # a new durable subscription is saved by the first timer
        self.batch_acks: BatchAcks | None = None  # saved with the cursor when set

    def restore_batch_acks(self, batch_acks: BatchAcks) -> None:
        """Saved with the cursor from now on; what the store holds is taken back first."""
        self.batch_acks = batch_acks
        if self._store is not None:
            batch_acks.restore(self._store.load_batch_acks(self._name), self._cursor.mark_delete)

    def changed(self) -> bool:
        """The cursor moved; True if there is a store to save it to (schedule a save)."""
        if self._store is None:
            return False
        self.dirty = True
        return True

    def forget(self) -> None:
        """The subscription is deleted: nothing is to be saved any more."""
        self.dirty = False

    def save(self) -> None:
        store = self._store
        if store is not None and self.dirty:
            self.dirty = False
            cursor = self._cursor
            # Only what the store keeps: the cost is bounded however many gaps there are.
            acked = cursor.acked_ranges(store.max_unacked_ranges)
            store.save(self._name, cursor.mark_delete, acked)
            if self.batch_acks is not None:
                store.save_batch_acks(self._name, self.batch_acks.state())
