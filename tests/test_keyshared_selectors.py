"""Key_Shared selectors: Pulsar's assignments, snapshot equivalence, churn, threads."""

from __future__ import annotations

import random
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brokerlet.keyshared import (
    RANGE_SIZE,
    AutoSplitSelector,
    ConsistentHashingSelector,
    ConsumerAssignError,
    HashRange,
    RangeChanges,
    Selector,
    Snapshot,
    StickySelector,
    diff_snapshots,
    make_selector,
    sticky_key,
    sticky_key_hash,
)
from brokerlet.transport.protocol import pb


@dataclass(eq=False)
class FakeConsumer:
    """A consumer as selectors see it: a name, compared by identity."""

    name: str

    def __repr__(self) -> str:
        return f"<{self.name}@{id(self) & 0xFFFF:04x}>"


# -- helpers ---------------------------------------------------------------------------


def owner_ids(owners: Sequence[object]) -> list[int | None]:
    """Identity-only view of a list of owners, so comparisons never use __eq__."""
    return [None if owner is None else id(owner) for owner in owners]


def all_slots(selector: Selector[Any]) -> range:
    snapshot = selector.snapshot
    return range(snapshot.start, snapshot.last + 1)


def assert_snapshot_matches_authoritative(selector: Selector[Any]) -> None:
    slots = all_slots(selector)
    from_snapshot = selector.snapshot.select_many(slots)
    from_sorted = [selector.lookup_authoritative(slot) for slot in slots]
    assert owner_ids(from_snapshot) == owner_ids(from_sorted)


def brute_force_diff(
    before: Snapshot[FakeConsumer], after: Snapshot[FakeConsumer]
) -> dict[int, tuple[list[tuple[int, int]], list[tuple[int, int]]]]:
    """Per-consumer (removed, added) ranges found by comparing every slot."""
    changes: dict[int, tuple[list[tuple[int, int]], list[tuple[int, int]]]] = {}

    def extend(ranges: list[tuple[int, int]], slot: int) -> None:
        if ranges and ranges[-1][1] == slot - 1:
            ranges[-1] = (ranges[-1][0], slot)
        else:
            ranges.append((slot, slot))

    for slot in range(before.start, before.last + 1):
        old, new = before.select(slot), after.select(slot)
        if old is new:
            continue
        if old is not None:
            extend(changes.setdefault(id(old), ([], []))[0], slot)
        if new is not None:
            extend(changes.setdefault(id(new), ([], []))[1], slot)
    return changes


def as_plain(changes: dict[FakeConsumer, RangeChanges]) -> dict[int, tuple[list[Any], list[Any]]]:
    return {
        id(consumer): (
            [(r.start, r.end) for r in change.removed],
            [(r.start, r.end) for r in change.added],
        )
        for consumer, change in changes.items()
    }


def plain_ranges(snapshot: Snapshot[FakeConsumer], consumer: FakeConsumer) -> list[tuple[int, int]]:
    return [(r.start, r.end) for r in snapshot.ranges().get(consumer, [])]


def owner_share(selector: Selector[Any], consumer: FakeConsumer) -> int:
    return sum(len(r) for r in selector.snapshot.ranges().get(consumer, []))


def select_keys(selector: Selector[Any], keys: int) -> dict[int, int]:
    counts: dict[int, int] = {}
    hashes = [sticky_key_hash(f"key {i}".encode()) for i in range(keys)]
    for owner in selector.select_batch(hashes):
        counts[id(owner)] = counts.get(id(owner), 0) + 1
    return counts


def add_sticky(
    selector: StickySelector[FakeConsumer], name: str, *ranges: tuple[int, int]
) -> FakeConsumer:
    consumer = FakeConsumer(name)
    selector.add(consumer, [HashRange(start, end) for start, end in ranges])
    return consumer


# -- reference vectors -------------------------------------------------------------------


def test_auto_split_reference_layout() -> None:
    selector: AutoSplitSelector[FakeConsumer] = AutoSplitSelector(range_size=64)
    c1, c2, c3, c4 = (FakeConsumer(f"consumer{i}") for i in range(1, 5))
    for consumer in (c1, c2, c3, c4):
        selector.add(consumer)
    snapshot = selector.snapshot
    assert plain_ranges(snapshot, c3) == [(0, 16)]
    assert plain_ranges(snapshot, c2) == [(17, 32)]
    assert plain_ranges(snapshot, c4) == [(33, 48)]
    assert plain_ranges(snapshot, c1) == [(49, 64)]


