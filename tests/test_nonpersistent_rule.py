"""The non-persistent delivery rule on its own: keep or drop per subscription at publish,
reads that skip dropped runs, no replay, and trimming (NonPersistentTopic /
NonPersistentDispatcher* in Pulsar)."""

from __future__ import annotations

from typing import Any

from brokerlet.actors.messages import AckDropped, ReadEntries, ReadIds
from brokerlet.dispatch.permits import PermitTotal
from brokerlet.storage.ledger import Entry, MemoryLedger, new_entry
from brokerlet.topicops.nonpersistent import NonPersistentRule


class Recorder:
    """Stands for a dispatcher: records what it was told."""

    def __init__(self) -> None:
        self.told: list[Any] = []

    def tell(self, message: Any) -> None:
        self.told.append(message)


def make() -> tuple[MemoryLedger, NonPersistentRule, list[tuple[int, list[Entry], bool]]]:
    ledger = MemoryLedger(1)
    replies: list[tuple[int, list[Entry], bool]] = []
    rule = NonPersistentRule(
        ledger, lambda _to, rid, entries, replay: replies.append((rid, entries, replay))
    )
    return ledger, rule, replies


def publish(ledger: MemoryLedger, rule: NonPersistentRule, count: int, batch: int = 1) -> None:
    first = ledger.last_entry_id + 1
    ledger.append([new_entry(b"x", 0, batch) for _ in range(count)], lambda _r: None)
    got: list[Entry] = []
    ledger.read(first, count, 0, lambda r: got.extend(r) if isinstance(r, list) else None)
    rule.appended(got)


def read(sub: str, read_id: int, start: int, max_entries: int = 100) -> ReadEntries:
    return ReadEntries(sub, read_id, start, max_entries, 0, None)


def test_a_subscription_without_permits_drops_and_acknowledges_what_arrives() -> None:
    ledger, rule, replies = make()
    dispatcher = Recorder()
    rule.subscribed("sub", dispatcher, PermitTotal())
    publish(ledger, rule, 3, batch=2)
    assert rule.dropped("sub")[0] == 6  # messages, as Pulsar's msgDrop counts them
    assert dispatcher.told == [AckDropped([0, 1, 2])]
    assert ledger.first_entry_id == 3  # nothing kept for anyone
    rule.read_entries(read("sub", 1, 0))
    assert replies == []  # waits at the end: nothing to deliver


def test_permits_decide_how_many_are_kept() -> None:
    ledger, rule, replies = make()
    permits = PermitTotal()
    permits.add(2)
    rule.subscribed("sub", Recorder(), permits)
    publish(ledger, rule, 5)
    assert rule.dropped("sub")[0] == 3
    rule.read_entries(read("sub", 1, 0))
    (read_id, entries, replay) = replies[-1]
    assert (read_id, [e.entry_id for e in entries], replay) == (1, [0, 1], False)


def test_a_waiting_read_is_served_past_dropped_runs() -> None:
    ledger, rule, replies = make()
    permits = PermitTotal()
    rule.subscribed("sub", Recorder(), permits)
    publish(ledger, rule, 2)  # dropped: no permits
    permits.add(1)
    rule.read_entries(read("sub", 7, 0))  # waits
    publish(ledger, rule, 1)
    assert [e.entry_id for e in replies[-1][1]] == [2]
    assert replies[-1][0] == 7


def test_replay_reads_answer_nothing_and_count_the_drop() -> None:
    ledger, rule, replies = make()
    permits = PermitTotal()
    permits.add(10)
    dispatcher = Recorder()
    rule.subscribed("a", dispatcher, permits)
    rule.subscribed("b", Recorder(), PermitTotal())
    publish(ledger, rule, 2)
    rule.read_ids(ReadIds("a", 3, [0, 1], None))
    assert replies[-1] == (3, [], True)
    assert rule.dropped("a")[0] == 2
    # Settled for the subscription, so its dispatcher drops them from its replay set
    # (before, a replay of ids nobody will ever acknowledge was asked for again and again).
    assert dispatcher.told[-1] == AckDropped([0, 1])


def test_entries_stay_until_the_slowest_keeping_subscription_read_them() -> None:
    ledger, rule, _replies = make()
    fast, slow = PermitTotal(), PermitTotal()
    fast.add(10)
    slow.add(10)
    rule.subscribed("fast", Recorder(), fast)
    rule.subscribed("slow", Recorder(), slow)
    publish(ledger, rule, 3)
    rule.read_entries(read("fast", 1, 0))
    assert ledger.first_entry_id == 0  # "slow" has not read them
    rule.read_entries(read("slow", 2, 0))
    assert ledger.first_entry_id == 3
    rule.unsubscribed("fast")
    rule.unsubscribed("slow")
    publish(ledger, rule, 1)  # no subscription: dropped at once, uncounted
    assert ledger.first_entry_id == ledger.last_entry_id + 1
