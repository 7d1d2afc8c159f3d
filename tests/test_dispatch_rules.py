"""dispatch/ without an actor or a socket: strategies, the delivery book, shared token buckets,
the layout rule that keeps gevent out; and the actors' own rules: refusing messages they do
not handle, a broker-initiated close ordered after the consumer's queued messages, and stats
that never hold a topic actor up."""

from __future__ import annotations

import ast
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gevent.event
import mmh3
import pykka
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brokerlet.actors import stats_reader
from brokerlet.actors._runtime import GeventActor
from brokerlet.actors.broker import BrokerActor
from brokerlet.actors.connection import ConnectionActor
from brokerlet.actors.eventloop import EventLoopActor
from brokerlet.actors.messages import (
    AddConsumer,
    ConsumerClosedByBroker,
    GetLastEntry,
    OpenTopic,
    SendMessageBatches,
    SendMessages,
    Subscribe,
    UnexpectedMessage,
)
from brokerlet.actors.topic import TopicActor
from brokerlet.config import load_settings
from brokerlet.dispatch.consumer import ConnectionHandle, Consumer
from brokerlet.dispatch.delivery import DeliveryBook
from brokerlet.dispatch.filters import SkipSettled
from brokerlet.dispatch.ratelimit import TokenBucket
from brokerlet.dispatch.replay import ReplaySet
from brokerlet.dispatch.shared import SharedStrategy
from brokerlet.dispatch.single_active import Placement, SingleActiveStrategy, ring_pick
from brokerlet.dispatch.strategy import EXCLUSIVE, FAILOVER, SHARED
from brokerlet.metadata import MetadataStore
from brokerlet.storage import MemoryLedger
from brokerlet.storage.cursor import Cursor
from brokerlet.storage.ledger import Entry
from brokerlet.topicops import api as topicops_api
from brokerlet.transport.protocol import FrameDecoder, pb
from tests.dispatch_harness import Block, FakeChannel, Harness, Noop, make_entry

DISPATCH = Path(__file__).resolve().parent.parent / "brokerlet" / "dispatch"


def make_book(durable: bool = True) -> DeliveryBook:
    return DeliveryBook(load_settings(env={}), Cursor(-1), durable=durable, writability_gating=True)


def join(
    book: DeliveryBook, name: str, sub_type: int, priority: int = 0, permits: int = 0
) -> Consumer:
    handle = ConnectionHandle(peer=name, channel=FakeChannel(), event_loop=None)  # type: ignore[arg-type]
    consumer = Consumer(len(book.consumers) + 1, name, "t", "s", sub_type, priority, handle)
    consumer.flow(permits)
    book.consumers.append(consumer)
    book.consumers.sort(key=lambda c: c.priority)
    return consumer


def entries(count: int) -> list[Entry]:
    return [Entry(1, i, b"x", 0, 1) for i in range(count)]


class Recorder:
    def __init__(self, book: DeliveryBook) -> None:
        self.book = book
        self.batches: list[tuple[str, list[int]]] = []

    def __call__(self, consumer: Consumer, batch: list[Entry], messages: int) -> None:
        self.book.record(consumer, batch, messages)
        self.batches.append((consumer.name, [e.entry_id for e in batch]))


