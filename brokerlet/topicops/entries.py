"""Reading single entries for operators: blocking reads, publish times, Pulsar's headers."""

from __future__ import annotations

import contextlib
import json
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime

import gevent.event

from brokerlet.storage.ledger import Entry, Ledger
from brokerlet.transport.protocol import ProtocolError, parse_metadata, pb

__all__ = ["StoredMessage", "find_newest_at_or_before", "publish_time", "read_entry", "stored"]


def read_entry(ledger: Ledger, entry_id: int, timeout: float = 30.0) -> Entry | None:
    """The entry ``entry_id`` of ``ledger``, or None when it is not (or no longer) there.

    Blocks the calling greenlet until the read completes: the callback sets the result
    directly, so this works for the in-memory ledger (at once) and the disk ledger (later, on
    the hub) alike, and never needs the calling actor's mailbox.
    """
    if not ledger.first_entry_id <= entry_id <= ledger.last_entry_id:
        return None
    result: gevent.event.AsyncResult = gevent.event.AsyncResult()
    ledger.read_ids([entry_id], result.set)
    entries = result.get(timeout=timeout)
    if isinstance(entries, BaseException):
        raise entries
    return entries[0] if entries else None


def publish_time(entry: Entry) -> int:
    """The entry's publish time (epoch ms); 0 when its metadata cannot be read."""
    try:
        return int(parse_metadata(entry.data).publish_time)
    except ProtocolError:
        return 0


def find_newest_at_or_before(ledger: Ledger, time_ms: int) -> int:
    """The id of the newest entry published at or before ``time_ms`` (binary search, as
    Pulsar's PersistentMessageFinder does); ``first_entry_id - 1`` when there is none."""
    low, high = ledger.first_entry_id, ledger.last_entry_id
    found = low - 1
    while low <= high:
        middle = (low + high) // 2
        entry = read_entry(ledger, middle)
        if entry is None:
            break
        if publish_time(entry) <= time_ms:
            found = middle
            low = middle + 1
        else:
            high = middle - 1
    return found


_COMPRESSION_NAMES = {
    pb.NONE: "NONE",
    pb.LZ4: "LZ4",
    pb.ZLIB: "ZLIB",
    pb.ZSTD: "ZSTD",
    pb.SNAPPY: "SNAPPY",
}


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """One stored entry as the admin API returns it: payload and Pulsar's headers."""

    ledger_id: int
    entry_id: int
    payload: bytes
    headers: dict[str, str] = field(default_factory=dict)


def _iso(ms: int) -> str:
    # common/util/DateFormatter: ISO-8601 with an offset.
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


def stored(entry: Entry) -> StoredMessage:
    """The admin API's view of ``entry`` (PersistentTopicsBase#generateResponseWithEntry).

    The payload is decompressed where the standard library can (ZLIB); other codecs are
    returned as stored, with ``X-Pulsar-compression`` naming the codec.
    """
    try:
        metadata = parse_metadata(entry.data)
    except ProtocolError:
        return StoredMessage(entry.ledger_id, entry.entry_id, entry.data, {})
    size = int.from_bytes(entry.data[:4], "big")
    payload = entry.data[4 + size :]
    headers: dict[str, str] = {
        "X-Pulsar-Message-ID": f"{entry.ledger_id}:{entry.entry_id}",
        "X-Pulsar-publish-time": _iso(metadata.publish_time),
        "X-Pulsar-producer-name": metadata.producer_name,
        "X-Pulsar-sequence-id": str(metadata.sequence_id),
    }
    if metadata.HasField("event_time") and metadata.event_time:
        headers["X-Pulsar-event-time"] = _iso(metadata.event_time)
    if metadata.HasField("partition_key"):
        headers["X-Pulsar-partition-key"] = metadata.partition_key
    if metadata.HasField("null_value") and metadata.null_value:
        headers["X-Pulsar-null-value"] = "true"
    if metadata.HasField("num_messages_in_batch"):
        headers["X-Pulsar-num-batch-message"] = str(metadata.num_messages_in_batch)
        headers["X-Pulsar-batch-size"] = str(len(payload))
    if metadata.HasField("compression") and metadata.compression != pb.NONE:
        headers["X-Pulsar-compression"] = _COMPRESSION_NAMES.get(
            metadata.compression, str(metadata.compression)
        )
        headers["X-Pulsar-uncompressed-size"] = str(metadata.uncompressed_size)
        if metadata.compression == pb.ZLIB:
            with contextlib.suppress(zlib.error):
                payload = zlib.decompress(payload)
    properties = {p.key: p.value for p in metadata.properties}
    if properties:
        # Both forms: one header per key (older admin clients) and one JSON object
        # (apache/pulsar PR #20627).
        for key, value in properties.items():
            headers[f"X-Pulsar-PROPERTY-{key}"] = value
        headers["X-Pulsar-PROPERTY"] = json.dumps(properties)
    return StoredMessage(entry.ledger_id, entry.entry_id, payload, headers)
