"""The three Key_Shared sticky-key selectors, with Pulsar 4.x's assignments.

Each selector keeps an authoritative sorted structure (a `SortedDict`) that only
`add` and `remove` change; callers serialise those calls (the dispatcher actor does).
After each successful change it publishes a new immutable `Snapshot` by one
attribute assignment and returns the `ImpactedRanges`: the diff of the snapshots
before and after, which the dispatcher turns into draining hashes (PIP-379).

Selection never touches the sorted structure: `select` and `select_batch` read
``self.snapshot`` once and look the slot up in its per-slot owner table (two indexes,
cheaper than the binary search on its range ends that the table is built from), so
they are safe to call from any thread or greenlet while membership changes.

Slot reduction per selector, as in Pulsar's ``StickyKeyConsumerSelectorUtils``
(``hash % size + start``, and a result of 0 becomes 1 because 0 means "no hash"):

=================  ===============  ==========================
selector           range            slot of a 31-bit hash ``h``
=================  ===============  ==========================
AUTO_SPLIT ranges  ``[0, 65535]``   ``h % 65536`` (0 -> 1)
consistent hash    ``[1, 65535]``   ``h % 65535 + 1``
STICKY             ``[0, 65535]``   ``h % 65536`` (0 -> 1)
=================  ===============  ==========================
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from itertools import compress, pairwise
from typing import Any, Generic, Protocol

from sortedcontainers import SortedDict

from brokerlet.keyshared.hashing import RANGE_SIZE, sticky_key_hash
from brokerlet.keyshared.snapshot import (
    C,
    HashRange,
    ImpactedRanges,
    Named,
    Snapshot,
    diff_snapshots,
)

__all__ = [
    "AutoSplitSelector",
    "ConsistentHashingSelector",
    "ConsumerAssignError",
    "Selector",
    "StickySelector",
    "make_selector",
]


class ConsumerAssignError(ValueError):
    """A consumer cannot be given hash ranges; the selector is left unchanged.

    Args:
        message: what went wrong, for the client's error response.
        conflicting: for STICKY, the consumer already holding an overlapping
            range. Pulsar checks that consumer's connection is alive before failing
            the subscribe; the dispatcher can do the same and retry.
    """

    def __init__(self, message: str, conflicting: object | None = None) -> None:
        super().__init__(message)
        self.conflicting = conflicting


class Selector(Protocol[C]):
    """What the dispatcher uses of a sticky-key selector."""

    @property
    def snapshot(self) -> Snapshot[C]:
        """The current assignment; replaced, never changed, after each change."""
        ...

    def slot(self, key_hash: int) -> int:
        """Reduce a 31-bit sticky-key hash into this selector's slot range."""
        ...

    def slots(self, key_hashes: Iterable[int]) -> list[int]:
        """`slot` of each hash, without a call per hash."""
        ...

    def select(self, key_hash: int) -> C | None:
        """The consumer for a 31-bit sticky-key hash, or None if nobody owns it."""
        ...

    def select_batch(self, key_hashes: Sequence[int]) -> list[C | None]:
        """`select` for many hashes, all answered from one snapshot."""
        ...

    def add(self, consumer: C, ranges: Sequence[HashRange] | None = None) -> ImpactedRanges[C]:
        """Give `consumer` a share of the range and publish the new snapshot."""
        ...

    def remove(self, consumer: C) -> ImpactedRanges[C]:
        """Take `consumer`'s ranges away; removing an unknown consumer is a no-op."""
        ...

    def lookup_authoritative(self, slot: int) -> C | None:
        """The owner of `slot` per the sorted structure (for tests and benchmarks)."""
        ...


class _SnapshotPublisher(Generic[C]):
    """Holds the published snapshot and turns a change into its impacted ranges."""

    snapshot: Snapshot[C]

    def __init__(self, first_slot: int, last_slot: int) -> None:
        self.first_slot = first_slot
        self.last_slot = last_slot
        self.snapshot = Snapshot.empty(first_slot, last_slot)

    def _publish(self, after: Snapshot[C]) -> ImpactedRanges[C]:
        before = self.snapshot
        self.snapshot = after  # the one write readers can observe
        return diff_snapshots(before, after)


