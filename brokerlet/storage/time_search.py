"""Finding the first entry published at or after a time, by binary search of the ledger.

Entries are appended in publish order, so ``publish_time`` grows along the ledger (Pulsar
makes the same assumption when it resets a cursor by time). A search reads one entry per
step, about 20 for a million entries, never the whole ledger. It is a plain state machine:
the topic actor issues each probe as an ordinary ledger read, so a disk ledger's reads stay
on its reader thread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from brokerlet.storage.ledger import Entry

__all__ = ["PublishTimeSearch"]


class PublishTimeSearch:
    """Binary search over entry ids ``first..last`` for the first with ``time_of >= target``.

    ``result`` is ``last + 1`` (the end) when every entry is older, ``first`` when none is.
    """

    __slots__ = ("_hi", "_lo", "_target", "_time_of", "probes")

    def __init__(self, first: int, last: int, target: int, time_of: Callable[[bytes], int]) -> None:
        self._lo = first
        self._hi = last + 1
        self._target = target
        self._time_of = time_of
        self.probes = 0

    def probe(self) -> int | None:
        """The entry id to read next, or None when the search is over."""
        if self._lo >= self._hi:
            return None
        return (self._lo + self._hi) // 2

    def observe(self, entry_id: int, entries: Sequence[Entry]) -> None:
        """The read of ``entry_id`` answered ``entries`` (empty: trimmed meanwhile, older)."""
        self.probes += 1
        if entries and self._time_of(entries[0].data) >= self._target:
            self._hi = entry_id
        else:
            self._lo = entry_id + 1

    @property
    def result(self) -> int:
        return self._lo