def test_auto_split_same_name_consumers_get_different_ranges() -> None:
    selector: AutoSplitSelector[FakeConsumer] = AutoSplitSelector(range_size=64)
    consumers = [FakeConsumer("My-consumer") for _ in range(3)]
    for consumer in consumers:
        selector.add(consumer)
    ranges = [plain_ranges(selector.snapshot, consumer) for consumer in consumers]
    assert all(len(r) == 1 for r in ranges)
    assert len({tuple(r) for r in ranges}) == 3


def test_auto_split_removal_of_top_range_moves_it_down_else_merges_up() -> None:
    selector: AutoSplitSelector[FakeConsumer] = AutoSplitSelector(range_size=64)
    c1, c2, c3, c4 = (FakeConsumer(f"consumer{i}") for i in range(1, 5))
    for consumer in (c1, c2, c3, c4):
        selector.add(consumer)
    selector.remove(c1)  # owned the top range: the next-lower consumer takes it
    assert plain_ranges(selector.snapshot, c4) == [(33, 64)]
    selector.remove(c3)  # a lower range merges into the next-higher one
    assert plain_ranges(selector.snapshot, c2) == [(0, 32)]
    assert plain_ranges(selector.snapshot, c4) == [(33, 64)]


def test_auto_split_runs_out_of_ranges_without_changing_anything() -> None:
    selector: AutoSplitSelector[FakeConsumer] = AutoSplitSelector(range_size=4)
    for i in range(4):
        selector.add(FakeConsumer(f"c{i}"))
    before = selector.snapshot
    with pytest.raises(ConsumerAssignError, match="no more hash range"):
        selector.add(FakeConsumer("one too many"))
    assert selector.snapshot is before
    assert_snapshot_matches_authoritative(selector)


def test_consistent_hashing_reference_ranges() -> None:
    selector: ConsistentHashingSelector[FakeConsumer] = ConsistentHashingSelector(3)
    c1, c2, c3 = (FakeConsumer(f"consumer{i}") for i in range(1, 4))
    for consumer in (c1, c2, c3):
        selector.add(consumer)
    snapshot = selector.snapshot
    assert plain_ranges(snapshot, c1) == [(14359, 18366), (29991, 39817), (52980, 60442)]
    assert plain_ranges(snapshot, c2) == [
        (1, 6668),
        (39818, 52979),
        (60443, 63679),
        (65184, 65535),
    ]
    assert plain_ranges(snapshot, c3) == [(6669, 14358), (18367, 29990), (63680, 65183)]


def test_consistent_hashing_ranges_are_contiguous_and_cover_the_range() -> None:
    selector: ConsistentHashingSelector[FakeConsumer] = ConsistentHashingSelector(100)
    for i in range(7):
        selector.add(FakeConsumer(f"consumer{i}"))
    all_ranges = sorted(r for ranges in selector.snapshot.ranges().values() for r in ranges)
    assert all_ranges[0].start == 1
    assert all_ranges[-1].end == RANGE_SIZE - 1
    for lower, upper in pairwise(all_ranges):
        assert upper.start == lower.end + 1
    assert sum(len(r) for r in all_ranges) == RANGE_SIZE - 1


def test_names_ending_in_digits_do_not_share_points() -> None:
    # Pulsar #22050: without a separator "consumer1" + "1" hashed like "consumer11" + "".
    selector: ConsistentHashingSelector[FakeConsumer] = ConsistentHashingSelector(12)
    c1, c11 = FakeConsumer("consumer1"), FakeConsumer("consumer11")
    selector.add(c1)
    selector.add(c11)
    assert not set(selector.point_slots(c1, 0)) & set(selector.point_slots(c11, 0))
    ranges = selector.snapshot.ranges()
    assert owner_share(selector, c1) > 0
    assert owner_share(selector, c11) > 0
    assert len(ranges) == 2


# -- distribution ------------------------------------------------------------------------


def assert_balanced(counts: dict[int, int], consumers: Sequence[FakeConsumer], keys: int) -> None:
    expected = keys / len(consumers)
    for consumer in consumers:
        assert abs(counts.get(id(consumer), 0) - expected) <= 0.2 * expected, (consumer, counts)


def test_consistent_hashing_balances_keys_as_consumers_come_and_go() -> None:
    selector: ConsistentHashingSelector[FakeConsumer] = ConsistentHashingSelector(200)
    keys = 10_000
    consumers = [FakeConsumer(f"c{i}") for i in range(1, 5)]
    for count in (1, 2, 3, 4):
        selector.add(consumers[count - 1])
        if count > 1:
            assert_balanced(select_keys(selector, keys), consumers[:count], keys)
    for removed in range(2):
        selector.remove(consumers[removed])
        assert_balanced(select_keys(selector, keys), consumers[removed + 1 :], keys)