def test_shared_hands_out_round_robin_chunks_within_each_budget() -> None:
    book = make_book()
    join(book, "a", SHARED, permits=100)
    join(book, "b", SHARED, permits=3)
    deliver = Recorder(book)
    held = SharedStrategy(book, chunk=2).assign(entries(9), deliver, replay=False)
    assert deliver.batches == [
        ("a", [0, 1]),
        ("b", [2, 3]),
        ("a", [4, 5]),
        ("b", [6]),
        ("a", [7, 8]),
    ]
    assert held == []


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(1, 10), max_size=30),  # each entry's messages (a batch: several)
    st.lists(st.integers(0, 40), min_size=1, max_size=3),  # each consumer's permits
    st.integers(1, 12),  # the chunk
)
def test_in_order_chunks_fill_each_budget_as_the_entry_by_entry_rule_does(
    counts: list[int], permits: list[int], chunk: int
) -> None:
    # The rule (InOrderChunks.assign before it summed chunks in C): entries go to a consumer
    # while the messages before each are under its budget, at least one, at most `chunk`.
    book = make_book()
    for index, granted in enumerate(permits):
        join(book, f"c{index}", SHARED, permits=granted)
    read = [Entry(1, i, b"x", 0, n) for i, n in enumerate(counts)]
    deliver = Recorder(book)
    held = SharedStrategy(book, chunk=chunk).assign(read, deliver, replay=False)
    budgets = {f"c{i}": granted for i, granted in enumerate(permits)}
    index = 0
    for name, ids in deliver.batches:
        expected: list[int] = []
        messages = 0
        while (
            index < len(read)
            and len(expected) < chunk
            and (messages < budgets[name] or not expected)
        ):
            expected.append(index)
            messages += counts[index]
            index += 1
        assert ids == expected
        budgets[name] -= messages
    assert [entry.entry_id for entry, _ in held] == list(range(index, len(read)))


def test_skip_settled_drops_entries_acked_ahead_of_a_read_and_keeps_the_rest() -> None:
    # A rewound read (after the last consumer left, say) meets entries acked individually
    # ahead of the mark-delete position; a read past the highest acked id keeps everything.
    cursor = Cursor(-1)
    for entry_id in (0, 1, 4, 7):
        cursor.ack(entry_id)
    replay = ReplaySet()
    rule = SkipSettled(cursor, replay)
    ids = [e.entry_id for e in rule.admit(entries(10), replay=False)]
    assert ids == [2, 3, 5, 6, 8, 9]
    tail = entries(12)[8:]
    assert rule.admit(tail, replay=False) == tail
    replay.add(3)
    assert [e.entry_id for e in rule.admit(entries(6), replay=True)] == [3]


def test_shared_serves_a_higher_priority_level_only_when_the_lower_cannot_take_any() -> None:
    book = make_book()
    low = join(book, "low", SHARED, priority=0, permits=2)
    join(book, "high", SHARED, priority=1, permits=10)
    deliver = Recorder(book)
    SharedStrategy(book, chunk=10).assign(entries(5), deliver, replay=False)
    assert deliver.batches == [("low", [0, 1]), ("high", [2, 3, 4])]
    assert low.permits == 0


FIRST_PARTITION = Placement(partition=0, ring=False)  # index 0: the first in rank


def test_failover_ranks_by_priority_then_name_and_moves_pending() -> None:
    book = make_book()
    strategy = SingleActiveStrategy(book, FAILOVER, FIRST_PARTITION)
    zed = join(book, "zed", FAILOVER, permits=10)
    assert strategy.membership_changed() is None
    assert strategy.candidates() == (zed,)
    deliver = Recorder(book)
    strategy.assign(entries(3), deliver, replay=False)
    assert deliver.batches == [("zed", [0, 1, 2])]
    alpha = join(book, "alpha", FAILOVER)
    assert strategy.membership_changed() is zed, "zed's unacked entries must move to alpha"
    assert strategy.candidates() == (alpha,)
    join(book, "first", FAILOVER, priority=-1)
    strategy.membership_changed()
    assert strategy.active is not None
    assert strategy.active.name == "first"


def _active_name(topic: str, names: list[str], partition: int = -1, **settings: bool) -> str:
    """Which of ``names`` Failover makes active on ``topic`` (one priority level)."""
    book = make_book()
    placement = Placement.of(topic, partition, **settings)
    strategy = SingleActiveStrategy(book, FAILOVER, placement)
    for name in names:
        join(book, name, FAILOVER)
    strategy.membership_changed()
    assert strategy.active is not None
    return strategy.active.name


@pytest.mark.parametrize(
    ("partition", "names", "active"),
    [
        (0, ["b", "a"], "a"),
        (1, ["b", "a"], "b"),
        (5, ["c", "a", "b"], "c"),  # 5 % 3
    ],
)
def test_failover_spreads_the_partitions_of_a_partitioned_topic(
    partition: int, names: list[str], active: str
) -> None:
    # AbstractDispatcherSingleActiveConsumer.pickAndScheduleActiveConsumer: consumers sorted
    # by priority level and name, a partition's active one at its index modulo their count.
    topic = f"persistent://public/default/t-partition-{partition}"
    assert _active_name(topic, names, partition) == active


