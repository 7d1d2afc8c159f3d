"""Batch-index acknowledgement: which members of a batch entry are acknowledged.

An ACK's ``ack_set`` is a Java BitSet as int64 words (bit i in word i // 64) where a set bit
means "not acknowledged yet"; the client starts from all ones over the batch size and clears
what it acks. The subscription ANDs each ack set into what it knows; when no bit is left the
entry is acknowledged as a whole. Until then a redelivery carries the remaining set in
CommandMessage.ack_set, so the client skips the members acked already, and the entry counts
only its unacknowledged members against permits and unacked limits (as Pulsar's
``Consumer.sendMessages`` does with ``batchIndexesAcks``).

Bad ack sets (more words than the batch needs, bits past the batch, an unbatched entry) are
ignored with a debug log and change nothing. Kept only with
``acknowledgment_at_batch_index_level_enabled``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from brokerlet.storage.ledger import Entry

__all__ = ["BatchAckFilter", "BatchAcks"]

log = logging.getLogger(__name__)

_WORD = 64
_WORD_MASK = (1 << _WORD) - 1


def _to_bits(words: Sequence[int]) -> int:
    bits = 0
    for index, word in enumerate(words):
        bits |= (word & _WORD_MASK) << (_WORD * index)
    return bits


def _to_words(bits: int, size: int) -> list[int]:
    words = []
    for index in range((size + _WORD - 1) // _WORD):
        word = (bits >> (_WORD * index)) & _WORD_MASK
        words.append(word - (1 << _WORD) if word >> (_WORD - 1) else word)  # as int64
    return words


class BatchAcks:
    """Partially acknowledged batch entries: entry id -> (batch size, bits not yet acked)."""

    __slots__ = ("_partial",)

    def __init__(self) -> None:
        self._partial: dict[int, tuple[int, int]] = {}

    def __bool__(self) -> bool:
        return bool(self._partial)

    def __len__(self) -> int:
        return len(self._partial)

    def __contains__(self, entry_id: int) -> bool:
        return entry_id in self._partial

    def size_of(self, entry_id: int) -> int | None:
        known = self._partial.get(entry_id)
        return None if known is None else known[0]

    def apply(self, entry_id: int, words: Sequence[int], batch_size: int) -> int | None:
        """AND ``words`` into the entry's state. Returns how many members are left
        unacknowledged (0: the entry is acknowledged, its state dropped), or None if the ack
        set was bad and ignored."""
        if batch_size <= 1:
            log.debug("ack_set on unbatched entry %d ignored", entry_id)
            return None
        if len(words) > (batch_size + _WORD - 1) // _WORD:
            log.debug("ack_set of %d words for a batch of %d ignored", len(words), batch_size)
            return None
        bits = _to_bits(words)
        if bits >> batch_size:
            log.debug(
                "ack_set with bits past a batch of %d ignored (entry %d)", batch_size, entry_id
            )
            return None
        known = self._partial.get(entry_id)
        if known is not None:
            bits &= known[1]
        left = bits.bit_count()
        if left:
            self._partial[entry_id] = (batch_size, bits)
        else:
            self._partial.pop(entry_id, None)
        return left

    def remaining(self, entry_id: int) -> int | None:
        known = self._partial.get(entry_id)
        return None if known is None else known[1].bit_count()

    def words(self, entry_id: int) -> list[int] | None:
        """The entry's ack set for a MESSAGE, or None if nothing of it is acked."""
        known = self._partial.get(entry_id)
        return None if known is None else _to_words(known[1], known[0])

    def forget(self, entry_id: int) -> None:
        self._partial.pop(entry_id, None)

    def forget_up_to(self, entry_id: int) -> None:
        for done in [e for e in self._partial if e <= entry_id]:
            del self._partial[done]

    def clear(self) -> None:
        self._partial.clear()

    def state(self) -> dict[int, list[int]]:
        """Entry id -> ``[batch size, ack-set words...]``, for saving with the cursor."""
        return {e: [size, *_to_words(bits, size)] for e, (size, bits) in self._partial.items()}

    def restore(self, state: dict[int, list[int]], mark_delete: int) -> None:
        """Take back what :meth:`state` saved, past ``mark_delete``; bad records are skipped."""
        for entry_id, (size, *words) in state.items():
            if entry_id > mark_delete and size > 1:
                self.apply(entry_id, words, size)


class BatchAckFilter:
    """The delivery filter: a partially acked entry goes out counting only its unacked
    members (the strategy charges permits and limits from ``num_messages``)."""

    __slots__ = ("_acks",)

    def __init__(self, acks: BatchAcks) -> None:
        self._acks = acks

    def admit(self, entries: list[Entry], *, replay: bool) -> list[Entry]:
        acks = self._acks
        if not acks:
            return entries
        out = []
        for entry in entries:
            left = acks.remaining(entry.entry_id)
            out.append(entry if left is None else entry._replace(num_messages=left))
        return out

    def release_due(self) -> None:
        pass

    def reset(self) -> None:
        pass