def test_consistent_hashing_balances_twenty_same_name_consumers() -> None:
    selector: ConsistentHashingSelector[FakeConsumer] = ConsistentHashingSelector(200)
    consumers = [FakeConsumer("consumer") for _ in range(20)]
    for consumer in consumers:
        selector.add(consumer)
    assert_balanced(select_keys(selector, 10_000), consumers, 10_000)
    for consumer in consumers:
        selector.remove(consumer)
    assert selector.snapshot.ranges() == {}


# -- stability under membership changes -------------------------------------------------


def make_auto_split() -> Selector[Any]:
    return AutoSplitSelector()


def make_consistent() -> Selector[Any]:
    return ConsistentHashingSelector(100)


AUTO_SPLIT_KINDS = pytest.mark.parametrize(
    "make", [make_auto_split, make_consistent], ids=["auto-split", "consistent"]
)


@AUTO_SPLIT_KINDS
def test_removing_a_consumer_moves_only_its_slots(make: Callable[[], Selector[Any]]) -> None:
    selector = make()
    consumers = [FakeConsumer(f"consumer-{i}") for i in range(8)]
    for consumer in consumers:
        selector.add(consumer)
    for leaving in (consumers[3], consumers[7], consumers[0]):
        slots = all_slots(selector)
        before = selector.snapshot.select_many(slots)
        changes = selector.remove(leaving)
        after = selector.snapshot.select_many(slots)
        assert any(owner is leaving for owner in before)
        for old, new in zip(before, after, strict=True):
            assert new is not leaving
            if old is not leaving:
                assert new is old
        assert [id(c) for c, change in changes.items() if change.removed] == [id(leaving)]


@AUTO_SPLIT_KINDS
def test_adding_a_consumer_moves_slots_only_to_it(make: Callable[[], Selector[Any]]) -> None:
    selector = make()
    for i in range(6):
        selector.add(FakeConsumer(f"consumer-{i}"))
    for i in range(6, 10):
        newcomer = FakeConsumer(f"consumer-{i}")
        slots = all_slots(selector)
        before = selector.snapshot.select_many(slots)
        changes = selector.add(newcomer)
        after = selector.snapshot.select_many(slots)
        assert any(owner is newcomer for owner in after)
        for old, new in zip(before, after, strict=True):
            assert new is old or new is newcomer
        gained = [id(c) for c, change in changes.items() if change.added]
        assert gained == [id(newcomer)]
        # Everything the others lost is exactly what the newcomer gained.
        lost = sorted(r for change in changes.values() for r in change.removed)
        assert [(r.start, r.end) for r in _merge(lost)] == plain_ranges(selector.snapshot, newcomer)


def _merge(ranges: list[HashRange]) -> list[HashRange]:
    merged: list[HashRange] = []
    for hash_range in ranges:
        if merged and merged[-1].end + 1 == hash_range.start:
            merged[-1] = HashRange(merged[-1].start, hash_range.end)
        else:
            merged.append(hash_range)
    return merged


def test_leave_and_rejoin_restores_identical_ranges() -> None:
    # The newest consumer only ever queued behind colliding points, so rejoining
    # restores everything exactly (an older one may have ceded a collision point).
    selector: ConsistentHashingSelector[FakeConsumer] = ConsistentHashingSelector(100)
    consumers = [FakeConsumer(f"consumer-{i}") for i in range(10)]
    for consumer in consumers:
        selector.add(consumer)
    original = selector.snapshot
    newest = consumers[-1]
    selector.remove(newest)
    assert owner_share(selector, newest) == 0
    changes = selector.add(newest)
    assert selector.snapshot.ends == original.ends
    assert owner_ids(selector.snapshot.owners) == owner_ids(original.owners)
    assert [(r.start, r.end) for r in changes[newest].added] == plain_ranges(original, newest)


def test_same_name_leave_and_rejoin_changes_under_one_percent() -> None:
    selector: ConsistentHashingSelector[FakeConsumer] = ConsistentHashingSelector(100)
    consumers = [FakeConsumer("consumer") for _ in range(10)]
    for consumer in consumers:
        selector.add(consumer)
    before = selector.snapshot
    selector.remove(consumers[0])
    selector.remove(consumers[5])
    selector.add(consumers[0])
    selector.add(consumers[5])
    changed = brute_force_diff(before, selector.snapshot)
    moved = sum(end - start + 1 for removed, _ in changed.values() for start, end in removed)
    assert moved < 0.01 * (RANGE_SIZE - 1)