def test_failover_spreads_partitions_over_the_highest_priority_level_only() -> None:
    # Consumers of a lower level (a higher number) stand by until the higher level empties.
    book = make_book()
    strategy = SingleActiveStrategy(book, FAILOVER, Placement(partition=3, ring=False))
    join(book, "low", FAILOVER, priority=1)
    first, second = join(book, "x", FAILOVER), join(book, "y", FAILOVER)
    strategy.membership_changed()
    assert strategy.active is second  # 3 % 2 among x and y
    book.consumers.remove(second)
    assert strategy.membership_changed() is None  # y left: nothing of its to move
    assert strategy.active is first
    book.consumers.remove(first)
    strategy.membership_changed()
    assert strategy.active is not None
    assert strategy.active.name == "low"


def test_failover_on_a_plain_topic_reads_a_ring_of_the_consumer_names() -> None:
    # AbstractDispatcherSingleActiveConsumer: 100 points per consumer, murmur3 (31 bits) of
    # consumerName + j; the owner of the first point at or after murmur3 of the topic's
    # full name is active, the lowest point's owner if none is after it.
    names = ["c1", "c2", "c3"]
    owners = {
        mmh3.hash(f"{name}{j}".encode()) & 0x7FFFFFFF: name for name in names for j in range(100)
    }
    points = sorted(owners)
    for index in range(40):
        topic = f"persistent://public/default/ring-{index}"
        at = mmh3.hash(topic.encode()) & 0x7FFFFFFF
        expected = owners[next((p for p in points if p >= at), points[0])]
        assert _active_name(topic, names) == expected
        assert _active_name(topic, names[::-1]) == expected  # whatever the joining order
    assert ring_pick(names, points[-1] + 1) == names.index(owners[points[0]])  # wraps


def test_failover_ring_spreads_topics_and_keeps_the_active_one_when_another_leaves() -> None:
    names = ["alpha", "bravo", "charlie"]
    topics = [f"persistent://public/default/spread-{i}" for i in range(300)]
    picks = {topic: _active_name(topic, names) for topic in topics}
    shares = [sum(1 for name in picks.values() if name == n) for n in names]
    assert all(share > 50 for share in shares), shares  # 100 each, give or take
    for topic, active in picks.items():
        # Consistent hashing: only the consumers whose points go away lose topics.
        others = [n for n in names if n != active]
        assert _active_name(topic, [active, others[0]]) == active
        assert _active_name(topic, [*names, "delta"]) in (active, "delta")


def test_failover_partitions_take_the_ring_with_consistent_hashing() -> None:
    # activeConsumerFailoverConsistentHashing=true: partitions too read the ring, so a
    # partition's pick no longer follows its index.
    names = ["a", "b", "c"]
    by_ring = [
        _active_name(
            f"persistent://public/default/p-partition-{i}", names, i, consistent_hashing=True
        )
        for i in range(30)
    ]
    by_index = [
        _active_name(f"persistent://public/default/p-partition-{i}", names, i) for i in range(30)
    ]
    assert by_index == [names[i % 3] for i in range(30)]
    assert by_ring == [
        names[
            ring_pick(
                names,
                mmh3.hash(f"persistent://public/default/p-partition-{i}".encode()) & 0x7FFFFFFF,
            )
        ]
        for i in range(30)
    ]
    assert by_ring != by_index


