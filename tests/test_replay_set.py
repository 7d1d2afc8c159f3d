"""The replay set against a plain model: entries in entry order, each once, with its hash.

`brokerlet.dispatch.replay.ReplaySet` keeps its order in a sorted list and its membership and
hashes in dicts; the model is a dict sorted on each read.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from brokerlet.dispatch.replay import ReplaySet

ENTRY = st.integers(min_value=0, max_value=40)
HASH = st.sampled_from([0, 0, 7, 11, 2**31])
STEP = st.one_of(
    st.tuples(st.just("add"), ENTRY, HASH),
    st.tuples(st.just("discard"), ENTRY, st.just(0)),
    st.tuples(st.just("clear"), st.just(0), st.just(0)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(STEP, max_size=60), ENTRY, st.integers(min_value=0, max_value=10))
def test_the_replay_set_reads_as_its_model(
    steps: list[tuple[str, int, int]], bound: int, count: int
) -> None:
    replay = ReplaySet()
    model: dict[int, int] = {}
    for operation, entry_id, key_hash in steps:
        if operation == "add":
            replay.add(entry_id, key_hash)
            model.setdefault(entry_id, key_hash)  # a second add keeps the first hash
        elif operation == "discard":
            replay.discard(entry_id)
            model.pop(entry_id, None)
        else:
            replay.clear()
            model.clear()
    ordered = sorted(model)
    assert list(replay) == ordered
    assert len(replay) == len(model)
    assert bool(replay) == bool(model)
    if model:
        assert replay.first() == ordered[0]
    assert replay.head(count) == ordered[:count]
    assert replay.up_to(bound) == [e for e in ordered if e <= bound]
    assert all((e in replay) for e in model)
    assert [replay.key_hash(e) for e in ordered] == [model[e] for e in ordered]
    assert set(replay.hashes()) == {h for h in model.values() if h}
    assert replay.unhashed == sum(1 for h in model.values() if not h)
