"""Where a topic's producer state lives between runs, and how dedup state is rebuilt.

The topic epoch and the deduplication snapshot are properties of the topic's cursor store
(one JSON file with the cursors, written after the ledger is synced); an in-memory topic
keeps them in `MemoryProperties`. At start the dedup snapshot is loaded and the entries
stored after it are replayed from their metadata (`recover`), as Pulsar replays its dedup
cursor.
"""

from __future__ import annotations

import struct
from typing import Any, Protocol

import gevent.event

from brokerlet.producers.dedup import Deduplication
from brokerlet.storage.ledger import Ledger
from brokerlet.transport.protocol import ProtocolError, parse_metadata, pb

__all__ = [
    "DEDUP_KEY",
    "EPOCH_KEY",
    "MemoryProperties",
    "Properties",
    "is_last_chunk",
    "may_be_chunked",
    "recover",
    "sequence_of",
]

EPOCH_KEY = "topic_epoch"
DEDUP_KEY = "deduplication"
_REPLAY_WINDOW = 500  # entries per read while replaying
_REPLAY_BYTES = 8 << 20


class Properties(Protocol):
    def properties(self) -> dict[str, Any]: ...

    def set_property(self, key: str, value: Any) -> None: ...


class MemoryProperties:
    """Properties of an in-memory topic: they live as long as the process."""

    def __init__(self) -> None:
        self._values: dict[str, Any] = {}

    def properties(self) -> dict[str, Any]:
        return dict(self._values)

    def set_property(self, key: str, value: Any) -> None:
        self._values[key] = value


def is_last_chunk(metadata: pb.MessageMetadata) -> bool:
    """True unless the entry is a chunk of a chunked message other than its last one."""
    chunks = metadata.num_chunks_from_msg
    return chunks <= 1 or metadata.chunk_id == chunks - 1


_CHUNKS_TAG = bytes([27 << 3, 0x01])  # MessageMetadata.num_chunks_from_msg = 27, a varint
_METADATA_SIZE = struct.Struct(">I").unpack_from


def may_be_chunked(entry: bytes) -> bool:
    """False when the entry's metadata surely has no ``num_chunks_from_msg``: a byte scan,
    a quarter of a full parse; True may be a false alarm (the caller then parses). The entry
    starts with its 4-byte metadata size, as every entry a SEND brings does."""
    return entry.find(_CHUNKS_TAG, 4, 4 + _METADATA_SIZE(entry)[0]) >= 0


def sequence_of(metadata: pb.MessageMetadata) -> int:
    """The highest sequence id an entry holds.

    ``highest_sequence_id`` where the client set it (the Java client does); otherwise a batch
    of n is taken to hold ``sequence_id .. sequence_id + n - 1`` (the C++ client numbers a
    batch's messages one by one), never more than the entry can prove.
    """
    if metadata.highest_sequence_id > metadata.sequence_id:
        return metadata.highest_sequence_id
    return metadata.sequence_id + max(metadata.num_messages_in_batch, 1) - 1


def recover(ledger: Ledger, dedup: Deduplication, snapshot: Any, *, timeout: float = 60) -> int:
    """Load ``snapshot`` into ``dedup`` and replay the entries stored after it.

    Returns the number of entries replayed. Runs in a greenlet (a disk ledger reads on the
    hub's thread pool).
    """
    start = max(dedup.restore(snapshot) + 1, ledger.first_entry_id)
    replayed = 0
    while start <= ledger.last_entry_id:
        result: gevent.event.AsyncResult = gevent.event.AsyncResult()
        ledger.read(start, _REPLAY_WINDOW, _REPLAY_BYTES, result.set)
        entries = result.get(timeout=timeout)
        if isinstance(entries, BaseException):
            raise entries
        if not entries:
            break
        for entry in entries:
            try:
                metadata = parse_metadata(entry.data)
            except ProtocolError:
                continue
            if is_last_chunk(metadata):
                dedup.replay(metadata.producer_name, sequence_of(metadata))
        replayed += len(entries)
        start = entries[-1].entry_id + 1
    return replayed
