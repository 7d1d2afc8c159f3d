"""The ledger interface and its in-memory back-end.

A topic owns one ledger: an append-only sequence of entries with consecutive ids. An entry is
exactly what a producer sent after the checksum (``[metadata size][metadata][payload]``), kept
verbatim so that batches, compression, chunks and properties need no broker code.

The interface is asynchronous (completion callbacks) so that a durable back-end can do its I/O
off the actor greenlets; the in-memory back-end completes at once, on the caller's stack.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Sequence
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import NamedTuple, Protocol, TypeAlias

from brokerlet.storage.retention import SegmentInfo

__all__ = [
    "PLAIN_UNHASHED",
    "AppendCallback",
    "Entry",
    "EntryColumns",
    "Ledger",
    "MemoryLedger",
    "NewEntry",
    "ReadCallback",
    "data_of",
    "key_hash_of",
    "messages_of",
    "new_entry",
    "new_entry_data",
    "new_entry_messages",
]


NewEntry: TypeAlias = tuple[bytes, int, int, int]
"""An entry to append: a plain tuple ``(data, checksum, num_messages, key_hash)``.

- data: ``[metadata size][metadata][payload]`` as the producer sent it.
- checksum: CRC32C of ``data`` (kept so a delivery needs no recomputation).
- num_messages: messages in the entry (``num_messages_in_batch`` for a batch, else 1).
- key_hash: what the SEND's check learnt of the metadata on the way: above 0, the Key_Shared
  sticky-key hash of the partition key it read; `PLAIN_UNHASHED`, the plain layout with no
  hash taken (no delivery time either); 0, nothing (an unusual layout, or an entry read back
  from a segment): read it when needed.