def test_fifty_consumers_leave_and_rejoin_in_order_identically() -> None:
    selector: ConsistentHashingSelector[FakeConsumer] = ConsistentHashingSelector(100)
    consumers = [FakeConsumer("consumer") for _ in range(50)]
    for consumer in consumers:
        selector.add(consumer)
    original = selector.snapshot
    leaving = list(consumers)
    random.Random(7).shuffle(leaving)
    for consumer in leaving:
        selector.remove(consumer)
    assert selector.snapshot.ranges() == {}
    assert selector.lookup_authoritative(1) is None
    for consumer in consumers:
        selector.add(consumer)
    assert selector.snapshot.ends == original.ends
    assert owner_ids(selector.snapshot.owners) == owner_ids(original.owners)


def test_colliding_points_keep_their_owner_and_promote_in_order() -> None:
    # 7 slots and one point each: names are bound to collide; find three that do.
    selector: ConsistentHashingSelector[FakeConsumer] = ConsistentHashingSelector(
        replica_points=1, range_size=8
    )
    by_point: dict[int, list[str]] = {}
    for i in range(50):
        name = f"c{i}"
        by_point.setdefault(selector.point_slots(FakeConsumer(name), 0)[0], []).append(name)
    point, names = next((p, n) for p, n in by_point.items() if len(n) >= 3)
    first, second, third = (FakeConsumer(name) for name in names[:3])
    selector.add(first)
    changes = selector.add(second)
    selector.add(third)
    assert changes == {}  # the newcomer only queued behind the point's owner
    assert selector.lookup_authoritative(point) is first
    assert selector.snapshot.select(point) is first
    selector.remove(first)
    assert selector.snapshot.select(point) is second
    selector.remove(third)  # leaving the queue changes nothing
    assert selector.snapshot.select(point) is second
    selector.remove(second)
    assert selector.snapshot.select(point) is None
    assert_snapshot_matches_authoritative(selector)


@pytest.mark.parametrize(
    "make",
    [make_auto_split, make_consistent, StickySelector],
    ids=["auto-split", "consistent", "sticky"],
)
def test_double_remove_and_double_add_are_safe(make: Callable[[], Selector[Any]]) -> None:
    selector = make()
    consumer, other = FakeConsumer("c"), FakeConsumer("d")
    selector.add(consumer, [HashRange(0, 99)])
    selector.add(other, [HashRange(100, 199)])
    published = selector.snapshot
    with pytest.raises(ConsumerAssignError, match="already added"):
        selector.add(consumer, [HashRange(300, 399)])
    assert selector.snapshot is published
    assert selector.remove(consumer) != {}
    after_remove = selector.snapshot
    assert selector.remove(consumer) == {}
    assert selector.snapshot is after_remove
    assert_snapshot_matches_authoritative(selector)
    assert all(owner is not consumer for owner in selector.snapshot.owners)


# -- STICKY ------------------------------------------------------------------------------


def test_sticky_selects_within_ranges_and_nobody_in_gaps() -> None:
    selector: StickySelector[FakeConsumer] = StickySelector(range_size=16)
    c1 = add_sticky(selector, "c1", (0, 2))
    c2 = add_sticky(selector, "c2", (3, 9))
    assert [selector.lookup_authoritative(s) for s in range(16)] == [c1] * 3 + [c2] * 7 + [None] * 6
    assert_snapshot_matches_authoritative(selector)
    selector.remove(c1)
    assert selector.select(1) is None
    assert selector.select(5) is c2
    selector.remove(c2)
    assert selector.select(5) is None


def test_sticky_hash_reducing_to_slot_zero_uses_slot_one() -> None:
    selector: StickySelector[FakeConsumer] = StickySelector()
    zero = add_sticky(selector, "zero", (0, 0))
    rest = add_sticky(selector, "rest", (1, 65535))
    assert selector.snapshot.select(0) is zero
    assert selector.slot(RANGE_SIZE * 3) == 1
    assert selector.select(RANGE_SIZE * 3) is rest
    assert selector.select_batch([RANGE_SIZE, 5]) == [rest, rest]


def test_sticky_routes_keys_by_their_slot() -> None:
    selector: StickySelector[FakeConsumer] = StickySelector()
    low = add_sticky(selector, "low", (0, 20000))
    mid = add_sticky(selector, "mid", (20001, 40000))
    high = add_sticky(selector, "high", (40001, 65535))
    messages = [pb.MessageMetadata(partition_key=f"key-{i}") for i in range(200)]
    messages += [pb.MessageMetadata(ordering_key=f"order-{i}".encode()) for i in range(200)]
    messages += [pb.MessageMetadata(producer_name="p", sequence_id=i) for i in range(200)]
    hashes = [sticky_key_hash(sticky_key(metadata)) for metadata in messages]
    expected = []
    for key_hash in hashes:
        slot = key_hash % 65536 or 1
        expected.append(low if slot <= 20000 else mid if slot <= 40000 else high)
    assert owner_ids(selector.select_batch(hashes)) == owner_ids(expected)
    assert owner_ids([selector.select(h) for h in hashes]) == owner_ids(expected)
    assert {id(owner) for owner in expected} == {id(low), id(mid), id(high)}


