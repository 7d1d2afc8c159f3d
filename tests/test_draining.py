"""The draining-hashes tracker (PIP-379): ownership, blocking, unblock notifications."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from brokerlet.keyshared import (
    BATCH_UNBLOCKED,
    DrainingHashConflictError,
    DrainingHashesTracker,
)


@dataclass(eq=False)
class FakeConsumer:
    name: str


@pytest.fixture
def unblocked() -> list[int]:
    return []


@pytest.fixture
def tracker(unblocked: list[int]) -> DrainingHashesTracker[FakeConsumer]:
    return DrainingHashesTracker(unblocked.append)


@pytest.fixture
def c1() -> FakeConsumer:
    return FakeConsumer("consumer1")


@pytest.fixture
def c2() -> FakeConsumer:
    return FakeConsumer("consumer2")


def test_add_entry_creates_an_entry_owned_by_the_consumer(
    tracker: DrainingHashesTracker[FakeConsumer], c1: FakeConsumer
) -> None:
    tracker.add_entry(c1, 1)
    tracker.add_entry(c1, 1)
    entry = tracker.entry(1)
    assert entry is not None
    assert entry.consumer is c1
    assert entry.ref_count == 2
    assert 1 in tracker
    assert len(tracker) == 1


def test_hash_zero_is_rejected(
    tracker: DrainingHashesTracker[FakeConsumer], c1: FakeConsumer
) -> None:
    with pytest.raises(ValueError, match="not set"):
        tracker.add_entry(c1, 0)
    assert len(tracker) == 0
    assert tracker.should_block(c1, 0) is False
    assert tracker.reduce_ref_count(c1, 0, closing=False) is False


def test_another_consumer_cannot_reduce_or_add(
    tracker: DrainingHashesTracker[FakeConsumer], c1: FakeConsumer, c2: FakeConsumer
) -> None:
    tracker.add_entry(c1, 1)
    with pytest.raises(DrainingHashConflictError):
        tracker.reduce_ref_count(c2, 1, closing=False)
    with pytest.raises(DrainingHashConflictError):
        tracker.add_entry(c2, 1)
    entry = tracker.entry(1)
    assert entry is not None
    assert entry.consumer is c1
    assert entry.ref_count == 1


def test_reducing_to_zero_removes_the_entry(
    tracker: DrainingHashesTracker[FakeConsumer], c1: FakeConsumer, unblocked: list[int]
) -> None:
    tracker.add_entry(c1, 7)
    tracker.add_entry(c1, 7)
    assert tracker.reduce_ref_count(c1, 7, closing=False) is False
    assert tracker.entry(7) is not None
    assert tracker.reduce_ref_count(c1, 7, closing=False) is False
    assert tracker.entry(7) is None
    assert unblocked == []  # nobody was blocked, so nothing to announce
    assert tracker.reduce_ref_count(c1, 7, closing=False) is False  # gone: ignored


def test_owner_is_not_blocked_but_another_consumer_is(
    tracker: DrainingHashesTracker[FakeConsumer], c1: FakeConsumer, c2: FakeConsumer
) -> None:
    tracker.add_entry(c1, 1)
    assert tracker.should_block(c2, 1) is True
    assert tracker.should_block(c2, 1) is True
    entry = tracker.entry(1)
    assert entry is not None
    assert entry.blocked_count == 2
    assert tracker.should_block(c2, 2) is False  # not draining
    # The hash came back to its old owner: the entry goes and dispatch proceeds.
    assert tracker.should_block(c1, 1) is False
    assert tracker.entry(1) is None
    assert tracker.should_block(c2, 1) is False


def test_unblocking_a_blocked_hash_notifies_with_the_hash(
    tracker: DrainingHashesTracker[FakeConsumer],
    c1: FakeConsumer,
    c2: FakeConsumer,
    unblocked: list[int],
) -> None:
    tracker.add_entry(c1, 1)
    tracker.should_block(c2, 1)
    assert tracker.reduce_ref_count(c1, 1, closing=False) is True
    assert unblocked == [1]


def test_a_batch_gives_one_notification_at_its_end(
    tracker: DrainingHashesTracker[FakeConsumer],
    c1: FakeConsumer,
    c2: FakeConsumer,
    unblocked: list[int],
) -> None:
    for key_hash in (1, 2, 3):
        tracker.add_entry(c1, key_hash)
        tracker.should_block(c2, key_hash)
    tracker.start_batch()
    tracker.start_batch()  # batches nest; only the outermost end notifies
    assert tracker.reduce_ref_count(c1, 1, closing=False) is True
    assert tracker.reduce_ref_count(c1, 2, closing=False) is True
    tracker.end_batch()
    assert unblocked == []
    tracker.end_batch()
    assert unblocked == [BATCH_UNBLOCKED]
    with tracker.batch():
        pass  # nothing unblocked: no notification
    assert unblocked == [BATCH_UNBLOCKED]
    with tracker.batch():
        tracker.reduce_ref_count(c1, 3, closing=False)
    assert unblocked == [BATCH_UNBLOCKED, BATCH_UNBLOCKED]


def test_end_batch_without_start_is_an_error(
    tracker: DrainingHashesTracker[FakeConsumer],
) -> None:
    with pytest.raises(RuntimeError):
        tracker.end_batch()


def test_a_closing_consumer_gives_no_notification(
    tracker: DrainingHashesTracker[FakeConsumer],
    c1: FakeConsumer,
    c2: FakeConsumer,
    unblocked: list[int],
) -> None:
    tracker.add_entry(c1, 1)
    tracker.should_block(c2, 1)
    assert tracker.reduce_ref_count(c1, 1, closing=True) is True
    assert tracker.entry(1) is None
    assert unblocked == []
    with tracker.batch():
        tracker.add_entry(c1, 2)
        tracker.should_block(c2, 2)
        tracker.reduce_ref_count(c1, 2, closing=True)
    assert unblocked == []


def test_stats_per_consumer(
    tracker: DrainingHashesTracker[FakeConsumer], c1: FakeConsumer, c2: FakeConsumer
) -> None:
    tracker.add_entry(c1, 10)
    tracker.add_entry(c1, 10)
    tracker.add_entry(c1, 20)
    tracker.add_entry(c2, 30)
    tracker.should_block(c2, 10)
    tracker.reduce_ref_count(c2, 30, closing=False)
    stats = tracker.stats()
    assert set(map(id, stats)) == {id(c1), id(c2)}
    assert stats[c1] == {
        "drainingHashesCount": 2,
        "drainingHashesClearedTotal": 0,
        "drainingHashesUnackedMessages": 3,
        "drainingHashes": [
            {"hash": 10, "unackMsgs": 2, "blockedAttempts": 1},
            {"hash": 20, "unackMsgs": 1, "blockedAttempts": 0},
        ],
    }
    assert stats[c2]["drainingHashesCount"] == 0
    assert stats[c2]["drainingHashesClearedTotal"] == 1
    tracker.consumer_removed(c2)
    assert set(map(id, tracker.stats())) == {id(c1)}
    assert tracker.stats_for(c2)["drainingHashesCount"] == 0
    assert tracker.stats_for(FakeConsumer("stranger"))["drainingHashes"] == []


def test_clear_forgets_everything(
    tracker: DrainingHashesTracker[FakeConsumer], c1: FakeConsumer, unblocked: list[int]
) -> None:
    tracker.add_entry(c1, 1)
    tracker.clear()
    assert tracker.entry(1) is None
    assert tracker.stats() == {}
    assert tracker.reduce_ref_count(c1, 1, closing=False) is False
    assert unblocked == []