def test_failover_holds_delivery_after_each_change_and_tells_of_it_at_the_end() -> None:
    # PersistentDispatcherSingleActiveConsumer.scheduleReadOnActiveConsumer: with
    # activeConsumerFailoverDelayTimeMillis the read (and the notices) wait after every
    # change of the active consumer, the first one's included; a new change meanwhile does
    # not restart the wait.
    clock = SimpleNamespace(now=100.0)
    wakes: list[float] = []
    book = make_book()
    strategy = SingleActiveStrategy(
        book,
        FAILOVER,
        FIRST_PARTITION,
        hold_ms=1000,
        wake_after=wakes.append,
        clock=lambda: clock.now,
    )
    first = join(book, "b", FAILOVER, permits=10)
    assert strategy.membership_changed() is None
    assert strategy.holding
    assert wakes == [1000.0]
    assert strategy.candidates() == ()
    assert strategy.active_notices(first) == []  # told when the hold ends
    clock.now += 0.4
    second = join(book, "a", FAILOVER, permits=10)  # takes over (index 0) during the hold
    assert strategy.membership_changed() is first
    assert strategy.active is second
    assert strategy.candidates() == ()
    assert wakes[-1] == pytest.approx(600.0)  # the first hold's end, not a new one
    deliver = Recorder(book)
    assert [e.entry_id for e, _ in strategy.assign(entries(2), deliver, replay=False)] == [0, 1]
    assert deliver.batches == []
    clock.now += 0.6
    assert not strategy.holding
    # A pass between the hold's end and its timer's (which announces) delivers nothing yet:
    # Pulsar tells of the change before the read it schedules.
    assert strategy.candidates() == ()
    assert strategy.next_consumer() is None
    assert dict(strategy.active_notices(None)) == {second: True, first: False}
    assert strategy.candidates() == (second,)
    third = join(book, "c", FAILOVER)  # no change: hears at once who is active
    assert strategy.membership_changed() is None
    assert strategy.active_notices(third) == [(third, False)]


def test_failover_without_a_hold_and_exclusive_deliver_at_once() -> None:
    for sub_type, hold_ms in ((FAILOVER, 0), (EXCLUSIVE, 1000)):
        book = make_book()
        strategy = SingleActiveStrategy(
            book, sub_type, FIRST_PARTITION, hold_ms=hold_ms, wake_after=lambda _ms: None
        )
        consumer = join(book, "only", sub_type, permits=1)
        strategy.membership_changed()
        assert not strategy.holding
        assert strategy.candidates() == (consumer,)


def test_exclusive_refuses_a_second_consumer() -> None:
    book = make_book()
    strategy = SingleActiveStrategy(book, EXCLUSIVE)
    first = join(book, "first", EXCLUSIVE)
    strategy.membership_changed()
    with pytest.raises(Exception, match="Exclusive consumer is already connected"):
        strategy.add(Consumer(9, "second", "t", "s", EXCLUSIVE, 0, first.connection))


def test_average_messages_per_entry_moves_as_pulsars_consumer_does() -> None:
    # Pulsar's Consumer.sendMessages: the first delivery sets the average, each later one
    # weighs a tenth; getAvgMessagesPerEntry (the stats' avgMessagesPerEntry) rounds it.
    book = make_book()
    consumer = join(book, "c", SHARED, permits=10_000)
    assert consumer.messages_per_entry == 0
    book.record(consumer, [Entry(1, i, b"x", 0, 100) for i in range(2)], 200)
    assert consumer.messages_per_entry == 100
    book.record(consumer, [Entry(1, 2, b"x", 0, 1)], 1)
    assert consumer.avg_messages_per_entry == pytest.approx(90.1)
    assert consumer.messages_per_entry == 90
    for entry_id in range(3, 43):
        book.record(consumer, [Entry(1, entry_id, b"x", 0, 1)], 1)
    assert consumer.messages_per_entry == 2  # 1 + 89.1 * 0.9**40 = 2.32


def test_the_unacked_limit_blocks_a_consumer_until_acks_bring_it_to_half() -> None:
    settings = load_settings(env={}, overrides={"max_unacked_messages_per_consumer": 4})
    book = DeliveryBook(settings, Cursor(-1), durable=True, writability_gating=True)
    consumer = join(book, "c", SHARED, permits=100)
    assert book.budget(consumer) == 4
    book.record(consumer, entries(4), 4)
    assert consumer.blocked
    assert not book.available(consumer)
    book.ack([0], cumulative=False)
    assert consumer.blocked, "3 unacked is above half the limit"
    book.ack([1], cumulative=False)
    assert not consumer.blocked
    assert book.available(consumer)