Not a NamedTuple: one is built for every message, and a tuple subclass costs about five
times a tuple to build and free (the four built per SEND were a quarter of the compiled
produce path; docs/performance.md, twenty-fourth pass). Readers unpack it or take its
fields by position (`new_entry_data`, ...).
"""


def new_entry(data: bytes, checksum: int, num_messages: int, key_hash: int = 0) -> NewEntry:
    """A `NewEntry`, built by name."""
    return (data, checksum, num_messages, key_hash)


class Entry(NamedTuple):
    """A stored entry, addressed by ``(ledger_id, entry_id)``.

    Built when an entry is read. The ledgers keep plain tuples of ints and bytes instead, which
    the garbage collector stops tracking (it keeps tracking a NamedTuple), so a broker holding
    millions of entries does not walk them in every full collection.
    """

    ledger_id: int
    entry_id: int
    data: bytes
    checksum: int
    num_messages: int
    key_hash: int = 0  # as NewEntry's: kept in memory and the tail cache, 0 from a segment

    @property
    def size(self) -> int:
        return len(self.data)


PLAIN_UNHASHED = -1
"""An entry's ``key_hash`` when its SEND had the plain metadata layout but no key was hashed:
it has no ``deliver_at_time`` (that field is not in the layout); its sticky key is read
when needed. Every non-zero ``key_hash`` says the same of the delivery time."""

# An Entry's fields for C-level loops: sum(map(messages_of, ...)).
messages_of = attrgetter("num_messages")
data_of = attrgetter("data")
key_hash_of = attrgetter("key_hash")
# A NewEntry's, by position.
new_entry_data = itemgetter(0)
new_entry_messages = itemgetter(2)

_as_entry = tuple.__new__  # Entry from a tuple of its fields, without its Python constructor


def count_within(data: Sequence[bytes], max_bytes: int) -> int:
    """How many of the first items of ``data`` fit in ``max_bytes`` together, but at least
    one; all of them when ``max_bytes`` is 0 or less (a read's byte limit, ``Ledger.read``)."""
    if max_bytes <= 0 or sum(map(len, data)) <= max_bytes:
        return len(data)  # the usual read: all of it fits, summed in C
    total = 0
    for count, item in enumerate(data):
        total += len(item)
        if total > max_bytes and count > 0:
            return count
    return len(data)


class EntryColumns:
    """Stored entries as columns: their data in a list, checksums, message counts and key
    hashes in arrays, indexed from 0; `Entry` objects are made as entries are read.

    No object per entry for the garbage collector. A tuple per entry is tracked from its
    creation until a collection untracks it: under sustained produce the stored entries were
    5,000-10,000 of the 10,000-13,000 objects at each young collection.
    """

    __slots__ = ("checksums", "data", "key_hashes", "messages")

    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.checksums = array("L")
        self.messages = array("l")
        self.key_hashes = array("i")  # 31-bit hashes, 0 or PLAIN_UNHASHED

    def __len__(self) -> int:
        return len(self.data)

    def extend(self, entries: Sequence[NewEntry]) -> int:
        """Append entries; returns the bytes of their data."""
        if not entries:
            return 0
        # NewEntry's four columns (unpacking checks there are four). An array takes a list
        # through a fast path, and a tuple one item at a time: about 30% less per entry.
        data, checksums, messages, key_hashes = zip(*entries, strict=False)
        self.data += data
        self.checksums.fromlist(list(checksums))
        self.messages.fromlist(list(messages))
        self.key_hashes.fromlist(list(key_hashes))
        return sum(map(len, data))

    def entry(self, ledger_id: int, entry_id: int, index: int) -> Entry:
        return Entry(
            ledger_id,
            entry_id,
            self.data[index],
            self.checksums[index],
            self.messages[index],
            self.key_hashes[index],
        )

    def entries(self, ledger_id: int, first_id: int, low: int, high: int) -> list[Entry]:
        """The entries at indexes ``low`` to ``high - 1``, the first of them ``first_id``;
        built with ``zip`` and ``map``, in C."""
        fields = zip(
            repeat(ledger_id),
            range(first_id, first_id + high - low),
            self.data[low:high],
            self.checksums[low:high],
            self.messages[low:high],
            self.key_hashes[low:high],
        )
        return list(map(_as_entry, repeat(Entry), fields))

    def drop_front(self, count: int) -> None:
        del self.data[:count]
        del self.checksums[:count]
        del self.messages[:count]
        del self.key_hashes[:count]


AppendCallback = Callable[[int | BaseException], None]
"""Called with the id of the first appended entry, or with the error that failed the append."""

ReadCallback = Callable[[list[Entry] | BaseException], None]


class Ledger(Protocol):
    """What a topic needs from storage.

    Entry ids are consecutive from ``first_entry_id`` to ``last_entry_id``; an empty ledger has
    ``last_entry_id == first_entry_id - 1``.
    """

    @property
    def ledger_id(self) -> int: ...

    @property
    def first_entry_id(self) -> int: ...

    @property
    def last_entry_id(self) -> int: ...

    def append(self, entries: Sequence[NewEntry], callback: AppendCallback) -> None:
        """Append ``entries`` together; ``callback`` runs once they are stored."""

    def read(self, start: int, max_entries: int, max_bytes: int, callback: ReadCallback) -> None:
        """Read consecutive entries from ``start``: at least one if any exists, at most
        ``max_entries``, and no more than ``max_bytes`` after the first."""

    def read_ids(self, entry_ids: Sequence[int], callback: ReadCallback) -> None:
        """Read the given entries; ids that no longer exist are skipped."""

    def trim(self, up_to: int) -> None:
        """Delete every whole segment whose entries all have ids ``<= up_to``."""

    consumed_up_to: int | None
    """The slowest durable subscription's mark-delete id (None: no durable subscription);
    set by the topic, read by retention (`brokerlet.storage.retention`)."""

    new: bool
    """Created by this run and not yet on disk: no file of it (a compacted view, a terminated
    mark, a cursors file) can exist, so opening its topic looks for none."""

    def close(self) -> None: ...


class MemoryLedger:
    """A ledger kept in a Python list; completes every call before returning.

    Entries are kept as :class:`EntryColumns`, so the garbage collector has no object per
    entry to look at, in young collections or full ones.

    The entries are grouped in segment-sized chunks (``segment_bytes``, like the disk
    ledger's segment files) and retention drops whole chunks only, so an embedded broker
    and ``brokerlet serve`` agree on what a late subscriber from Earliest still sees.
    """

    def __init__(self, ledger_id: int, segment_bytes: int = 64 * 1024 * 1024) -> None:
        self._ledger_id = ledger_id
        self._segment_bytes = segment_bytes
        self._columns = EntryColumns()
        self._first = 0  # entry id of the first of the columns
        self._dropped = 0  # trimmed entries still at the head of the list (compacted lazily)
        self._bytes = 0
        # Chunks, oldest first: [first entry id, bytes, epoch ms of the newest entry].
        self._chunks: list[list[int]] = []
        self._closed = False
        self.consumed_up_to: int | None = None
        self.new = False  # nothing of it is ever on disk, so there is nothing to skip
        self.compacted_view: object = None  # kept here so it outlives the topic actor

    @property
    def ledger_id(self) -> int:
        return self._ledger_id

    @property
    def first_entry_id(self) -> int:
        return self._first + self._dropped

    @property
    def last_entry_id(self) -> int:
        return self._first + len(self._columns) - 1

    @property
    def size_bytes(self) -> int:
        return self._bytes

    @property
    def closed(self) -> bool:
        return self._closed

    def append(self, entries: Sequence[NewEntry], callback: AppendCallback) -> None:
        first_id = self.last_entry_id + 1
        chunks = self._chunks
        if not chunks or chunks[-1][1] >= self._segment_bytes:
            chunks.append([first_id, 0, 0])
        chunk = chunks[-1]
        added = self._columns.extend(entries)
        self._bytes += added
        chunk[1] += added
        chunk[2] = int(time.time() * 1000)
        callback(first_id)

    def read(self, start: int, max_entries: int, max_bytes: int, callback: ReadCallback) -> None:
        start = max(start, self.first_entry_id)
        begin = start - self._first
        columns = self._columns
        end = begin + count_within(columns.data[begin : begin + max_entries], max_bytes)
        callback(columns.entries(self._ledger_id, start, begin, end))

    def read_ids(self, entry_ids: Sequence[int], callback: ReadCallback) -> None:
        low = self.first_entry_id
        high = self.last_entry_id
        ledger_id = self._ledger_id
        entry = self._columns.entry
        first = self._first
        callback([entry(ledger_id, i, i - first) for i in entry_ids if low <= i <= high])

    def bytes_from(self, entry_id: int) -> int:
        """Bytes of the entries from ``entry_id`` to the end."""
        begin = max(entry_id, self.first_entry_id) - self._first
        return sum(map(len, self._columns.data[begin:]))

    # Retention.

    @property
    def oldest_sealed_last_id(self) -> int | None:
        """The last entry id of the oldest sealed chunk; None while only the open one exists."""
        chunks = self._chunks
        return chunks[1][0] - 1 if len(chunks) > 1 else None

    def segments(self) -> list[SegmentInfo]:
        chunks = self._chunks
        last = self.last_entry_id
        return [
            SegmentInfo(
                chunk[0], chunks[i + 1][0] - 1 if i + 1 < len(chunks) else last, chunk[1], chunk[2]
            )
            for i, chunk in enumerate(chunks)
        ]

    def drop_segments(self, count: int) -> None:
        """Delete the oldest ``count`` chunks (never the newest)."""
        count = min(count, len(self._chunks) - 1)
        if count <= 0:
            return
        up_to = self._chunks[count][0] - 1
        del self._chunks[:count]
        self._forget_through(up_to)

    def forget_entries(self, up_to: int) -> None:
        """Forget every entry up to ``up_to`` one by one, whatever the chunks: for
        non-persistent topics, which keep nothing for retention (data rules apply to
        persistent topics only)."""
        up_to = min(up_to, self.last_entry_id)
        if up_to < self.first_entry_id:
            return
        while len(self._chunks) > 1 and self._chunks[1][0] <= up_to + 1:
            del self._chunks[0]
        self._forget_through(up_to)

    def _forget_through(self, up_to: int) -> None:
        head = self._dropped
        newly = up_to - self.first_entry_id + 1
        self._bytes -= sum(map(len, self._columns.data[head : head + newly]))
        self._dropped += newly
        # Compact in bulk so trimming stays amortised O(1) per entry.
        if self._dropped >= 1024 and self._dropped * 2 >= len(self._columns):
            self._columns.drop_front(self._dropped)
            self._first += self._dropped
            self._dropped = 0

    def trim(self, up_to: int) -> None:
        count = 0
        for segment in self.segments()[:-1]:
            if segment.last_id > up_to:
                break
            count += 1
        self.drop_segments(count)

    def close(self) -> None:
        self._closed = True
        self._columns = EntryColumns()
        self._chunks.clear()
        self._bytes = 0
