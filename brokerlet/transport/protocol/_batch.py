"""Batch members of a stored entry, for the broker's own reading (compaction).

The broker otherwise forwards entries verbatim; compaction needs each message's key and
whether it is a tombstone, and rewrites a batch with only the messages it keeps.

Pulsar's ``RawBatchConverter`` keeps the dropped slots as ``compacted_out`` with empty
payloads (so kept messages keep their batch index) and its dispatcher hides them with the
delivery's ``ack_set``. brokerlet sends no ``ack_set`` yet, and the C++ client (3.13 /
4.2.0) hands ``compacted_out`` slots to the application as empty messages (observed), which
a TableView would take for tombstones; so the dropped slots are removed instead, and a
kept batched message's batch index in the compacted view is its place among the kept ones.
Slots already marked ``compacted_out`` (a batch compacted by Pulsar) are read as absent.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from brokerlet.transport.protocol import pulsar_pb2 as pb
from brokerlet.transport.protocol._errors import ProtocolError
from brokerlet.transport.protocol._payload import (
    _check_entry,
    build_entry,
    encode_batch,
    parse_metadata,
    split_batch,
)

__all__ = ["Member", "UnreadableBatchError", "repack_entry", "unpack_entry"]


class UnreadableBatchError(ProtocolError):
    """The entry's batch cannot be read by the broker (a codec it does not carry)."""


@dataclass(frozen=True, slots=True)
class Member:
    """One message of an entry: its batch index (-1 for an unbatched entry), key and
    whether it deletes the key (empty payload or ``null_value``)."""

    index: int
    key: str | None
    tombstone: bool
    compacted_out: bool = False


def _uncompress(metadata: pb.MessageMetadata, payload: bytes) -> bytes:
    if metadata.compression == pb.NONE:
        return payload
    if metadata.compression == pb.ZLIB:
        try:
            return zlib.decompress(payload)
        except zlib.error as error:
            raise ProtocolError(f"undecodable ZLIB batch: {error}") from None
    name = pb.CompressionType.Name(metadata.compression)
    raise UnreadableBatchError(f"batch compressed with {name}: the broker reads NONE and ZLIB only")


def _key(holder: pb.MessageMetadata | pb.SingleMessageMetadata) -> str | None:
    if holder.HasField("partition_key") and not holder.null_partition_key:
        return holder.partition_key
    return None


def unpack_entry(entry: bytes) -> tuple[pb.MessageMetadata, list[Member]]:
    """The entry's metadata and its messages in order.

    Raises:
        ProtocolError: the entry or its batch is malformed.
        UnreadableBatchError: a batch compressed with a codec the broker does not read.
    """
    metadata = parse_metadata(entry)
    payload = entry[4 + _check_entry(entry) :]
    if not metadata.HasField("num_messages_in_batch"):
        if metadata.HasField("uncompressed_size"):
            empty = metadata.uncompressed_size == 0
        else:
            empty = len(payload) == 0
        return metadata, [Member(-1, _key(metadata), empty or metadata.null_value)]
    members = []
    batch = split_batch(_uncompress(metadata, payload), metadata.num_messages_in_batch)
    for index, (single, _body) in enumerate(batch):
        tombstone = single.null_value or single.payload_size == 0
        members.append(Member(index, _key(single), tombstone, single.compacted_out))
    return metadata, members


def repack_entry(entry: bytes, keep: set[int]) -> tuple[bytes, int]:
    """The batch entry with only its messages at indexes ``keep`` (in order), and their
    number. ZLIB batches are recompressed."""
    metadata = parse_metadata(entry)
    payload = entry[4 + _check_entry(entry) :]
    batch = split_batch(_uncompress(metadata, payload), metadata.num_messages_in_batch)
    kept = [
        (single, body)
        for index, (single, body) in enumerate(batch)
        if index in keep and not single.compacted_out
    ]
    plain = encode_batch(kept)
    updated = pb.MessageMetadata()
    updated.CopyFrom(metadata)
    updated.num_messages_in_batch = len(kept)
    updated.uncompressed_size = len(plain)
    body = zlib.compress(plain) if metadata.compression == pb.ZLIB else plain
    return build_entry(updated, body), len(kept)