def test_a_shared_token_bucket_loses_no_charge_to_racing_threads() -> None:
    """Topic and broker buckets are charged by many dispatchers: the bucket's lock must hold
    on real threads (with a frozen clock nothing refills, so every charge must show)."""
    bucket = TokenBucket(1_000_000, clock=lambda: 0.0)
    threads = [
        threading.Thread(target=lambda: [bucket.charge(1) for _ in range(20_000)]) for _ in range(8)
    ]
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as CPython allows
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        sys.setswitchinterval(previous)
    assert not any(t.is_alive() for t in threads)
    assert bucket.tokens == 1_000_000 - 8 * 20_000


def test_dispatch_modules_import_nothing_from_gevent() -> None:
    """dispatch/ is runtime-free: no gevent, and Pykka or the actors only for type names."""
    for path in sorted(DISPATCH.glob("*.py")):
        tree = ast.parse(path.read_text())
        type_only: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
                type_only.update(id(child) for child in ast.walk(node))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom) or id(node) in type_only:
                continue
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            for name in names:
                assert not name.startswith("gevent"), f"{path.name} imports {name}"
                assert not name.startswith("pykka"), f"{path.name} imports {name}"
                allowed = name == "brokerlet.actors.errors"
                assert allowed or not name.startswith("brokerlet.actors"), f"{path.name}: {name}"


class Unknown:
    def __repr__(self) -> str:
        return "<Unknown>"


@pytest.fixture
def harness() -> Iterator[Harness]:
    h = Harness(GeventActor)
    yield h
    h.stop()


def test_every_actor_refuses_a_message_it_has_no_handler_for(harness: Harness) -> None:
    settings = load_settings(env={})
    broker = BrokerActor.start(settings)
    loop = EventLoopActor.start(0)
    handle = ConnectionHandle(peer="p", channel=FakeChannel(), event_loop=loop)  # type: ignore[arg-type]
    refs: list[pykka.ActorRef[pykka.Actor]] = [
        broker,
        loop,
        TopicActor.start("persistent://public/default/t", MemoryLedger(1), settings),
        ConnectionActor.start(
            handle=handle,
            broker=broker,
            settings=settings,
            advertised_url="pulsar://127.0.0.1:6650",
            close_socket=lambda _reason: None,
            metadata=MetadataStore(None),
        ),
    ]
    try:
        for ref in [*refs, harness.dispatcher]:
            with pytest.raises(UnexpectedMessage, match="has no handler for <Unknown>"):
                ref.ask(Unknown(), block=True, timeout=5)
    finally:
        for ref in reversed(refs):
            ref.stop(block=True, timeout=5)


class RecordingChannel:
    """Records each write's bytes, in the order the channel would send them."""

    def __init__(self) -> None:
        self.writable = True
        self.send_blocked = False  # every write goes straight into the kernel
        self.writes: list[bytes] = []

    def write(self, data: bytes | list[bytes], callback: Any = None) -> None:
        self.writes.append(data if isinstance(data, bytes) else b"".join(data))
        if callback is not None:
            callback(None)


class HoldableLoop(EventLoopActor):
    def on_receive(self, message: Any) -> None:
        if isinstance(message, Block):
            message.entered.set()
            message.release.wait(10)
        elif not isinstance(message, Noop):
            super().on_receive(message)


@dataclass(frozen=True)
class Register:
    consumer: Consumer


class ConnectionWithConsumer(ConnectionActor):
    """A connection actor that is handed a consumer without a SUBSCRIBE round trip."""

    def on_receive(self, message: Any) -> None:
        if isinstance(message, Register):
            self.consumers[message.consumer.consumer_id] = message.consumer
        else:
            super().on_receive(message)


class NoCompletion:
    def request(self) -> None:
        pass


