"""Draining hashes (PIP-379): keys that stay blocked until their old owner acks them.

When a membership change moves a hash range away from consumer A, A may still hold
unacked messages with hashes in it. Each such pending ack adds a reference to a
draining entry for that hash, owned by A. While the entry exists, dispatching that
hash to any other consumer is blocked, so a key is never unacked at two consumers
at once. A's acks (and its close) remove the references; when the last one goes
and another consumer had been blocked on the hash, the tracker reports the hash as
unblocked so the dispatcher reads again.

Used only for AUTO_SPLIT without out-of-order delivery. Hash 0 ("not set") is never
tracked. Not thread-safe: the dispatcher actor owns its tracker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Generic, TypedDict, TypeVar

from brokerlet.keyshared.hashing import STICKY_KEY_HASH_NOT_SET

__all__ = [
    "BATCH_UNBLOCKED",
    "DrainingHashConflictError",
    "DrainingHashEntry",
    "DrainingHashStats",
    "DrainingHashesTracker",
    "DrainingStats",
]

BATCH_UNBLOCKED = -1
"""What `on_unblocked` receives when a batch of reductions unblocked some hashes."""

ConsumerT = TypeVar("ConsumerT")


class DrainingHashConflictError(RuntimeError):
    """A consumer touched a hash that another consumer is draining."""


@dataclass(eq=False)
class DrainingHashEntry(Generic[ConsumerT]):
    """One draining hash. Owned by the tracker: read it, do not change it.

    Attributes:
        consumer: the consumer whose pending acks hold the hash; it cannot change,
            because no other consumer may receive the hash meanwhile.
        ref_count: how many of its pending acks have the hash.
        blocked_count: how many times dispatching the hash elsewhere was refused.
    """

    consumer: ConsumerT
    ref_count: int = 0
    blocked_count: int = 0


class DrainingHashStats(TypedDict):
    """One draining hash in consumer stats (Pulsar's ``DrainingHash``)."""

    hash: int
    unackMsgs: int
    blockedAttempts: int


class DrainingStats(TypedDict):
    """The draining fields of a consumer's stats, named as in Pulsar's admin API."""

    drainingHashesCount: int
    drainingHashesClearedTotal: int
    drainingHashesUnackedMessages: int
    drainingHashes: list[DrainingHashStats]


@dataclass(eq=False)
class _ConsumerRecord(Generic[ConsumerT]):
    consumer: ConsumerT
    hashes: set[int] = field(default_factory=set)
    cleared_total: int = 0


class DrainingHashesTracker(Generic[ConsumerT]):
    """Reference-counted draining hashes, each owned by one consumer.

    Args:
        on_unblocked: called with a hash when its last reference is removed, it had
            blocked another consumer, and its owner is not closing; or once with
            `BATCH_UNBLOCKED` at the end of a batch in which that happened. The
            dispatcher requests a read from it. The tracker's state is already
            updated when it runs.
    """

    def __init__(self, on_unblocked: Callable[[int], None]) -> None:
        self._on_unblocked = on_unblocked
        self._entries: dict[int, DrainingHashEntry[ConsumerT]] = {}
        self._records: dict[int, _ConsumerRecord[ConsumerT]] = {}  # by id(consumer)
        self._batch_depth = 0
        self._unblocked_in_batch = False

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key_hash: object) -> bool:
        return key_hash in self._entries

    def entry(self, key_hash: int) -> DrainingHashEntry[ConsumerT] | None:
        """The draining entry for `key_hash`, or None if it is not draining."""
        return self._entries.get(key_hash)

    def add_entry(self, consumer: ConsumerT, key_hash: int) -> None:
        """Count one more of `consumer`'s pending acks on a hash it must drain.

        Raises:
            ValueError: `key_hash` is 0, which means "no hash".
            DrainingHashConflictError: another consumer is draining `key_hash`.
        """
        if key_hash == STICKY_KEY_HASH_NOT_SET:
            raise ValueError("sticky key hash 0 means 'not set' and cannot drain")
        entry = self._entries.get(key_hash)
        if entry is None:
            entry = self._entries[key_hash] = DrainingHashEntry(consumer)
            self._record(consumer).hashes.add(key_hash)
        elif entry.consumer is not consumer:
            raise DrainingHashConflictError(
                f"hash {key_hash} is already draining at another consumer"
            )
        entry.ref_count += 1

    def reduce_ref_count(self, consumer: ConsumerT, key_hash: int, closing: bool) -> bool:
        """Count one pending ack of `consumer` on `key_hash` as gone (acked or closed).

        Hash 0 and hashes that are not draining are ignored.

        Args:
            consumer: the consumer whose pending ack went away.
            key_hash: the ack's sticky key hash.
            closing: the consumer is closing; its removal already triggers a read,
                so no unblock notification is sent.

        Returns:
            True if this removed the hash's last reference and some other consumer
            had been blocked on it, whether or not a notification was sent.

        Raises:
            DrainingHashConflictError: another consumer is draining `key_hash`.
        """
        entry = self._entries.get(key_hash)
        if entry is None:
            return False
        if entry.consumer is not consumer:
            raise DrainingHashConflictError(
                f"hash {key_hash} is draining at another consumer, which alone may release it"
            )
        entry.ref_count -= 1
        if entry.ref_count > 0:
            return False
        self._drop(key_hash, entry)
        if entry.blocked_count == 0:
            return False
        if not closing:
            if self._batch_depth:
                self._unblocked_in_batch = True
            else:
                self._on_unblocked(key_hash)
        return True

    def should_block(self, consumer: ConsumerT, key_hash: int) -> bool:
        """Whether dispatching `key_hash` to `consumer` must wait for draining.

        True when another consumer is draining the hash; each such answer counts as
        a blocked attempt. When `consumer` itself is draining it, the hash has come
        back to its old owner: the entry is dropped and dispatch may go ahead.
        """
        entry = self._entries.get(key_hash)
        if entry is None:
            return False
        if entry.consumer is consumer:
            self._drop(key_hash, entry)
            return False
        entry.blocked_count += 1
        return True

    def start_batch(self) -> None:
        """Defer unblock notifications until the matching `end_batch`; batches nest."""
        self._batch_depth += 1

    def end_batch(self) -> None:
        """End a batch; the outermost end sends one `BATCH_UNBLOCKED` if needed.

        Raises:
            RuntimeError: no batch is open.
        """
        if self._batch_depth == 0:
            raise RuntimeError("end_batch() without start_batch()")
        self._batch_depth -= 1
        if self._batch_depth == 0 and self._unblocked_in_batch:
            self._unblocked_in_batch = False
            self._on_unblocked(BATCH_UNBLOCKED)

    @contextmanager
    def batch(self) -> Iterator[None]:
        """`start_batch` and `end_batch` around a block of reductions."""
        self.start_batch()
        try:
            yield
        finally:
            self.end_batch()

    def consumer_removed(self, consumer: ConsumerT) -> None:
        """Forget `consumer`'s stats once it has left.

        Its entries are released by `reduce_ref_count(..., closing=True)` for each of
        its pending acks, which the dispatcher does as it removes the consumer.
        """
        self._records.pop(id(consumer), None)

    def clear(self) -> None:
        """Drop every entry and all stats (the subscription is going away)."""
        self._entries.clear()
        self._records.clear()

    def stats_for(self, consumer: ConsumerT) -> DrainingStats:
        """The draining fields of `consumer`'s stats; zeros if it drains nothing."""
        record = self._records.get(id(consumer))
        if record is None:
            return _stats_of((), 0, {})
        return _stats_of(sorted(record.hashes), record.cleared_total, self._entries)

    def stats(self) -> dict[ConsumerT, DrainingStats]:
        """`stats_for` of every consumer that has drained anything since it joined."""
        return {
            record.consumer: self.stats_for(record.consumer) for record in self._records.values()
        }

    def _record(self, consumer: ConsumerT) -> _ConsumerRecord[ConsumerT]:
        record = self._records.get(id(consumer))
        if record is None:
            record = self._records[id(consumer)] = _ConsumerRecord(consumer)
        return record

    def _drop(self, key_hash: int, entry: DrainingHashEntry[ConsumerT]) -> None:
        del self._entries[key_hash]
        record = self._records.get(id(entry.consumer))
        if record is not None:
            record.hashes.discard(key_hash)
            record.cleared_total += 1


def _stats_of(
    hashes: Iterable[int],
    cleared_total: int,
    entries: dict[int, DrainingHashEntry[ConsumerT]],
) -> DrainingStats:
    per_hash: list[DrainingHashStats] = [
        {
            "hash": key_hash,
            "unackMsgs": entries[key_hash].ref_count,
            "blockedAttempts": entries[key_hash].blocked_count,
        }
        for key_hash in hashes
        if key_hash in entries
    ]
    return {
        "drainingHashesCount": len(per_hash),
        "drainingHashesClearedTotal": cleared_total,
        "drainingHashesUnackedMessages": sum(item["unackMsgs"] for item in per_hash),
        "drainingHashes": per_hash,
    }