class _ModuloSlots(_SnapshotPublisher[C]):
    """Selection for AUTO_SPLIT ranges and STICKY: slot ``h % range_size``, 0 becoming 1."""

    def __init__(self, first_slot: int, last_slot: int, range_size: int) -> None:
        super().__init__(first_slot, last_slot)
        self.range_size = range_size

    def slot(self, key_hash: int) -> int:
        return key_hash % self.range_size or 1

    def slots(self, key_hashes: Iterable[int]) -> list[int]:
        size = self.range_size
        return [key_hash % size or 1 for key_hash in key_hashes]

    def select(self, key_hash: int) -> C | None:
        snapshot = self.snapshot  # starts at slot 0: a slot is its own table index
        return snapshot.slot_owners[snapshot.slot_index[key_hash % self.range_size or 1]]

    def select_batch(self, key_hashes: Sequence[int]) -> list[C | None]:
        snapshot = self.snapshot
        owners = snapshot.slot_owners
        index = snapshot.slot_index
        size = self.range_size
        if isinstance(index, bytes) and isinstance(key_hashes, list):
            return _byte_table_owners_nonzero(owners, index, key_hashes, size)
        return [owners[index[key_hash % size or 1]] for key_hash in key_hashes]


# Typed apart from the selectors' generic paths: compiled, a list of ints and a bytes table
# are read without boxing (the table is bytes up to 255 owners, an array beyond).


def _byte_table_owners(
    owners: tuple[C | None, ...], index: bytes, key_hashes: list[int], modulus: int
) -> list[C | None]:
    """The owner of each hash's slot ``h % modulus`` (consistent hashing's table)."""
    return [owners[index[h % modulus]] for h in key_hashes]


def _byte_table_owners_nonzero(
    owners: tuple[C | None, ...], index: bytes, key_hashes: list[int], modulus: int
) -> list[C | None]:
    """The owner of each hash's slot ``h % modulus or 1`` (the modulo selectors' table)."""
    return [owners[index[h % modulus or 1]] for h in key_hashes]


def _check_range_size(range_size: int) -> None:
    if range_size < 2 or range_size & (range_size - 1):
        raise ValueError(f"range_size must be a power of two >= 2, not {range_size}")


class AutoSplitSelector(_ModuloSlots[C]):
    """AUTO_SPLIT by range splitting (``subscriptionKeySharedUseConsistentHashing=false``).

    The first consumer owns the whole range. Each newcomer takes the lower half of
    the largest range (the lowest one on ties); a leaving consumer's range merges
    into the next-higher range, except that the top range passes to the next-lower
    consumer. Simple and deterministic, but removals skew the split (Pulsar #6791).

    Args:
        range_size: number of slots; a power of two. Ranges end at `range_size`
            itself, as Pulsar reports them.
    """

    def __init__(self, range_size: int = RANGE_SIZE) -> None:
        _check_range_size(range_size)
        super().__init__(0, range_size, range_size)
        self._owner_by_end: SortedDict = SortedDict()  # range end -> consumer
        self._end_by_consumer: dict[int, int] = {}  # id(consumer) -> range end

    def add(self, consumer: C, ranges: Sequence[HashRange] | None = None) -> ImpactedRanges[C]:
        """Split the largest range for `consumer`; `ranges` is ignored.

        Raises:
            ConsumerAssignError: the consumer is already added, or no range is
                wider than one slot.
        """
        if id(consumer) in self._end_by_consumer:
            raise ConsumerAssignError(f"consumer {consumer.name!r} is already added")
        owners = self._owner_by_end
        if not owners:
            end = self.range_size
        else:
            widest_end, lower = self._widest_range()
            span = widest_end - lower
            if span <= 1:
                raise ConsumerAssignError(
                    f"no more hash range can be assigned to a new consumer "
                    f"({len(owners)} consumers)"
                )
            end = widest_end - (span >> 1)
        owners[end] = consumer
        self._end_by_consumer[id(consumer)] = end
        return self._publish(self._build_snapshot())

    def remove(self, consumer: C) -> ImpactedRanges[C]:
        end = self._end_by_consumer.pop(id(consumer), None)
        if end is None:
            return {}
        owners = self._owner_by_end
        if end == self.range_size and len(owners) > 1:
            # The top range cannot merge upward, so the next-lower consumer moves up.
            lower_end, lower_owner = owners.peekitem(-2)
            owners[end] = lower_owner
            del owners[lower_end]
            self._end_by_consumer[id(lower_owner)] = end
        else:
            del owners[end]
        return self._publish(self._build_snapshot())

    def lookup_authoritative(self, slot: int) -> C | None:
        owners = self._owner_by_end
        index = owners.bisect_left(slot)
        if index == len(owners):
            return None
        owner: C = owners.peekitem(index)[1]
        return owner

    def _widest_range(self) -> tuple[int, int]:
        """``(end, previous end)`` of the widest range, the lowest on ties."""
        best_end, best_lower, lower = 0, 0, 0
        for end in self._owner_by_end:
            if end - lower > best_end - best_lower:
                best_end, best_lower = end, lower
            lower = end
        return best_end, best_lower

    def _build_snapshot(self) -> Snapshot[C]:
        if not self._owner_by_end:
            return Snapshot.empty(0, self.range_size)
        return Snapshot(0, tuple(self._owner_by_end.keys()), tuple(self._owner_by_end.values()))