def test_a_broker_initiated_close_follows_the_consumers_queued_messages() -> None:
    """CLOSE_CONSUMER goes through the connection's event loop, behind the MESSAGE frames
    already queued there for the consumer, so the client never sees a message after the
    close of its consumer."""
    settings = load_settings(env={})
    channel = RecordingChannel()
    loop = HoldableLoop.start(0)
    handle = ConnectionHandle(peer="p", channel=channel, event_loop=loop)  # type: ignore[arg-type]
    broker = BrokerActor.start(settings)
    connection = ConnectionWithConsumer.start(
        handle=handle,
        broker=broker,
        settings=settings,
        advertised_url="pulsar://127.0.0.1:6650",
        close_socket=lambda _reason: None,
        metadata=MetadataStore(None),
    )
    consumer = Consumer(1, "c", "t", "s", SHARED, 0, handle)
    try:
        connection.ask(Register(consumer), block=True, timeout=5)
        entered, release = gevent.event.Event(), gevent.event.Event()
        loop.tell(Block(entered, release))
        assert entered.wait(5)
        loop.tell(SendMessages(consumer, [make_entry(0)], [0], NoCompletion()))
        connection.ask(ConsumerClosedByBroker(consumer), block=True, timeout=5)
        release.set()
        loop.ask(Noop(), block=True, timeout=5)
        decoder = FrameDecoder(1 << 20)
        kinds = [f.command.type for write in channel.writes for f in decoder.feed(write)]
        assert kinds == [pb.BaseCommand.MESSAGE, pb.BaseCommand.CLOSE_CONSUMER]
    finally:
        for ref in (connection, broker, loop):
            ref.stop(block=True, timeout=5)


class CountingCompletion:
    def __init__(self) -> None:
        self.requests = 0

    def request(self) -> None:
        self.requests += 1


def test_a_connections_batches_of_one_pass_are_one_write() -> None:
    """A dispatch pass's batches for one connection reach its event loop as one message; the
    loop writes them, in their order, as one write whose completion requests each distinct
    completion once (eventloop.py; many consumers share the official client's connection)."""
    channel = RecordingChannel()
    loop = HoldableLoop.start(0)
    handle = ConnectionHandle(peer="p", channel=channel, event_loop=loop)  # type: ignore[arg-type]
    a, b = (Consumer(i, name, "t", "s", SHARED, 0, handle) for i, name in ((1, "a"), (2, "b")))
    gate, notice = CountingCompletion(), CountingCompletion()
    batches = [
        SendMessages(a, [make_entry(0)], [0], gate),
        SendMessages(b, [make_entry(2), make_entry(3)], [0, 0], gate),
        SendMessages(a, [make_entry(4)], [0], notice),
    ]
    try:
        loop.tell(SendMessageBatches(batches))
        loop.ask(Noop(), block=True, timeout=5)
    finally:
        loop.stop(block=True, timeout=5)
    assert len(channel.writes) == 1
    decoder = FrameDecoder(1 << 20)
    sent = [
        (f.command.message.consumer_id, f.command.message.message_id.entry_id)
        for f in decoder.feed(channel.writes[0])
    ]
    assert sent == [(1, 0), (2, 2), (2, 3), (1, 4)]
    assert (gate.requests, notice.requests) == (1, 1)


def test_a_consumer_its_client_closed_gets_no_message_frame_after() -> None:
    """CLOSE_CONSUMER is answered before the dispatcher removes the consumer (connection.py,
    ``_close_consumer``); batches for it still on their way are not written after that answer
    (the dispatcher takes them back as it removes the consumer), and their completions are
    still requested, so the dispatcher reads again as after a write."""
    channel = RecordingChannel()
    loop = HoldableLoop.start(0)
    handle = ConnectionHandle(peer="p", channel=channel, event_loop=loop)  # type: ignore[arg-type]
    a, b = (Consumer(i, name, "t", "s", SHARED, 0, handle) for i, name in ((1, "a"), (2, "b")))
    a.closed = True
    together, alone = CountingCompletion(), CountingCompletion()
    try:
        loop.tell(
            SendMessageBatches(
                [
                    SendMessages(a, [make_entry(0)], [0], together),
                    SendMessages(b, [make_entry(1)], [0], together),
                ]
            )
        )
        loop.tell(SendMessages(a, [make_entry(2)], [0], alone))
        loop.ask(Noop(), block=True, timeout=5)
    finally:
        loop.stop(block=True, timeout=5)
    decoder = FrameDecoder(1 << 20)
    sent = [f.command.message.consumer_id for write in channel.writes for f in decoder.feed(write)]
    assert sent == [2]
    assert (together.requests, alone.requests) == (1, 1)


