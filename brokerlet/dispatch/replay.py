"""The replay set: entries a subscription must deliver again, in entry order.

Entries land here when their consumer leaves or asks for redelivery, and when a read brings
entries nobody can take now. Each keeps its Key_Shared sticky-key hash (0 for other
subscription types), so Key_Shared can hold newer entries of a hash back while older ones wait.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, KeysView

from sortedcontainers import SortedList

__all__ = ["ReplaySet"]


class ReplaySet:
    """Entries to deliver again, in entry order, each with its sticky-key hash (0: none)."""

    __slots__ = ("_counts", "_hashes", "_ids")

    def __init__(self) -> None:
        # Membership is the hashes' dict; a SortedList, not a SortedSet, keeps the order (a
        # SortedSet adds a set and binds eight methods per instance: one per subscription).
        self._ids: SortedList = SortedList()
        self._hashes: dict[int, int] = {}
        self._counts: Counter[int] = Counter()

    def __len__(self) -> int:
        return len(self._ids)

    def __bool__(self) -> bool:
        return bool(self._ids)

    def __contains__(self, entry_id: int) -> bool:
        return entry_id in self._hashes

    def add(self, entry_id: int, key_hash: int = 0) -> None:
        if entry_id in self._hashes:
            return
        self._ids.add(entry_id)
        self._hashes[entry_id] = key_hash
        if key_hash:
            self._counts[key_hash] += 1

    def discard(self, entry_id: int) -> None:
        key_hash = self._hashes.pop(entry_id, None)
        if key_hash is None:
            return
        self._ids.remove(entry_id)
        if key_hash:
            left = self._counts[key_hash] - 1
            if left:
                self._counts[key_hash] = left
            else:
                del self._counts[key_hash]

    def clear(self) -> None:
        self._ids.clear()
        self._hashes.clear()
        self._counts.clear()

    def first(self) -> int:
        return int(self._ids[0])

    def head(self, count: int) -> list[int]:
        return list(self._ids.islice(0, count))

    def __iter__(self) -> Iterator[int]:
        return iter(self._ids)

    def up_to(self, entry_id: int) -> list[int]:
        return list(self._ids.irange(maximum=entry_id))

    def key_hash(self, entry_id: int) -> int:
        return self._hashes.get(entry_id, 0)

    def has_hash(self, key_hash: int) -> bool:
        return key_hash in self._counts

    def hashes(self) -> KeysView[int]:
        """The distinct non-zero hashes of the entries here."""
        return self._counts.keys()

    @property
    def unhashed(self) -> int:
        """How many entries here have no hash."""
        return len(self._ids) - self._counts.total()
