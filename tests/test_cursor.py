"""The cursor's acknowledgement state: runs of acked ids, against a plain set of ids."""

from __future__ import annotations

from bisect import bisect_right
from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from brokerlet.storage.cursor import Cursor, _bisect_right, _consecutive

IDS = st.integers(0, 120)


class CursorAgainstASet(RuleBasedStateMachine):
    """Every operation on a `Cursor` and on a set of acked ids must agree."""

    def __init__(self) -> None:
        super().__init__()
        self.cursor = Cursor(-1)
        self.mark_delete = -1
        self.acked: set[int] = set()

    def _settle(self) -> None:
        self.acked = {i for i in self.acked if i > self.mark_delete}
        while self.mark_delete + 1 in self.acked:
            self.mark_delete += 1
            self.acked.discard(self.mark_delete)

    @rule(entry_id=IDS)
    def ack(self, entry_id: int) -> None:
        before = self.mark_delete
        if entry_id > self.mark_delete:
            self.acked.add(entry_id)
        self._settle()
        assert self.cursor.ack(entry_id) == (self.mark_delete != before)

    @rule(low=IDS, width=st.integers(0, 30))
    def ack_range(self, low: int, width: int) -> None:
        before = self.mark_delete
        self.acked.update(range(max(low, self.mark_delete + 1), low + width + 1))
        self._settle()
        assert self.cursor.ack_range(low, low + width) == (self.mark_delete != before)

    @rule(
        entry_ids=st.lists(IDS, max_size=40)
        | st.lists(IDS, max_size=40).map(sorted)
        | st.tuples(IDS, st.integers(1, 40)).map(lambda run: list(range(run[0], sum(run))))
    )
    def ack_many(self, entry_ids: list[int]) -> None:
        # An ACK's ids in any order, with repeats; ascending and scattered, as a Key_Shared
        # consumer's are (each search starts at the previous id's run); an ascending run of
        # them is one range.
        before = self.mark_delete
        self.acked.update(i for i in entry_ids if i > self.mark_delete)
        self._settle()
        assert self.cursor.ack_many(entry_ids) == (self.mark_delete != before)

    @rule(entry_id=IDS)
    def ack_cumulative(self, entry_id: int) -> None:
        moved = entry_id > self.mark_delete
        self.mark_delete = max(self.mark_delete, entry_id)
        self._settle()
        assert self.cursor.ack_cumulative(entry_id) == moved

    @rule(mark_delete=st.integers(-1, 60))
    def reset(self, mark_delete: int) -> None:
        self.mark_delete, self.acked = mark_delete, set()
        self.cursor.reset(mark_delete)

    @invariant()
    def agrees(self) -> None:
        cursor = self.cursor
        assert cursor.mark_delete == self.mark_delete
        assert cursor.individually_acked == len(self.acked)
        ranges = cursor.acked_ranges()
        assert [i for low, high in ranges for i in range(low, high + 1)] == sorted(self.acked)
        assert [cursor.is_acked(i) for i in range(-1, 160)] == [
            i <= self.mark_delete or i in self.acked for i in range(-1, 160)
        ]
        assert [cursor.acked_from(i) for i in range(-1, 160)] == [
            i <= self.mark_delete or any(a >= i for a in self.acked) for i in range(-1, 160)
        ]
        for upto in (self.mark_delete + 1, 40, 90, 200):
            assert cursor.acked_up_to(upto) == sum(1 for i in self.acked if i <= upto)
        assert cursor.acked_runs == len(ranges)
        # Ascending, disjoint, not even touching: as few runs as the ids allow.
        assert all(low <= high for low, high in ranges)
        assert all(a[1] + 1 < b[0] for a, b in pairwise(ranges))
        assert not ranges or ranges[0][0] > self.mark_delete + 1
        restored = Cursor.restore(cursor.mark_delete, reversed(ranges))
        assert restored.acked_ranges() == ranges
        assert restored.individually_acked == cursor.individually_acked


CursorAgainstASet.TestCase.settings = settings(max_examples=150, stateful_step_count=40)
test_cursor_against_a_set = CursorAgainstASet.TestCase


def test_restore_skips_what_the_mark_delete_covers_and_moves_over_what_continues_it() -> None:
    cursor = Cursor.restore(10, [(5, 8), (9, 12), (14, 14), (15, 16), (20, 20)])
    assert cursor.mark_delete == 12
    assert cursor.acked_ranges() == [(14, 16), (20, 20)]
    assert cursor.individually_acked == 4


def test_saving_behind_one_unacked_entry_costs_the_gaps_not_the_acks() -> None:
    # A Shared subscription whose first entry stays unacked while a million after it are
    # acked: the saved state is one run, whatever the number of acks.
    cursor = Cursor(-1)
    for entry_id in range(1, 1_000_001):
        cursor.ack(entry_id)
    assert cursor.individually_acked == 1_000_000
    assert cursor.acked_ranges() == [(1, 1_000_000)]
    assert not cursor.is_acked(0)
    assert cursor.is_acked(999_999)
    assert cursor.ack(0)
    assert cursor.mark_delete == 1_000_000
    assert cursor.acked_ranges() == []


@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.integers(-(2**62), 2**62), max_size=40), x=st.integers(-(2**63), 2**63))
def test_the_typed_search_agrees_with_bisect(values: list[int], x: int) -> None:
    # Compiled, the cursor searches its runs with its own typed search (bisect's compares
    # objects); beyond 63 bits a compiled int is boxed, which it must still handle.
    values.sort()
    probes = [x, *values, *(v + 1 for v in values), *(v - 1 for v in values)]
    assert [_bisect_right(values, p) for p in probes] == [bisect_right(values, p) for p in probes]
    for lo in range(len(values) + 1):  # a search from a known lower bound, as _ack_each's
        assert _bisect_right(values, x, lo) == bisect_right(values, x, lo)


@settings(max_examples=300, deadline=None)
@given(
    ids=st.lists(st.integers(0, 12), min_size=1, max_size=8)
    | st.integers(0, 2**64).map(lambda first: list(range(first, first + 5)))
)
def test_a_run_of_ids_is_told_from_any_other_list(ids: list[int]) -> None:
    # ack_many takes a run as one range; compiled, the run is checked by a typed loop.
    first = ids[0]
    assert _consecutive(ids, first) == (ids == list(range(first, first + len(ids))))
