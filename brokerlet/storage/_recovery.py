"""Opening a ledger directory: scan its segments, cut a torn tail, rebuild the index.

Runs once per ledger when a topic is opened, on a thread-pool thread (it reads every
segment). A record that fails its checksum ends the log: its segment is cut back to the last
whole record and any later segment is set aside (renamed ``*.dropped``), so nothing before the
damage is lost and ids stay consecutive. A torn tail after a crash is the expected case and is
logged as a warning; damage in a sealed segment means the disk lied and is logged as an error.
Zeros after the last segment's records are the writer's reserve (`SegmentLog.reserved`): kept
for it to fill, not damage.
"""

from __future__ import annotations

import logging
import os
from array import array
from dataclasses import dataclass

from brokerlet.storage._io import FileOps, StorageError
from brokerlet.storage._records import (
    SEGMENT_HEADER_SIZE,
    parse_segment_header,
    scan_records,
    segment_base,
    segment_name,
)
from brokerlet.storage._segments import SegmentLog

__all__ = ["RecoveredLedger", "RecoveredSegment", "recover_ledger"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class RecoveredSegment:
    """A segment's index: where each of its records starts."""

    base: int
    path: str
    offsets: array[int]
    end: int


@dataclass(slots=True)
class RecoveredLedger:
    segments: list[RecoveredSegment]
    log: SegmentLog


def recover_ledger(
    directory: str, ledger_id: int, segment_bytes: int, ops: FileOps, topic: str
) -> RecoveredLedger:
    """Scan ``directory`` and return the ledger's index and its writer state.

    Raises:
        StorageError: the segments do not belong to this ledger or have a hole between them.
    """
    bases = sorted(
        base for base in (segment_base(name) for name in os.listdir(directory)) if base is not None
    )
    segments: list[RecoveredSegment] = []
    next_id = 0
    reserved = 0
    for position, base in enumerate(bases):
        path = os.path.join(directory, segment_name(base))
        last = position == len(bases) - 1
        if segments and base != next_id:
            raise StorageError(
                f"topic {topic!r}: segment {path} starts at entry {base} but the one before "
                f"ends at entry {next_id - 1}; segments are missing"
            )
        with open(path, "rb") as file:
            data = file.read()
        header = parse_segment_header(data)
        if header is None:
            if not last:
                _drop_from(bases[position:], directory, topic, f"{path} has no valid header")
                break
            # A crash while the segment was being created: it holds no records yet.
            log.warning("topic %r: removing %s, created but never written", topic, path)
            os.unlink(path)
            next_id = base
            break
        if header != (ledger_id, base):
            raise StorageError(
                f"topic {topic!r}: {path} belongs to ledger {header[0]} at entry {header[1]}, "
                f"expected ledger {ledger_id} at entry {base}"
            )
        scan = scan_records(data, SEGMENT_HEADER_SIZE)
        segments.append(RecoveredSegment(base, path, scan.offsets, scan.end))
        next_id = base + len(scan.offsets)
        if scan.zeros:
            if last:
                reserved = len(data)  # the writer goes on filling its zeros
            else:
                # Sealing cuts a segment's zeros first; a crash in between leaves them.
                log.info("topic %r: %s: cutting the zeros after its last record", topic, path)
                _cut(path, scan.end, ops)
        if scan.problem is None:
            continue
        dropped = len(data) - scan.end
        message = "topic %r: %s: %s at offset %d; cut %d bytes after entry %d (kept %d entries)"
        args = (topic, path, scan.problem, scan.end, dropped, next_id - 1, next_id - bases[0])
        if last:
            log.warning(message, *args)
        else:
            log.error(message, *args)
        _cut(path, scan.end, ops)
        if not last:
            _drop_from(bases[position + 1 :], directory, topic, f"{path} is damaged")
            break

    segment_log = SegmentLog(directory, ledger_id, segment_bytes, next_id)
    if segments:
        tail = segments[-1]
        segment_log.fd = os.open(tail.path, os.O_RDWR)
        segment_log.base = tail.base
        segment_log.size = tail.end
        segment_log.reserved = reserved
    else:
        segment_log.base = next_id
    return RecoveredLedger(segments, segment_log)


def _cut(path: str, size: int, ops: FileOps) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        ops.truncate(fd, size)
        ops.sync(fd)
    finally:
        os.close(fd)


def _drop_from(bases: list[int], directory: str, topic: str, reason: str) -> None:
    """Set later segments aside: they follow damage, so their ids can no longer be kept."""
    for base in bases:
        path = os.path.join(directory, segment_name(base))
        log.error("topic %r: %s; setting %s aside as %s.dropped", topic, reason, path, path)
        os.replace(path, path + ".dropped")