@pytest.mark.parametrize(
    "ranges",
    [
        pytest.param([(4, 6)], id="overlaps-end"),
        pytest.param([(1, 3)], id="overlaps-start"),
        pytest.param([(2, 2)], id="first-slot"),
        pytest.param([(5, 5)], id="last-slot"),
        pytest.param([(1, 5)], id="covers-from-below"),
        pytest.param([(2, 6)], id="covers-to-above"),
        pytest.param([(2, 5)], id="same"),
        pytest.param([(1, 6)], id="contains"),
        pytest.param([(8, 6)], id="inverted"),
        pytest.param([(2, 2), (3, 3), (4, 5)], id="several-overlapping"),
        pytest.param([(0, 0), (1, 2)], id="second-overlaps"),
        pytest.param([(10, 12), (11, 11)], id="own-overlap"),
        pytest.param([(10, 16)], id="beyond-range"),
        pytest.param([(-1, 0)], id="negative"),
        pytest.param([], id="empty"),
    ],
)
def test_sticky_rejects_bad_ranges_and_changes_nothing(ranges: list[tuple[int, int]]) -> None:
    selector: StickySelector[FakeConsumer] = StickySelector(range_size=16)
    holder = add_sticky(selector, "holder", (2, 5))
    published = selector.snapshot
    with pytest.raises(ConsumerAssignError) as raised:
        add_sticky(selector, "newcomer", *ranges)
    assert selector.snapshot is published
    assert [selector.lookup_authoritative(s) for s in range(16)] == [
        holder if 2 <= s <= 5 else None for s in range(16)
    ]
    if raised.value.conflicting is not None:
        assert raised.value.conflicting is holder
    # The failed consumer left no trace: the same slots can still be taken.
    taker = add_sticky(selector, "newcomer", (6, 15))
    assert selector.select(7) is taker


def test_sticky_conflict_names_the_holder_and_missing_ranges_are_rejected() -> None:
    selector: StickySelector[FakeConsumer] = StickySelector(range_size=16)
    holder = add_sticky(selector, "holder", (2, 5))
    with pytest.raises(ConsumerAssignError, match="conflict") as raised:
        add_sticky(selector, "newcomer", (5, 9))
    assert raised.value.conflicting is holder
    with pytest.raises(ConsumerAssignError, match="must not be empty"):
        selector.add(FakeConsumer("no ranges"))


def test_sticky_merges_a_consumers_adjacent_ranges() -> None:
    selector: StickySelector[FakeConsumer] = StickySelector(range_size=16)
    consumer = add_sticky(selector, "c", (4, 7), (0, 3), (10, 11))
    assert plain_ranges(selector.snapshot, consumer) == [(0, 7), (10, 11)]


# -- exhaustive equivalence during churn -------------------------------------------------


@dataclass
class Add:
    name: int
    start: int
    width: int


@dataclass
class Remove:
    index: int


OPERATIONS = st.lists(
    st.one_of(
        st.builds(
            Add,
            name=st.integers(0, 3),
            start=st.integers(0, 255),
            width=st.integers(1, 80),
        ),
        st.builds(Remove, index=st.integers(0, 30)),
    ),
    min_size=1,
    max_size=40,
)


def small_selector(kind: str) -> Selector[Any]:
    if kind == "auto-split":
        return AutoSplitSelector(range_size=256)
    if kind == "consistent":
        return ConsistentHashingSelector(replica_points=6, range_size=256)
    return StickySelector(range_size=256)


def apply_and_check(selector: Selector[Any], members: list[FakeConsumer], op: Any) -> None:
    """Apply one operation and check every invariant a change must keep."""
    before = selector.snapshot
    if isinstance(op, Add):
        consumer = FakeConsumer(f"c{op.name}")
        wanted = [HashRange(op.start, min(op.start + op.width - 1, 255))]
        try:
            changes = selector.add(consumer, wanted)
        except ConsumerAssignError:
            assert selector.snapshot is before
            return
        members.append(consumer)
    elif members:
        consumer = members.pop(op.index % len(members))
        changes = selector.remove(consumer)
    else:
        assert selector.remove(FakeConsumer("stranger")) == {}
        assert selector.snapshot is before
        return
    assert as_plain(changes) == brute_force_diff(before, selector.snapshot)
    assert_snapshot_matches_authoritative(selector)
    owners = {id(owner) for owner in selector.snapshot.owners if owner is not None}
    assert owners <= {id(member) for member in members}


