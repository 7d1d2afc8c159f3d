"""A dispatcher with fake neighbours, for driving it message by message under either runtime.

The dispatcher talks to a topic (reads) and to event loops (consumer batches). Here both are
small actors of the runtime under test: the topic serves reads from a list it is told to
append to (waiting reads complete on append, like the real long poll), and the event loop
records every batch and, when asked, completes the write at once.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import gevent
import pykka

from brokerlet.actors._runtime import GreenletTimer
from brokerlet.actors.dispatcher import Dispatcher
from brokerlet.actors.messages import (
    AddConsumer,
    CancelRead,
    EntriesRead,
    MarkDeleteMoved,
    ReadEntries,
    ReadIds,
    RemoveConsumer,
    SendMessageBatches,
    SendMessages,
    SubscriptionClosed,
)
from brokerlet.config import Settings, load_settings
from brokerlet.dispatch.consumer import ConnectionHandle, Consumer
from brokerlet.dispatch.options import DEFAULT_OPTIONS, DispatchOptions
from brokerlet.dispatch.single_active import Placement, ring_pick
from brokerlet.keyshared import KeySharedMeta
from brokerlet.storage.cursor import Cursor
from brokerlet.storage.ledger import Entry
from brokerlet.transport.channel import ChannelStatistics
from brokerlet.transport.protocol import build_entry, pb

LEDGER = 7


def make_entry(entry_id: int, num_messages: int = 1, size: int = 16) -> Entry:
    return Entry(LEDGER, entry_id, b"x" * size, 0, num_messages)


def make_keyed_entry(entry_id: int, key: str) -> Entry:
    """An entry with real metadata, so Key_Shared can hash its partition key."""
    metadata = pb.MessageMetadata(
        producer_name="harness", sequence_id=entry_id, publish_time=0, partition_key=key
    )
    return Entry(LEDGER, entry_id, build_entry(metadata, b"x"), 0, 1)


class FakeChannel:
    """Only what dispatch reads of a channel: writability and statistics."""

    def __init__(self) -> None:
        self.writable = True
        self.send_blocked = False

    def statistics(self) -> ChannelStatistics:
        return ChannelStatistics(self.writable, 0, 0, 0, 0, False)


@dataclass(frozen=True)
class Append:
    entries: list[Entry]


@dataclass(frozen=True)
class Block:
    """Holds the receiving actor busy until ``release`` is set (then sets ``entered`` first)."""

    entered: Any
    release: Any


class Noop:
    pass


class FakeTopicMixin:
    """Serves the dispatcher's reads from ``self.entries``."""

    def __init__(self) -> None:
        super().__init__()
        self.entries: list[Entry] = []
        self.waiting: ReadEntries | None = None
        self.reads: list[Any] = []
        self.overlapping_reads = 0  # a read arriving while another still waits: must stay 0
        self.failing_reads = 0  # answer this many reads with an error (a failing disk)

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, ReadEntries | ReadIds) and self.waiting is not None:
            self.overlapping_reads += 1
        if isinstance(message, ReadEntries) and self.failing_reads:
            self.reads.append(message)
            self.failing_reads -= 1
            error = OSError("the disk is unreadable")
            message.reply_to.tell(EntriesRead(message.read_id, error, replay=False))
        elif isinstance(message, ReadEntries):
            self.reads.append(message)
            if message.start >= len(self.entries):
                self.waiting = message
            else:
                self._answer(message)
        elif isinstance(message, ReadIds):
            self.reads.append(message)
            found = [self.entries[i] for i in message.entry_ids if i < len(self.entries)]
            message.reply_to.tell(EntriesRead(message.read_id, found, replay=True))
        elif isinstance(message, CancelRead):
            if self.waiting is not None and self.waiting.read_id == message.read_id:
                self.waiting = None
        elif isinstance(message, Append):
            self.entries.extend(message.entries)
            if self.waiting is not None and self.waiting.start < len(self.entries):
                waiting, self.waiting = self.waiting, None
                self._answer(waiting)
        elif isinstance(message, MarkDeleteMoved | SubscriptionClosed | Noop):
            pass
        return None

    def _answer(self, read: ReadEntries) -> None:
        found = self.entries[read.start : read.start + read.max_entries]
        read.reply_to.tell(EntriesRead(read.read_id, found, replay=False))


