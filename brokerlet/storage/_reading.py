"""Reading entries back on the hub's side: the segment index, the tail cache, read jobs.

`SegmentIndex` knows where each record of a segment starts; `TailCache` keeps the newest
entries so the common read (a dispatcher at the end of the ledger) needs no I/O; `ReadJob`
carries byte ranges to the reader thread, whose processor is `read_batch`.
"""

from __future__ import annotations

import errno
import os
from array import array
from collections.abc import Callable

from brokerlet.storage._records import RECORD_HEADER_SIZE
from brokerlet.storage._worker import Job
from brokerlet.storage.ledger import Entry, EntryColumns, NewEntry, count_within

__all__ = ["ReadJob", "SegmentIndex", "TailCache", "read_batch"]

_ENTRY_OVERHEAD = 120  # bytes an entry is charged beyond its data, for the cache budget
_COMPACT_SLICE = 1024  # evicted cache entries freed together


class SegmentIndex:
    """Where each record of one segment file starts, and a read descriptor while needed."""

    __slots__ = ("_fd", "_pins", "_retired", "base", "end", "offsets", "path")

    def __init__(self, base: int, path: str, offsets: array[int], end: int) -> None:
        self.base = base
        self.path = path
        self.offsets = offsets
        self.end = end
        self._fd = -1
        self._pins = 0
        self._retired = False

    @property
    def last_id(self) -> int:
        return self.base + len(self.offsets) - 1

    def span(self, start: int, count: int) -> tuple[int, int]:
        """``(offset, length)`` of ``count`` records from entry ``start``."""
        offsets = self.offsets
        index = start - self.base
        begin = offsets[index]
        after = index + count
        end = offsets[after] if after < len(offsets) else self.end
        return begin, end - begin

    def count_within(self, start: int, stop: int, max_bytes: int) -> int:
        """How many entries from ``start`` fit ``max_bytes`` of data (at least one)."""
        wanted = stop - start + 1
        if max_bytes <= 0:
            return wanted
        offsets = self.offsets
        index = start - self.base
        total = 0
        for taken in range(wanted):
            after = index + taken + 1
            end = offsets[after] if after < len(offsets) else self.end
            total += end - offsets[index + taken] - RECORD_HEADER_SIZE
            if total > max_bytes and taken > 0:
                return taken
        return wanted

    def pin(self) -> int:
        """A descriptor to read from, kept open until the matching `unpin`."""
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_RDONLY)
        self._pins += 1
        return self._fd

    def unpin(self) -> None:
        self._pins -= 1
        if self._retired and self._pins == 0:
            self._close()

    def retire(self) -> None:
        """No new reads; close once the reads in flight are done."""
        self._retired = True
        if self._pins == 0:
            self._close()

    def _close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class TailCache:
    """The most recent entries of a ledger, as a window of consecutive ids ending at the last.

    Entries are kept as :class:`EntryColumns` (no object per entry for the garbage collector)
    and become `Entry` objects when read.
    """

    def __init__(self, limit: int, first_id: int) -> None:
        self._limit = limit
        self._ledger_id = -1
        self._columns = EntryColumns()
        self._base = first_id  # id of the first of the columns
        self._head = 0  # entries at the front already evicted (removed in bulk)
        self._bytes = 0

    @property
    def first_id(self) -> int:
        return self._base + self._head

    def extend(self, ledger_id: int, first_id: int, entries: list[NewEntry]) -> None:
        if first_id != self._base + len(self._columns) or ledger_id != self._ledger_id:
            self.clear(first_id)  # never leave a hole in the window
            self._ledger_id = ledger_id
        self._bytes += self._columns.extend(entries) + _ENTRY_OVERHEAD * len(entries)
        if self._bytes > self._limit:
            self._evict()

    def get(self, entry_id: int) -> Entry | None:
        index = entry_id - self._base
        if self._head <= index < len(self._columns):
            return self._columns.entry(self._ledger_id, entry_id, index)
        return None

    def window(self, start: int, stop: int, max_bytes: int = 0) -> list[Entry]:
        """The cached entries from ``start`` to ``stop`` (both within the window), cut to
        ``max_bytes`` of data as ``Ledger.read`` cuts (0: no limit)."""
        columns = self._columns
        low = start - self._base
        high = low + count_within(columns.data[low : stop - self._base + 1], max_bytes)
        return columns.entries(self._ledger_id, start, low, high)

    def drop_below(self, entry_id: int) -> None:
        head = max(self._head, min(entry_id - self._base, len(self._columns)))
        dropped = self._columns.data[self._head : head]
        self._bytes -= sum(map(len, dropped)) + _ENTRY_OVERHEAD * len(dropped)
        self._head = head
        self._compact()

    def clear(self, first_id: int | None = None) -> None:
        next_id = self._base + len(self._columns) if first_id is None else first_id
        self._columns = EntryColumns()
        self._base = next_id
        self._head = 0
        self._bytes = 0

    def _evict(self) -> None:
        data = self._columns.data
        head = self._head
        while self._bytes > self._limit and head < len(data):
            self._bytes -= len(data[head]) + _ENTRY_OVERHEAD
            head += 1
        self._head = head
        self._compact()

    def _compact(self) -> None:
        # Free evicted entries a slice at a time: in bulk, so each entry costs O(1) amortised,
        # but in bounded slices, since freeing a whole cache of entries at once took ~5 ms.
        if self._head >= _COMPACT_SLICE:
            self._columns.drop_front(_COMPACT_SLICE)
            self._base += _COMPACT_SLICE
            self._head -= _COMPACT_SLICE


class ReadJob(Job):
    """Byte ranges to read; ``results`` holds one buffer per range."""

    __slots__ = ("on_done", "ranges", "results")

    def __init__(
        self, ranges: list[tuple[int, int, int]], on_done: Callable[[ReadJob], None]
    ) -> None:
        super().__init__()
        self.ranges = ranges
        self.results: list[bytes] = []
        self.on_done = on_done

    def finish(self) -> None:
        self.on_done(self)


def read_batch(jobs: list[Job]) -> None:
    """The reader thread's processor: pread each job's ranges (the GIL is free meanwhile)."""
    for job in jobs:
        if not isinstance(job, ReadJob):
            continue
        try:
            for fd, offset, length in job.ranges:
                data = os.pread(fd, length, offset)
                if len(data) != length:
                    raise OSError(errno.EIO, f"short read: {len(data)} of {length} bytes")
                job.results.append(data)
        except OSError as error:
            job.error = error
