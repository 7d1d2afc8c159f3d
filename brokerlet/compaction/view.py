"""A compacted view: a ledger of its own beside the topic, plus its horizon.

The view holds, in entry-id order, the entries compaction kept (original ids, so message
ids resolve as on Pulsar) and ``horizon``, the last topic entry it covers. A
``read_compacted`` subscription reads the view up to the horizon, then the topic after it.

On disk the view is one file, ``compacted``, in the topic's directory, replaced atomically
(written beside, synced, renamed, directory synced): a compaction interrupted at any point
leaves the previous view intact. Format: ``BRKC`` u32 version, u64 horizon + 1, u32 count,
then per entry u64 id, u32 checksum, u32 messages, u32 length and the data; a CRC32C of
everything before it closes the file.
"""

from __future__ import annotations

import bisect
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from brokerlet.storage._io import FileOps, write_file_atomically
from brokerlet.storage.ledger import Entry
from brokerlet.transport.protocol import crc32c

__all__ = ["VIEW_FILE", "CompactedView", "CorruptViewError", "load_view", "save_view"]

VIEW_FILE = "compacted"
_MAGIC = b"BRKC"
_VERSION = 1
_HEADER = struct.Struct(">4sIQI")
_ENTRY = struct.Struct(">QIII")
_CRC = struct.Struct(">I")


class CorruptViewError(Exception):
    """The view file is damaged (it is then ignored; the topic itself is intact)."""


@dataclass(slots=True)
class CompactedView:
    """The kept entries (ascending ids) and the last topic entry they cover."""

    ledger_id: int
    horizon: int
    entries: list[Entry] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ids = [entry.entry_id for entry in self.entries]

    @property
    def first_id(self) -> int:
        return self.ids[0] if self.ids else self.horizon + 1

    @property
    def size_bytes(self) -> int:
        return sum(len(entry.data) for entry in self.entries)

    def read(self, start: int, max_entries: int) -> list[Entry]:
        """Kept entries with ids >= ``start``, at most ``max_entries``."""
        index = bisect.bisect_left(self.ids, start)
        return self.entries[index : index + max_entries]

    def read_ids(self, entry_ids: Sequence[int]) -> dict[int, Entry]:
        found = {}
        for entry_id in entry_ids:
            index = bisect.bisect_left(self.ids, entry_id)
            if index < len(self.ids) and self.ids[index] == entry_id:
                found[entry_id] = self.entries[index]
        return found

    def encode(self) -> bytes:
        parts = [_HEADER.pack(_MAGIC, _VERSION, self.horizon + 1, len(self.entries))]
        for entry in self.entries:
            parts.append(
                _ENTRY.pack(entry.entry_id, entry.checksum, entry.num_messages, len(entry.data))
            )
            parts.append(entry.data)
        body = b"".join(parts)
        return body + _CRC.pack(crc32c(body))

    @classmethod
    def decode(cls, blob: bytes, ledger_id: int) -> CompactedView:
        if len(blob) < _HEADER.size + _CRC.size:
            raise CorruptViewError(f"view file of {len(blob)} bytes is too short")
        body, (stored,) = blob[: -_CRC.size], _CRC.unpack(blob[-_CRC.size :])
        if crc32c(body) != stored:
            raise CorruptViewError("view file checksum mismatch")
        magic, version, horizon_plus_one, count = _HEADER.unpack_from(body, 0)
        if magic != _MAGIC or version != _VERSION:
            raise CorruptViewError(f"not a view file of version {_VERSION}")
        offset = _HEADER.size
        entries = []
        for _ in range(count):
            entry_id, checksum, messages, length = _ENTRY.unpack_from(body, offset)
            offset += _ENTRY.size
            entries.append(
                Entry(ledger_id, entry_id, body[offset : offset + length], checksum, messages)
            )
            offset += length
        return cls(ledger_id, horizon_plus_one - 1, entries)


def save_view(directory: str, view: CompactedView, ops: FileOps | None = None) -> None:
    """Replace the directory's view file (blocking: call on a thread-pool thread)."""
    write_file_atomically(
        ops or FileOps(), os.path.join(directory, VIEW_FILE), view.encode(), sync=True
    )


def load_view(directory: str, ledger_id: int) -> CompactedView | None:
    """The directory's view, or None when there is none (blocking)."""
    try:
        with open(os.path.join(directory, VIEW_FILE), "rb") as file:
            blob = file.read()
    except FileNotFoundError:
        return None
    return CompactedView.decode(blob, ledger_id)