class FakeEventLoopMixin:
    """Records consumer batches; completes their writes at once when ``auto_complete``."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[SendMessages] = []
        self.auto_complete = True

    def on_receive(self, message: Any) -> Any:
        # A pass's batches come as one message; each consumer here has a connection of its
        # own, so each batch is a write of its own, as the real loop would make it.
        batches = message.batches if isinstance(message, SendMessageBatches) else [message]
        if isinstance(batches[0], SendMessages):
            for batch in batches:
                self.batches.append(batch)
                if self.auto_complete:
                    batch.completion.request()
        elif isinstance(message, Block):
            message.entered.set()
            message.release.wait(10)
        return None


class TestDispatcherMixin:
    """A dispatcher that can be held busy by a :class:`Block` message."""

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, Block):
            message.entered.set()
            message.release.wait(10)
            return None
        if isinstance(message, Noop):
            return None
        return super().on_receive(message)  # type: ignore[misc]


class _ThreadTimer:
    def __init__(self, seconds: float, func: Any) -> None:
        self._timer = threading.Timer(seconds, func)
        self._timer.daemon = True
        self._timer.start()

    @property
    def done(self) -> bool:
        return not self._timer.is_alive()

    def cancel(self) -> None:
        self._timer.cancel()


class _ManualTimer:
    def __init__(self, seconds: float, func: Any) -> None:
        self.seconds = seconds
        self.func = func
        self.done = False

    def fire(self) -> None:
        if not self.done:
            self.done = True
            self.func()

    def cancel(self) -> None:
        self.done = True


@dataclass
class Harness:
    """One subscription's dispatcher with a fake topic and one fake event loop."""

    actor_class: type[pykka.Actor]
    settings: Settings = field(default_factory=lambda: load_settings(env={}))
    sub_type: int = pb.CommandSubscribe.Shared
    rate_limiters: list[Any] = field(default_factory=list)
    manual_timers: bool = False  # timers wait for fire_timers() instead of real time
    options: DispatchOptions = DEFAULT_OPTIONS

    def __post_init__(self) -> None:
        base = self.actor_class
        timer: Any = _ThreadTimer
        if not issubclass(base, pykka.ThreadingActor):
            timer = lambda seconds, func: GreenletTimer(gevent.spawn_later(seconds, func))  # noqa: E731
        if self.manual_timers:
            self.timers: list[_ManualTimer] = []
            timers = self.timers

            def timer(seconds: float, func: Any) -> _ManualTimer:
                timers.append(_ManualTimer(seconds, func))
                return timers[-1]

        class Topic(FakeTopicMixin, base):  # type: ignore[valid-type,misc]
            pass

        class Loop(FakeEventLoopMixin, base):  # type: ignore[valid-type,misc]
            pass

        class TestDispatcher(TestDispatcherMixin, Dispatcher, base):  # type: ignore[valid-type,misc]
            def call_later(self, seconds: float, func: Any) -> Any:
                return timer(seconds, func)

        self.topic = Topic.start()
        self.loop = Loop.start()
        self.dispatcher = TestDispatcher.start(
            topic=self.topic,
            topic_name="persistent://public/default/harness",
            ledger_id=LEDGER,
            name="sub",
            sub_type=self.sub_type,
            durable=True,
            cursor=Cursor(-1),
            read_position=0,
            settings=self.settings,
            rate_limiters=self.rate_limiters,
            options=self.options,
        )
        self.proxy = self.dispatcher.proxy()
        self._ids = 0

    def consumer(
        self,
        name: str,
        permits: int = 0,
        handle: ConnectionHandle | None = None,
        key_shared: KeySharedMeta | None = None,
    ) -> Consumer:
        """A consumer added to the subscription, with ``permits`` from a first FLOW."""
        if handle is None:
            handle = self.connection(name)
        self._ids += 1
        consumer = Consumer(
            consumer_id=self._ids,
            name=name,
            topic="persistent://public/default/harness",
            subscription="sub",
            sub_type=self.sub_type,
            priority=0,
            connection=handle,
            key_shared=key_shared
            or (KeySharedMeta() if self.sub_type == pb.CommandSubscribe.Key_Shared else None),
        )
        self.dispatcher.ask(AddConsumer(consumer))
        handle.consumers = (*handle.consumers, consumer)
        if permits:
            consumer.flow(permits)
        return consumer

    def connection(self, name: str) -> ConnectionHandle:
        """A connection handle with a fake channel, served by the fake event loop."""
        return ConnectionHandle(peer=f"peer-{name}", channel=FakeChannel(), event_loop=self.loop)  # type: ignore[arg-type]

    def remove(self, consumer: Consumer) -> None:
        self.dispatcher.ask(RemoveConsumer(consumer))

    def append(self, count: int, num_messages: int = 1) -> None:
        start = len(self.topic.proxy().entries.get())
        self.topic.tell(Append([make_entry(start + i, num_messages) for i in range(count)]))

    def append_keyed(self, keys: list[str]) -> None:
        start = len(self.topic.proxy().entries.get())
        self.topic.tell(Append([make_keyed_entry(start + i, key) for i, key in enumerate(keys)]))

    def settle(self, rounds: int = 20) -> None:
        """Let messages bounce between the actors until a round changes nothing."""
        last = None
        for _ in range(rounds):
            self.topic.ask(Noop())
            self.loop.ask(Noop())
            self.dispatcher.ask(Noop())
            state = (
                self.proxy.reads_issued.get(),
                len(self.loop.proxy().batches.get()),
                self.proxy.pending_read.get(),
            )
            if state == last:
                return
            last = state

    @property
    def total(self) -> int:
        value: int = self.proxy.total_permits.get().value
        return value

    def sent_to(self, consumer: Consumer) -> list[int]:
        return [
            entry.entry_id
            for batch in self.loop.proxy().batches.get()
            if batch.consumer is consumer
            for entry in batch.entries
        ]

    def fire_timers(self) -> int:
        """Fire every pending manual timer; returns how many fired."""
        pending = [t for t in self.timers if not t.done]
        for t in pending:
            t.fire()
        return len(pending)

    def stop(self) -> None:
        for ref in (self.dispatcher, self.topic, self.loop):
            ref.stop(block=True, timeout=5)


def failover_active(topic: str, names: list[str]) -> str:
    """Which of ``names`` (one priority level) Failover makes active on the plain topic
    ``topic``: its hash ring's pick, so a test need not depend on the topic's name."""
    ranked = sorted(names)
    return ranked[ring_pick(ranked, Placement.of(topic, -1).topic_hash)]
