"""Pulsar's two-phase compaction (``AbstractTwoPhaseCompactor``) over a topic's entries.

The input is the previous compacted view followed by the topic's entries after its
horizon, up to the new horizon. Phase one finds, for each key (``partition_key``), the
position (entry id, batch index) of its latest message; a message with an empty payload or
``null_value`` is a tombstone and removes the key. Batches are read message by message
(slots already ``compacted_out`` are skipped). Messages without a key are dropped unless
``topicCompactionRetainNullKey`` (Pulsar's default since 3.x is to drop them). Phase two
copies the entries holding a kept position with their original ids; a batch loses its
dropped messages (see `brokerlet.transport.protocol._batch` for why they are removed rather
than marked ``compacted_out``), and a batch with nothing kept vanishes.

An entry the broker cannot read (a batch compressed with a codec it does not carry, or
malformed metadata) is kept whole: compaction never drops what it cannot judge.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from brokerlet.compaction.view import CompactedView
from brokerlet.storage.ledger import Entry
from brokerlet.transport.protocol import ProtocolError, crc32c, repack_entry, unpack_entry

__all__ = ["CompactionResult", "compact"]

Source = Callable[[], Iterable[Entry]]


@dataclass(frozen=True, slots=True)
class CompactionResult:
    view: CompactedView
    removed: int  # messages compaction dropped (lastCompactionRemovedEventCount)
    scanned: int  # entries read in phase one


def compact(
    previous: CompactedView | None,
    read_topic: Callable[[int, int], Iterator[Entry]],
    ledger_id: int,
    horizon: int,
    *,
    retain_null_key: bool = False,
) -> CompactionResult:
    """Compact ``previous`` + the topic's entries ``previous.horizon + 1 .. horizon``.

    ``read_topic(start, stop)`` yields the stored topic entries with ids in that range
    (inclusive) in order; it is called once per phase.
    """
    start = previous.horizon + 1 if previous is not None else 0

    def source() -> Iterator[Entry]:
        if previous is not None:
            yield from previous.entries
        yield from read_topic(start, horizon)

    latest: dict[str, tuple[int, int] | None] = {}
    kept_whole: set[int] = set()
    keyless: list[tuple[int, int]] = []
    messages = 0
    scanned = 0
    for entry in source():
        scanned += 1
        try:
            _metadata, members = unpack_entry(entry.data)
        except ProtocolError:
            kept_whole.add(entry.entry_id)
            continue
        for member in members:
            if member.compacted_out:
                continue
            messages += 1
            if member.key is None:
                if retain_null_key and not member.tombstone:
                    keyless.append((entry.entry_id, member.index))
                continue
            latest[member.key] = None if member.tombstone else (entry.entry_id, member.index)

    keep: dict[int, set[int]] = {}
    for position in [*latest.values(), *keyless]:
        if position is not None:
            keep.setdefault(position[0], set()).add(position[1])

    kept: list[Entry] = []
    kept_messages = 0
    for entry in source():
        if entry.entry_id in kept_whole:
            kept.append(entry)
            kept_messages += entry.num_messages
            continue
        indexes = keep.get(entry.entry_id)
        if not indexes:
            continue
        kept_messages += len(indexes)
        if -1 in indexes:
            kept.append(entry)
            continue
        if len(indexes) == entry.num_messages:
            kept.append(entry)
            continue
        data, count = repack_entry(entry.data, indexes)
        kept.append(Entry(ledger_id, entry.entry_id, data, crc32c(data), count))
    view = CompactedView(ledger_id, max(horizon, start - 1), kept)
    return CompactionResult(view, max(0, messages - kept_messages), scanned)