@pytest.mark.parametrize("kind", ["auto-split", "consistent", "sticky"])
@settings(max_examples=60, deadline=None)
@given(operations=OPERATIONS)
def test_snapshot_equals_sorted_structure_after_every_change(
    kind: str, operations: list[Any]
) -> None:
    selector = small_selector(kind)
    members: list[FakeConsumer] = []
    for op in operations:
        apply_and_check(selector, members, op)


@pytest.mark.parametrize("kind", ["auto-split", "consistent", "sticky"])
def test_full_range_equivalence_over_a_long_random_sequence(kind: str) -> None:
    rng = random.Random(20240917)
    selector: Selector[Any] = (
        make_selector("STICKY", use_consistent_hashing=False, replica_points=0)
        if kind == "sticky"
        else make_selector(
            "AUTO_SPLIT", use_consistent_hashing=kind == "consistent", replica_points=100
        )
    )
    members: list[FakeConsumer] = []
    for step in range(24):
        before = selector.snapshot
        if members and (rng.random() < 0.4 or len(members) > 8):
            changes = selector.remove(members.pop(rng.randrange(len(members))))
        else:
            consumer = FakeConsumer(f"consumer{rng.randrange(5)}")
            start = rng.randrange(RANGE_SIZE)
            wanted = [HashRange(start, min(start + rng.randrange(1, 20000), RANGE_SIZE - 1))]
            try:
                changes = selector.add(consumer, wanted)
            except ConsumerAssignError:
                assert selector.snapshot is before
                continue
            members.append(consumer)
        assert_snapshot_matches_authoritative(selector)
        if step % 6 == 0:
            assert as_plain(changes) == brute_force_diff(before, selector.snapshot)
        hashes = [rng.getrandbits(31) for _ in range(200)]
        expected = [selector.lookup_authoritative(selector.slot(h)) for h in hashes]
        assert owner_ids(selector.select_batch(hashes)) == owner_ids(expected)
        assert owner_ids([selector.select(h) for h in hashes]) == owner_ids(expected)


# -- concurrency ---------------------------------------------------------------------------


@pytest.fixture
def fast_thread_switching() -> Iterator[None]:
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


@pytest.mark.parametrize("kind", ["auto-split", "consistent", "sticky"])
@pytest.mark.usefixtures("fast_thread_switching")
def test_concurrent_selection_sees_whole_published_snapshots(kind: str) -> None:
    factories: dict[str, Callable[[], Selector[Any]]] = {
        "auto-split": AutoSplitSelector,
        "consistent": lambda: ConsistentHashingSelector(20),
        "sticky": StickySelector,
    }
    selector = factories[kind]()
    for i in range(3):
        selector.add(FakeConsumer(f"stable-{i}"), [HashRange(i * 10000, i * 10000 + 4999)])
    published = [selector.snapshot]
    rng = random.Random(3)
    batch = [rng.getrandbits(31) for _ in range(64)]
    all_started = threading.Barrier(3, timeout=10)
    done = threading.Event()
    progress = threading.Condition()
    batches_done = 0
    # Consumers stay referenced by `published`, so their ids identify them.
    batches_seen: set[tuple[int | None, ...]] = set()
    singles_seen: set[tuple[int, int | None]] = set()
    errors: list[BaseException] = []

    def publish_and_let_readers_in() -> None:
        published.append(selector.snapshot)
        # Three more batches means some reader began one after this change.
        with progress:
            target = batches_done + 3
            assert progress.wait_for(lambda: batches_done >= target, timeout=10)

    def churn() -> None:
        try:
            all_started.wait()
            previous = None
            for i in range(150):
                # Alternate between two areas so STICKY ranges never overlap.
                area = (30000, 39999) if i % 2 else (40000, 59999)
                consumer = FakeConsumer(f"transient-{i % 4}")
                selector.add(consumer, [HashRange(area[0] + i % 7, area[1])])
                publish_and_let_readers_in()
                if previous is not None:
                    selector.remove(previous)
                    publish_and_let_readers_in()
                previous = consumer
        except BaseException as error:  # a thread's exception would not fail the test
            errors.append(error)
        finally:
            done.set()

    def read() -> None:
        nonlocal batches_done
        try:
            all_started.wait()
            while not done.is_set():
                batches_seen.add(tuple(owner_ids(selector.select_batch(batch))))
                for key_hash in batch[:8]:
                    singles_seen.add((key_hash, owner_ids([selector.select(key_hash)])[0]))
                with progress:
                    batches_done += 1
                    progress.notify_all()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=read), threading.Thread(target=read)]
    threads.append(threading.Thread(target=churn))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
        assert not thread.is_alive()
    assert errors == []

    slots = [selector.slot(h) for h in batch]
    whole_batches = {tuple(owner_ids(snap.select_many(slots))) for snap in published}
    assert batches_seen <= whole_batches
    assert len(batches_seen) > 2, "readers never overlapped a membership change"
    for key_hash, owner_id in singles_seen:
        slot = selector.slot(key_hash)
        assert any(owner_ids([snap.select(slot)])[0] == owner_id for snap in published)