class _RingPoint(Generic[C]):
    """One point of the hash ring: its selected consumer and those that collided."""

    __slots__ = ("colliding", "selected")

    def __init__(self, selected: C) -> None:
        self.selected = selected
        self.colliding: list[C] = []  # FIFO: the first is promoted on removal

    def remove(self, consumer: C) -> bool:
        """Drop `consumer` from this point; True when the point is now empty."""
        if self.selected is consumer:
            if not self.colliding:
                return True
            self.selected = self.colliding.pop(0)
        else:
            self.colliding = [c for c in self.colliding if c is not consumer]
        return False


_SELECTED = operator.attrgetter("selected")


class _NameIndexes:
    """Hands each consumer the smallest index not in use by others of its name.

    Folding the index into the ring keys keeps consumers that share a name from
    landing on the same points, and gives a consumer that leaves and rejoins its
    old points back (Pulsar's ``ConsumerNameIndexTracker``).
    """

    def __init__(self) -> None:
        self._used: dict[str, set[int]] = {}
        self._by_consumer: dict[int, tuple[str, int]] = {}  # id(consumer) -> (name, index)

    def allocate(self, consumer: Named) -> int:
        used = self._used.setdefault(consumer.name, set())
        index = 0
        while index in used:
            index += 1
        used.add(index)
        self._by_consumer[id(consumer)] = (consumer.name, index)
        return index

    def get(self, consumer: object) -> int | None:
        entry = self._by_consumer.get(id(consumer))
        return None if entry is None else entry[1]

    def release(self, consumer: object) -> None:
        name, index = self._by_consumer.pop(id(consumer))
        used = self._used[name]
        used.discard(index)
        if not used:
            del self._used[name]