class SlowStatsChannel(FakeChannel):
    """A channel whose statistics wait for ``release``: a dispatcher asked for stats is busy."""

    def __init__(self, entered: Any, release: Any) -> None:
        super().__init__()
        self.entered = entered
        self.release = release

    def statistics(self) -> Any:
        self.entered.set()
        self.release.wait(10)
        return super().statistics()


def test_a_stats_request_never_holds_the_topic_actor_while_a_dispatcher_is_busy() -> None:
    """The topic answers its own part and the caller asks the dispatchers, so a slow
    subscription cannot stall the topic's appends behind a /metrics scrape."""
    settings = load_settings(env={})
    topic = TopicActor.start("persistent://public/default/t", MemoryLedger(1), settings)
    entered, release = gevent.event.Event(), gevent.event.Event()
    try:
        dispatcher = topic.ask(Subscribe("s", SHARED, True, 0), block=True)
        handle = ConnectionHandle("p", SlowStatsChannel(entered, release), event_loop=None)  # type: ignore[arg-type]
        dispatcher.ask(AddConsumer(Consumer(1, "c", "t", "s", SHARED, 0, handle)), block=True)
        reader = gevent.spawn(stats_reader.of_topic, topic)
        assert entered.wait(5), "the dispatcher never started on its stats"
        # The dispatcher is busy with the stats; the topic must still answer at once.
        assert topic.ask(GetLastEntry(), block=True, timeout=1) == (1, -1)
        release.set()
        stats = reader.get(timeout=5)
        assert list(stats["subscriptions"]) == ["s"]
        assert stats["subscriptions"]["s"]["consumers"][0]["consumerName"] == "c"
    finally:
        release.set()
        topic.stop(block=True, timeout=5)


class _OneTopicBroker:
    """Stands for the broker actor: ``OpenTopic`` answers the one topic."""

    def __init__(self, topic: Any) -> None:
        self.topic = topic

    def ask(self, message: Any, **_kwargs: Any) -> Any:
        assert isinstance(message, OpenTopic), message
        return self.topic


@pytest.mark.parametrize("operation", ["stats", "internalStats"])
def test_the_admin_stats_never_hold_the_topic_actor_while_a_dispatcher_is_busy(
    operation: str,
) -> None:
    """The admin routes' stats (topicops.api) take stats_reader's path: the topic answers its
    part and the dispatchers' refs, the caller's greenlet asks the dispatchers."""
    settings = load_settings(env={})
    topic = TopicActor.start("persistent://public/default/t", MemoryLedger(1), settings)
    entered, release = gevent.event.Event(), gevent.event.Event()
    try:
        dispatcher = topic.ask(Subscribe("s", SHARED, True, 0), block=True)
        handle = ConnectionHandle("p", SlowStatsChannel(entered, release), event_loop=None)  # type: ignore[arg-type]
        dispatcher.ask(AddConsumer(Consumer(1, "c", "t", "s", SHARED, 0, handle)), block=True)
        broker = _OneTopicBroker(topic)
        gather = topicops_api.topic_stats if operation == "stats" else topicops_api.internal_stats
        reader = gevent.spawn(gather, broker, "persistent://public/default/t")
        assert entered.wait(5), "the dispatcher never started on its stats"
        assert topic.ask(GetLastEntry(), block=True, timeout=1) == (1, -1)
        release.set()
        stats = reader.get(timeout=5)
        if operation == "stats":
            assert stats["subscriptions"]["s"]["consumers"][0]["consumerName"] == "c"
            assert stats["terminated"] is False
        else:
            assert stats["cursors"]["s"]["active"] is True
            assert stats["cursors"]["s"]["markDeletePosition"] == "1:-1"
    finally:
        release.set()
        topic.stop(block=True, timeout=5)