# -- construction ----------------------------------------------------------------------


def test_make_selector_chooses_as_pulsar_does() -> None:
    assert isinstance(
        make_selector("AUTO_SPLIT", use_consistent_hashing=True, replica_points=7),
        ConsistentHashingSelector,
    )
    consistent = make_selector("auto_split", use_consistent_hashing=True, replica_points=7)
    assert isinstance(consistent, ConsistentHashingSelector)
    assert consistent.replica_points == 7
    assert isinstance(
        make_selector("AUTO_SPLIT", use_consistent_hashing=False, replica_points=7),
        AutoSplitSelector,
    )
    assert isinstance(
        make_selector("STICKY", use_consistent_hashing=True, replica_points=7), StickySelector
    )
    with pytest.raises(ValueError, match="unknown Key_Shared mode"):
        make_selector("SHARED", use_consistent_hashing=True, replica_points=7)


def test_empty_selectors_select_nobody() -> None:
    selectors: list[Selector[Any]] = [
        AutoSplitSelector(),
        ConsistentHashingSelector(),
        StickySelector(),
    ]
    for selector in selectors:
        assert selector.select(12345) is None
        assert selector.select_batch([1, 2, 3]) == [None, None, None]
        assert selector.lookup_authoritative(selector.slot(12345)) is None
        assert selector.snapshot.ranges() == {}


def test_snapshots_are_immutable_and_validated() -> None:
    snapshot: Snapshot[FakeConsumer] = Snapshot(0, (10, 20), (None, FakeConsumer("c")))
    with pytest.raises(AttributeError):
        snapshot.ends = (1,)
    with pytest.raises(ValueError, match="increase"):
        Snapshot(0, (10, 10), (None, None))
    with pytest.raises(ValueError, match="one owner per range"):
        Snapshot(0, (10,), (None, None))
    with pytest.raises(ValueError, match="power of two"):
        AutoSplitSelector(range_size=100)


@pytest.mark.parametrize("kind", ["auto-split", "consistent", "sticky"])
@pytest.mark.parametrize("members", [3, 300])
def test_select_batch_agrees_with_select_for_any_table_and_sequence(
    kind: str, members: int
) -> None:
    # select_batch takes a typed path for a bytes table and a list of hashes (compiled: no
    # boxing) and the generic one for an array('H') table (over 255 owners) or a tuple.
    selector: Selector[Any]
    if kind == "auto-split":
        selector = AutoSplitSelector()
    elif kind == "consistent":
        selector = ConsistentHashingSelector(replica_points=20)
    else:
        selector = StickySelector()
    width = RANGE_SIZE // members
    for i in range(members):
        ranges = [HashRange(i * width, (i + 1) * width - 1)] if kind == "sticky" else None
        selector.add(FakeConsumer(f"c{i}"), ranges)
    assert isinstance(selector.snapshot.slot_index, bytes) == (members < 255)
    rng = random.Random(members)
    hashes = [
        0,
        1,
        RANGE_SIZE - 1,
        RANGE_SIZE,
        2**31 - 1,
        *(rng.getrandbits(31) for _ in range(500)),
    ]
    expected = owner_ids([selector.select(h) for h in hashes])
    assert owner_ids(selector.select_batch(hashes)) == expected
    assert owner_ids(selector.select_batch(tuple(hashes))) == expected
    assert len(set(expected)) > min(members, 100) // 2  # spread over many owners