class ConsistentHashingSelector(_SnapshotPublisher[C]):
    """AUTO_SPLIT by consistent hashing, Pulsar 4.x's default.

    Each consumer puts `replica_points` points on a ring of slots at
    ``slot(murmur3(name + "\\0" + name_index + "\\0" + i))``. A slot belongs to the
    first point at or above it, wrapping to the lowest point. A point that is
    already taken keeps its owner and queues the newcomer; removing the owner
    promotes the first queued consumer (Pulsar #23441). So an addition moves slots
    only to the newcomer, and a removal moves only the leaver's slots.

    Args:
        replica_points: points per consumer
            (``subscriptionKeySharedConsistentHashingReplicaPoints``).
        range_size: the ring holds slots ``1 .. range_size - 1``.
    """

    def __init__(self, replica_points: int = 100, range_size: int = RANGE_SIZE) -> None:
        if replica_points < 1:
            raise ValueError(f"replica_points must be >= 1, not {replica_points}")
        _check_range_size(range_size)
        super().__init__(1, range_size - 1)
        self.replica_points = replica_points
        self.range_size = range_size
        self._modulus = range_size - 1
        self._ring: SortedDict = SortedDict()  # slot -> _RingPoint
        self._name_indexes = _NameIndexes()

    def slot(self, key_hash: int) -> int:
        return key_hash % self._modulus + 1

    def slots(self, key_hashes: Iterable[int]) -> list[int]:
        modulus = self._modulus
        return [key_hash % modulus + 1 for key_hash in key_hashes]

    def select(self, key_hash: int) -> C | None:
        snapshot = self.snapshot
        # Slot r + 1 sits at table index r, the snapshot starting at slot 1: saves the add.
        return snapshot.slot_owners[snapshot.slot_index[key_hash % self._modulus]]

    def select_batch(self, key_hashes: Sequence[int]) -> list[C | None]:
        snapshot = self.snapshot
        owners = snapshot.slot_owners
        index = snapshot.slot_index
        modulus = self._modulus
        if isinstance(index, bytes) and isinstance(key_hashes, list):
            return _byte_table_owners(owners, index, key_hashes, modulus)
        return [owners[index[key_hash % modulus]] for key_hash in key_hashes]

    def point_slots(self, consumer: C, name_index: int) -> list[int]:
        """The ring slots of `consumer`'s points for a given name index."""
        prefix = f"{consumer.name}\0{name_index}\0"
        modulus = self._modulus
        return [
            sticky_key_hash(f"{prefix}{i}".encode()) % modulus + 1
            for i in range(self.replica_points)
        ]

    def add(self, consumer: C, ranges: Sequence[HashRange] | None = None) -> ImpactedRanges[C]:
        """Put `consumer`'s points on the ring; `ranges` is ignored.

        A consumer all of whose points collide owns nothing until others leave;
        Pulsar logs that and suggests more replica points.

        Raises:
            ConsumerAssignError: the consumer is already added.
        """
        if self._name_indexes.get(consumer) is not None:
            raise ConsumerAssignError(f"consumer {consumer.name!r} is already added")
        ring = self._ring
        for point in self.point_slots(consumer, self._name_indexes.allocate(consumer)):
            existing = ring.get(point)
            if existing is None:
                ring[point] = _RingPoint(consumer)
            else:
                existing.colliding.append(consumer)
        return self._publish(self._build_snapshot())

    def remove(self, consumer: C) -> ImpactedRanges[C]:
        name_index = self._name_indexes.get(consumer)
        if name_index is None:
            return {}
        ring = self._ring
        # One removal per point, as added: a consumer may collide with itself.
        for point in self.point_slots(consumer, name_index):
            entry = ring.get(point)
            if entry is not None and entry.remove(consumer):
                del ring[point]
        self._name_indexes.release(consumer)
        return self._publish(self._build_snapshot())

    def lookup_authoritative(self, slot: int) -> C | None:
        ring = self._ring
        if not ring:
            return None
        index = ring.bisect_left(slot)
        entry: _RingPoint[C] = ring.peekitem(index if index < len(ring) else 0)[1]
        return entry.selected

    def _build_snapshot(self) -> Snapshot[C]:
        ring = self._ring
        if not ring:
            return Snapshot.empty(1, self.last_slot)
        # Each point ends the range that starts after the point below it, and neighbouring
        # points of one owner make one range: a point is kept as an end unless the next
        # point has the same owner. In C throughout, as this runs over 5,000 points (50
        # consumers) at every membership change.
        points = list(ring.keys())
        selected = list(map(_SELECTED, map(ring.__getitem__, points)))
        last_of_run = [*map(operator.is_not, selected, selected[1:]), True]
        ends = list(compress(points, last_of_run))
        owners = list(compress(selected, last_of_run))
        if ends[-1] < self.last_slot:
            # Slots above the highest point wrap around to the lowest point's owner.
            if owners[-1] is selected[0]:
                ends[-1] = self.last_slot
            else:
                ends.append(self.last_slot)
                owners.append(selected[0])
        return Snapshot(1, ends, owners)


