"""Key_Shared's split of a read into per-consumer batches and entries held back.

The rules are those of Pulsar's ``PersistentStickyKeyDispatcherMultipleConsumers`` for a read
with nothing in the replay set and no hash draining: an entry goes to its hash's owner while
the owner has permits; once an entry of a hash is held back (no owner, no permits), the later
entries of that hash in the read are held too, so a key's order is kept.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from brokerlet.config import Settings
from brokerlet.dispatch.consumer import ConnectionHandle, Consumer
from brokerlet.dispatch.key_shared import KeySharedRules
from brokerlet.dispatch.replay import ReplaySet
from brokerlet.keyshared import ConsistentHashingSelector, KeySharedMeta
from brokerlet.storage.ledger import Entry
from brokerlet.transport.protocol import pb

_HANDLE = ConnectionHandle(peer="p", channel=None, event_loop=None)  # type: ignore[arg-type]
CONSUMERS = [
    Consumer(i, f"c{i}", "t", "s", pb.CommandSubscribe.Key_Shared, 0, _HANDLE) for i in range(4)
]


def _rules(members: int) -> KeySharedRules:
    rules = KeySharedRules(KeySharedMeta(), Settings(), lambda: None)
    selector: ConsistentHashingSelector[Consumer] = ConsistentHashingSelector(100)
    for consumer in CONSUMERS[:members]:
        selector.add(consumer)
    rules.selector = selector
    return rules


def _by_the_rules(
    entries: list[Entry], owners: list[Consumer | None], budgets: dict[Consumer, int]
) -> tuple[list[tuple[Consumer, list[int]]], list[int], dict[int, int]]:
    """The entry-by-entry rules for a read with nothing waiting or draining."""
    batches: dict[Consumer, list[int]] = {}
    held: list[int] = []
    blocked: set[int] = set()
    pending: dict[int, int] = {}
    for entry, consumer in zip(entries, owners, strict=True):
        if entry.key_hash in blocked:
            held.append(entry.entry_id)
        elif consumer is None or budgets.get(consumer, 0) <= 0:
            blocked.add(entry.key_hash)
            held.append(entry.entry_id)
        else:
            batches.setdefault(consumer, []).append(entry.entry_id)
            budgets[consumer] -= entry.num_messages
            pending[entry.entry_id] = entry.key_hash
    return list(batches.items()), held, pending


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 4),
    st.lists(st.tuples(st.integers(1, 12), st.sampled_from([1, 1, 1, 3])), max_size=40),
    st.lists(st.one_of(st.none(), st.integers(0, 15)), min_size=4, max_size=4),
)
def test_a_read_is_split_as_the_rules_split_it(
    members: int, read: list[tuple[int, int]], permits: list[int | None]
) -> None:
    rules = _rules(members)
    # Key hashes as kept on SEND (twelve keys, so hashes repeat within a read).
    entries = [
        Entry(1, entry_id, b"", 0, messages, 1_000_003 * key)
        for entry_id, (key, messages) in enumerate(read)
    ]
    budgets = {c: n for c, n in zip(CONSUMERS, permits, strict=True) if n is not None}
    owners = rules.selector.select_batch([entry.key_hash for entry in entries])
    expected_budgets = dict(budgets)
    expected = _by_the_rules(entries, owners, expected_budgets)

    batches, held = rules.assign(entries, budgets, ReplaySet(), from_replay=False)

    got_batches = [(c, [e.entry_id for e in batch]) for c, batch in batches.items()]
    assert got_batches == expected[0]
    assert [entry.entry_id for entry, _ in held] == expected[1]
    assert rules.pending_hashes == expected[2]
    assert budgets == expected_budgets