@pytest.mark.parametrize("owners", [3, 300])
def test_slot_table_agrees_with_the_binary_search_on_every_slot(owners: int) -> None:
    # More than 255 distinct owners switch the table from bytes to array('H').
    rng = random.Random(owners)
    consumers = [FakeConsumer(f"c{i}") for i in range(owners)]
    ends = [*sorted(rng.sample(range(1, RANGE_SIZE - 1), 2 * owners)), RANGE_SIZE - 1]
    choices: list[FakeConsumer | None] = [*consumers, None]
    snapshot: Snapshot[FakeConsumer] = Snapshot(1, ends, [rng.choice(choices) for _ in ends])
    slots = range(snapshot.start, snapshot.last + 1)
    assert len(snapshot.slot_index) == len(slots)
    assert isinstance(snapshot.slot_index, bytes) == (len(snapshot.slot_owners) <= 255)
    assert owner_ids(snapshot.select_many(slots)) == owner_ids([snapshot.search(s) for s in slots])
    assert owner_ids([snapshot.select(s) for s in slots]) == owner_ids(snapshot.select_many(slots))


# -- diffs between arbitrary snapshots ----------------------------------------------------


def random_snapshot(
    rng: random.Random, pool: Sequence[FakeConsumer | None], cuts: int
) -> Snapshot[Any]:
    """A snapshot in which every member of ``pool`` owns at least one range."""
    ends = [*sorted(rng.sample(range(1, RANGE_SIZE - 1), len(pool) + cuts - 1)), RANGE_SIZE - 1]
    owners = [*pool, *(rng.choice(pool) for _ in range(cuts))]
    rng.shuffle(owners)
    return Snapshot(1, ends, owners)


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    cuts=st.integers(0, 40),
    moved=st.integers(0, 40),
    joined=st.integers(0, 3),
    owners=st.sampled_from([1, 5, 252, 253, 254, 300]),
)
def test_diff_of_any_two_snapshots_equals_the_slot_by_slot_diff(
    seed: int, cuts: int, moved: int, joined: int, owners: int
) -> None:
    # The diff compares the owner tables in C when the owners of both snapshots fit one
    # byte between them (at most 256, None included) and walks every range end otherwise.
    # 254 consumers and None make the widest one-byte table; consumers that join in the
    # second snapshot take the union past 256, and 300 consumers make two-byte tables.
    rng = random.Random(seed)
    pool: list[FakeConsumer | None] = [FakeConsumer(f"c{i}") for i in range(owners)]
    pool.append(None)
    before = random_snapshot(rng, pool, cuts)
    after_ends = sorted({*before.ends[:-1], *rng.sample(range(1, RANGE_SIZE - 1), moved)})
    after_owners = [
        before.search(end) if rng.random() < 0.8 else rng.choice(pool) for end in after_ends
    ]
    after_owners.append(rng.choice(pool))
    for at in rng.sample(range(len(after_owners)), min(joined, len(after_owners))):
        after_owners[at] = FakeConsumer(f"joined at {at}")
    after = Snapshot(1, [*after_ends, RANGE_SIZE - 1], after_owners)
    assert as_plain(diff_snapshots(before, after)) == brute_force_diff(before, after)
    assert diff_snapshots(before, before) == {}


def test_diff_past_one_byte_of_owners_between_the_snapshots() -> None:
    # Each snapshot has 255 owners (a one-byte table), 257 between them: a 257th owner
    # numbered like the first would hide the move of the first owner's second range to it.
    consumers = [FakeConsumer(f"c{i}") for i in range(255)]
    ends = [*range(10, 2560, 10), RANGE_SIZE - 1]
    before: Snapshot[FakeConsumer] = Snapshot(1, ends, [*consumers, consumers[0]])
    first, second = FakeConsumer("first newcomer"), FakeConsumer("second newcomer")
    after: Snapshot[FakeConsumer] = Snapshot(
        1, ends, [first, *consumers[1:254], consumers[253], second]
    )
    assert isinstance(before.slot_index, bytes)
    assert isinstance(after.slot_index, bytes)
    expected = brute_force_diff(before, after)
    assert as_plain(diff_snapshots(before, after)) == expected
    assert expected[id(consumers[0])][0] == [(1, 10), (2551, RANGE_SIZE - 1)]


def test_consistent_hashing_snapshot_merges_neighbouring_points_of_one_owner() -> None:
    # Neighbouring points of one owner make one range, the wrap-around range above the
    # highest point included: one consumer owns the whole ring as a single range.
    for count in range(1, 6):
        selector: ConsistentHashingSelector[FakeConsumer] = ConsistentHashingSelector(100)
        for i in range(count):
            selector.add(FakeConsumer(f"c{i}"))
        snapshot = selector.snapshot
        assert all(a is not b for a, b in pairwise(snapshot.owners))
        if count == 1:
            assert snapshot.ends == (RANGE_SIZE - 1,)
        assert_snapshot_matches_authoritative(selector)