class StickySelector(_ModuloSlots[C]):
    """STICKY: each consumer brings its own ranges; unowned slots select nobody.

    Args:
        range_size: number of slots; ranges must lie in ``[0, range_size - 1]``.
    """

    def __init__(self, range_size: int = RANGE_SIZE) -> None:
        _check_range_size(range_size)
        super().__init__(0, range_size - 1, range_size)
        self._by_start: SortedDict = SortedDict()  # range start -> (HashRange, consumer)
        self._ranges_by_consumer: dict[int, tuple[HashRange, ...]] = {}

    def add(self, consumer: C, ranges: Sequence[HashRange] | None = None) -> ImpactedRanges[C]:
        """Give `consumer` exactly the `ranges` it asked for.

        Raises:
            ConsumerAssignError: the consumer is already added; `ranges` is missing
                or empty; a range is inverted or outside the slot range; the ranges
                overlap each other; or they overlap another consumer's (then
                `conflicting` names it). Nothing changes on error.
        """
        if id(consumer) in self._ranges_by_consumer:
            raise ConsumerAssignError(f"consumer {consumer.name!r} is already added")
        wanted = self._validate(ranges)
        conflicting = self.conflicting_consumer(wanted)
        if conflicting is not None:
            raise ConsumerAssignError(
                f"range conflict with consumer {conflicting.name!r}", conflicting=conflicting
            )
        for hash_range in wanted:
            self._by_start[hash_range.start] = (hash_range, consumer)
        self._ranges_by_consumer[id(consumer)] = wanted
        return self._publish(self._build_snapshot())

    def remove(self, consumer: C) -> ImpactedRanges[C]:
        owned = self._ranges_by_consumer.pop(id(consumer), None)
        if owned is None:
            return {}
        for hash_range in owned:
            del self._by_start[hash_range.start]
        return self._publish(self._build_snapshot())

    def conflicting_consumer(self, ranges: Sequence[HashRange]) -> C | None:
        """The first consumer already owning a slot in any of `ranges`, if any."""
        by_start = self._by_start
        for wanted in ranges:
            # Only the range starting at or just below wanted.start, and the first one
            # starting above it, can overlap: ranges held do not overlap each other.
            index = by_start.bisect_right(wanted.start)
            for neighbour in (index - 1, index):
                if 0 <= neighbour < len(by_start):
                    held, owner = by_start.peekitem(neighbour)[1]
                    if held.start <= wanted.end and wanted.start <= held.end:
                        found: C = owner
                        return found
        return None

    def lookup_authoritative(self, slot: int) -> C | None:
        by_start = self._by_start
        index = by_start.bisect_right(slot) - 1
        if index < 0:
            return None
        held, owner = by_start.peekitem(index)[1]
        return owner if slot <= held.end else None

    def _validate(self, ranges: Sequence[HashRange] | None) -> tuple[HashRange, ...]:
        if not ranges:
            raise ConsumerAssignError("ranges for a STICKY Key_Shared consumer must not be empty")
        ordered = sorted(ranges)
        for hash_range in ordered:
            if hash_range.start > hash_range.end:
                raise ConsumerAssignError(
                    f"hash range start > end: [{hash_range.start}, {hash_range.end}]"
                )
            if hash_range.start < 0 or hash_range.end > self.last_slot:
                raise ConsumerAssignError(
                    f"hash range [{hash_range.start}, {hash_range.end}] is outside "
                    f"[0, {self.last_slot}]"
                )
        for lower, upper in pairwise(ordered):
            if upper.start <= lower.end:
                raise ConsumerAssignError(
                    f"consumer's own ranges conflict: [{lower.start}, {lower.end}] "
                    f"overlaps [{upper.start}, {upper.end}]"
                )
        return tuple(ordered)

    def _build_snapshot(self) -> Snapshot[C]:
        return Snapshot.from_ranges(0, self.last_slot, list(self._by_start.values()))


def make_selector(mode: str, *, use_consistent_hashing: bool, replica_points: int) -> Selector[Any]:
    """The selector for a Key_Shared subscription, as Pulsar chooses it.

    Args:
        mode: the subscription's ``KeySharedMode`` name, ``"AUTO_SPLIT"`` or
            ``"STICKY"`` (case-insensitive).
        use_consistent_hashing: ``subscriptionKeySharedUseConsistentHashing``;
            chooses between the two AUTO_SPLIT selectors.
        replica_points: ``subscriptionKeySharedConsistentHashingReplicaPoints``.

    Raises:
        ValueError: `mode` is not a Key_Shared mode.
    """
    normalized = mode.upper()
    if normalized == "STICKY":
        return StickySelector()
    if normalized == "AUTO_SPLIT":
        if use_consistent_hashing:
            return ConsistentHashingSelector(replica_points)
        return AutoSplitSelector()
    raise ValueError(f"unknown Key_Shared mode {mode!r}; expected AUTO_SPLIT or STICKY")
