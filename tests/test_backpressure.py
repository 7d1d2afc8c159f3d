"""Backpressure: unwritable consumers are skipped, the writable event resumes dispatch.

The actor-level tests drive a dispatcher with fake neighbours (``tests/dispatch_harness.py``)
and brokerlet's real event-loop actor for writable notifications; the socket tests at the end
use a real broker and a consumer whose socket is not read, with small kernel buffers.
"""

from __future__ import annotations

import json
import random
import urllib.request
from collections.abc import Iterator
from typing import Any

import gevent
import gevent.event
import pytest

from brokerlet import Broker
from brokerlet.actors._conflate import ConflatedTell
from brokerlet.actors._runtime import GeventActor
from brokerlet.actors.eventloop import EventLoopActor
from brokerlet.actors.messages import WritabilityChanged
from brokerlet.config import load_settings
from brokerlet.dispatch.consumer import ConnectionHandle
from brokerlet.dispatch.options import DispatchOptions
from brokerlet.dispatch.ratelimit import DispatchRateLimiter
from brokerlet.testing.rawclient import RawClient
from brokerlet.testing.waiting import wait_until
from brokerlet.transport.protocol import pb
from tests.dispatch_harness import Block, FakeChannel, Harness, Noop
from tests.tlscerts import tls_listener_address


class RecordingLoop(EventLoopActor):
    """The real event loop, which a test can hold busy or use as a FIFO barrier."""

    def on_receive(self, message: Any) -> None:
        if isinstance(message, Block):
            message.entered.set()
            message.release.wait(10)
        elif isinstance(message, Noop):
            self.noops = getattr(self, "noops", 0) + 1
        else:
            super().on_receive(message)


@pytest.fixture
def harness() -> Iterator[Harness]:
    h = Harness(GeventActor)
    yield h
    h.stop()


@pytest.fixture
def loop() -> Iterator[Any]:
    ref = RecordingLoop.start(0)
    yield ref
    ref.stop()


def watched_connection(h: Harness, loop: Any, name: str) -> ConnectionHandle:
    """A connection whose writable notifications go to the real event loop ``loop``."""
    handle = h.connection(name)
    handle.writable_notice = ConflatedTell(loop, WritabilityChanged(handle))
    return handle


def channel_of(handle: ConnectionHandle) -> FakeChannel:
    channel = handle.channel
    assert isinstance(channel, FakeChannel)
    return channel


@pytest.mark.parametrize("held_by", ["unwritable", "parked send"])
def test_a_held_back_consumer_gets_nothing_and_only_its_notice_resumes_it(
    harness: Harness, loop: Any, held_by: str
) -> None:
    # Unwritable: over the high watermark, resumed by the writable event. A parked send: the
    # kernel's buffer is full while the channel stays under its high watermark (writable, not
    # accepting); with no write of its own in flight only the send's return can wake it.
    handle = watched_connection(harness, loop, "held")
    channel = channel_of(handle)
    if held_by == "unwritable":
        channel.writable = False
    else:
        channel.send_blocked = True
    consumer = harness.consumer("held", 100, handle)
    harness.append(32)
    harness.settle()
    assert harness.sent_to(consumer) == []
    assert harness.proxy.pending_read.get() is None, "the read loop must stop, not wait"
    reads = harness.proxy.reads_issued.get()
    harness.settle()
    assert harness.proxy.reads_issued.get() == reads, "no polling while held back"

    # No FLOW, publish or ack: only the notice.
    if held_by == "unwritable":
        channel.writable = True
        handle.channel_writability_changed(True)
    else:
        channel.send_blocked = False
        handle.channel_send_unblocked()
    loop.ask(Noop())
    harness.settle()
    assert harness.sent_to(consumer) == list(range(32))


def test_unwritable_consumers_are_skipped_and_the_others_get_everything(
    harness: Harness, loop: Any
) -> None:
    slow_handle = watched_connection(harness, loop, "slow")
    slow = harness.consumer("slow", 100, slow_handle)
    fast = harness.consumer("fast", 100)
    channel_of(slow_handle).writable = False
    harness.append(50)
    harness.settle()
    assert harness.sent_to(slow) == []
    assert harness.sent_to(fast) == list(range(50))


def test_nested_writable_notifications_coalesce_into_one_task(harness: Harness, loop: Any) -> None:
    handle = watched_connection(harness, loop, "flappy")
    # No permits, so no read waits for new entries (that would hold the read gate: then no
    # notification would wake the dispatcher at all, see the next test).
    consumer = harness.consumer("flappy", 0, handle)
    harness.settle()
    entered, release = gevent.event.Event(), gevent.event.Event()
    loop.tell(Block(entered, release))
    assert entered.wait(5)
    try:
        for _ in range(100):  # notifications raised while handling notifications
            handle.channel_writability_changed(False)
            handle.channel_writability_changed(True)
        assert handle.writable_notice is not None
        assert handle.writable_notice.requested
        passes = harness.proxy.read_passes.get()
    finally:
        release.set()
    loop.ask(Noop())
    harness.settle()
    # One task ran for the 100 notifications: one conflated read request, one pass.
    assert handle.writable_notice.requested is False
    assert harness.proxy.read_passes.get() == passes + 1
    assert consumer.read_gate is not None


def test_a_read_waiting_for_new_entries_is_not_woken_for_nothing(
    harness: Harness, loop: Any
) -> None:
    # Shared: while its read waits at the end of the topic a pass could only find the read
    # pending, so the dispatcher holds its read gate and FLOWs, writable events and
    # send-blocked notices cost it nothing. The entries that come next go out with every
    # permit granted meanwhile: nothing that was dropped is lost.
    handle = watched_connection(harness, loop, "idle")
    consumer = harness.consumer("idle", 5, handle)
    harness.settle()
    assert harness.proxy.pending_read.get() == "normal"
    passes = harness.proxy.read_passes.get()
    for _ in range(20):
        consumer.flow(5)
        handle.channel_writability_changed(True)
        handle.channel_send_blocked()
    loop.ask(Noop())
    harness.settle()
    assert harness.proxy.read_passes.get() == passes
    harness.append(105)
    harness.settle()
    assert harness.sent_to(consumer) == list(range(105))
    assert harness.proxy.pending_read.get() is None  # the permits are spent: no read waits


def test_key_shared_is_woken_while_its_read_waits_because_it_looks_ahead(loop: Any) -> None:
    # A Key_Shared pass may find a held-back entry whose consumer can take it now
    # (KeySharedStrategy.replay_ready), so its read gate is never held.
    harness = Harness(GeventActor, sub_type=pb.CommandSubscribe.Key_Shared)
    try:
        handle = watched_connection(harness, loop, "ks")
        consumer = harness.consumer("ks", 5, handle)
        harness.settle()
        assert harness.proxy.pending_read.get() == "normal"
        passes = harness.proxy.read_passes.get()
        consumer.flow(5)
        harness.settle()
        assert harness.proxy.read_passes.get() == passes + 1
    finally:
        harness.stop()


def test_writability_is_checked_again_when_the_notification_task_runs(
    harness: Harness, loop: Any
) -> None:
    handle = watched_connection(harness, loop, "flip")
    channel_of(handle).writable = False
    consumer = harness.consumer("flip", 10, handle)
    harness.append(5)
    harness.settle()
    reads = harness.proxy.reads_issued.get()
    entered, release = gevent.event.Event(), gevent.event.Event()
    loop.tell(Block(entered, release))
    assert entered.wait(5)
    handle.channel_writability_changed(True)
    channel_of(handle).writable = False  # flipped back before the task ran
    release.set()
    loop.ask(Noop())
    harness.settle()
    assert harness.proxy.reads_issued.get() == reads
    assert harness.sent_to(consumer) == []


def test_the_writable_notification_does_not_wait_for_a_busy_dispatcher(
    harness: Harness, loop: Any
) -> None:
    handle = watched_connection(harness, loop, "c")
    channel_of(handle).writable = False
    consumer = harness.consumer("c", 10, handle)
    harness.append(3)
    harness.settle()
    entered, release = gevent.event.Event(), gevent.event.Event()
    harness.dispatcher.tell(Block(entered, release))
    assert entered.wait(5)
    try:
        channel_of(handle).writable = True
        handle.channel_writability_changed(True)
        # The event loop handles the notification while the dispatcher is still busy.
        loop.ask(Noop(), timeout=2)
        assert consumer.read_gate is not None
        assert consumer.read_gate.requested
        assert harness.sent_to(consumer) == []
    finally:
        release.set()
    harness.settle()
    assert harness.sent_to(consumer) == [0, 1, 2]


def test_an_exhausted_quota_dispatches_nothing_on_a_writable_event_until_tokens_return(
    loop: Any,
) -> None:
    now = [0.0]
    limiter = DispatchRateLimiter("topic", 5, 0, clock=lambda: now[0])
    h = Harness(GeventActor, rate_limiters=[limiter], manual_timers=True)
    try:
        handle = watched_connection(h, loop, "c")
        consumer = h.consumer("c", 100, handle)
        h.append(12)
        h.settle()
        assert h.sent_to(consumer) == list(range(5))
        handle.channel_writability_changed(True)
        loop.ask(Noop())
        h.settle()
        assert h.fire_timers() == 1  # the rescheduled read, and only one
        h.settle()
        assert h.sent_to(consumer) == list(range(5))
        now[0] += 1.0
        h.fire_timers()
        h.settle()
        assert h.sent_to(consumer) == list(range(10))
        now[0] += 1.0
        h.fire_timers()
        h.settle()
        assert h.sent_to(consumer) == list(range(12))
    finally:
        h.stop()


@pytest.mark.parametrize("backoff", [(1, 1), (1, 10)], ids=["fixed", "exponential"])
def test_retry_timers_never_start_a_second_pending_read(backoff: tuple[int, int]) -> None:
    initial, maximum = backoff
    settings = load_settings(
        env={},
        overrides={
            "dispatcher_retry_backoff_initial_time_ms": initial,
            "dispatcher_retry_backoff_max_time_ms": maximum,
            "dispatcher_max_read_batch_size": 4,
            "max_unacked_messages_per_consumer": 0,
        },
    )
    # Manual timers: the retry timers fire where the random walk says, and the quiet state
    # at the end can fire every one still pending instead of sleeping on them.
    h = Harness(GeventActor, settings=settings, manual_timers=True)
    rng = random.Random(7)
    try:
        consumers = [h.consumer(f"c{i}", 3) for i in range(3)]
        total = 0
        for _ in range(800):
            consumer = rng.choice(consumers)
            action = rng.randrange(5)
            if action == 0:
                consumer.flow(rng.randint(1, 5))
            elif action == 1:
                channel_of(consumer.connection).writable = rng.random() < 0.7
                consumer.read_gate.request()  # type: ignore[union-attr]
            elif action == 2:
                (consumer.block if rng.random() < 0.5 else consumer.unblock)()
            elif action == 3:
                count = rng.randint(1, 4)
                h.append(count)
                total += count
            else:
                h.fire_timers()
            if rng.random() < 0.5:
                h.dispatcher.ask(Noop())  # let the dispatcher take what is queued so far
        for consumer in consumers:
            channel_of(consumer.connection).writable = True
            consumer.unblock()
            consumer.flow(total)
        for _ in range(100):  # fire every retry timer still pending into the quiet state
            h.settle()
            if h.fire_timers() == 0:
                break
        else:
            raise AssertionError("retry timers kept rearming with nothing to read")
        h.settle()
        assert len(h.timers) >= 5, "the walk hardly armed a retry timer: nothing was tested"
        assert h.topic.proxy().overlapping_reads.get() == 0
        delivered = sorted(e for c in consumers for e in h.sent_to(c))
        assert delivered == list(range(total)), "every entry exactly once"
    finally:
        h.stop()


# Real sockets: a consumer that stops reading, with small kernel buffers.

MESSAGES = 2048
SIZE = 8 * 1024
PERMITS = 8192
READ_BATCH = 100


def consumer_stats(broker: Broker, topic: str, subscription: str) -> dict[str, Any]:
    stats = broker.topic_stats(topic)
    assert stats is not None
    (consumer,) = stats["subscriptions"][subscription]["consumers"]
    result: dict[str, Any] = consumer
    return result


def settled_consumer_stats(
    broker: Broker, topic: str, subscription: str, timeout: float = 10.0
) -> dict[str, Any]:
    """The consumer's stats once its subscription's dispatch has stopped moving.

    Settled means two snapshots a poll apart show the same messages out and the same read
    passes: the dispatcher has neither sent nor tried anything in between.
    """
    previous: list[tuple[int, int] | None] = [None]

    def unchanged_since_last_poll() -> dict[str, Any] | None:
        stats = broker.topic_stats(topic)
        assert stats is not None
        sub = stats["subscriptions"][subscription]
        (consumer,) = sub["consumers"]
        snapshot = (consumer["msgOutCounter"], sub["readPasses"])
        settled = snapshot == previous[0]
        previous[0] = snapshot
        return consumer if settled else None

    result: dict[str, Any] = wait_until(
        unchanged_since_last_poll,
        message=lambda: f"dispatch to {subscription} to settle (last snapshot {previous[0]})",
        timeout=timeout,
        interval=0.05,
    )
    return result


def assert_http_stats_show_the_paused_consumer(broker: Broker) -> None:
    """What an operator sees: the same consumer over HTTP, and in Prometheus metrics."""
    base = broker.web_service_url
    assert base is not None
    url = f"{base}/admin/v2/persistent/public/default/paused-socket/stats"
    with urllib.request.urlopen(url, timeout=5) as response:
        stats = json.load(response)
    (consumer,) = stats["subscriptions"]["s"]["consumers"]
    assert consumer["writable"] is False
    assert consumer["pendingOutboundBytes"] > 0
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as response:
        metrics = response.read().decode()
    writable = [
        line
        for line in metrics.splitlines()
        if line.startswith("brokerlet_consumer_writable{") and "paused-socket" in line
    ]
    assert len(writable) == 1
    assert writable[0].rstrip().endswith(" 0.0"), writable


@pytest.mark.parametrize("transport", ["plain", "tls"])
@pytest.mark.parametrize("gated", [True, False], ids=["gated", "ungated"])
def test_a_paused_consumer_socket_stops_dispatch_and_resuming_delivers_everything(
    gated: bool, transport: str, pki: Any
) -> None:
    """Pulsar's diagnostic as a test. Ungated (and reading again after every dispatch, as
    Pulsar does), the broker feeds the paused socket until the permits run out; that variant
    proves the assertions can fail. The consumer grants its permits once everything is
    stored, so the first read is a full batch, more than the socket buffers hold: the flip to
    unwritable is certain, whatever the timing. Over TLS the channel takes its joined-buffer
    path (no sendmsg on SSL sockets) with the same watermarks."""
    topic = "persistent://public/default/paused-socket"
    options = (
        DispatchOptions()
        if gated
        else DispatchOptions(writability_gating=False, read_after_dispatch=True)
    )
    tls = pki.tls_listener() if transport == "tls" else {}
    with Broker(port=0, so_sndbuf=16384, dispatch_options=options, **tls) as broker:
        address = broker.address
        context = None
        if transport == "tls":
            address = tls_listener_address(broker)
            context = pki.client_context()
        with (
            RawClient(address, timeout=10, tls=context) as producer,
            RawClient(address, timeout=10, rcvbuf=16384, tls=context) as consumer,
        ):
            run_paused_consumer(broker, producer, consumer, topic, gated)


def run_paused_consumer(
    broker: Broker, producer: RawClient, consumer: RawClient, topic: str, gated: bool
) -> None:
    producer.handshake()
    producer.create_producer(topic, 1)
    consumer.handshake()
    consumer.subscribe(topic, "s", 1, sub_type=pb.CommandSubscribe.Shared)
    payload = b"p" * SIZE
    for sequence_id in range(MESSAGES):
        producer.send_raw(producer.send_frame(1, sequence_id, payload))
    for _ in range(MESSAGES):
        producer.expect(pb.BaseCommand.SEND_RECEIPT)
    consumer.flow(1, PERMITS)  # then never read until resumed

    wait_until(
        lambda: consumer_stats(broker, topic, "s"),
        predicate=lambda consumer: not consumer["writable"],
        message="the consumer's socket to stop being writable",
        interval=0.005,
    )
    at_flip = consumer_stats(broker, topic, "s")
    # The broker gets every chance to keep feeding: wait until dispatch to it settles.
    held = settled_consumer_stats(broker, topic, "s")
    consumed = PERMITS - held["availablePermits"]
    assert not held["writable"]
    assert held["writabilityChanges"] >= 1
    assert_http_stats_show_the_paused_consumer(broker)
    high = broker.settings.high_watermark
    bounded = (
        consumed <= at_flip["msgOutCounter"] + READ_BATCH
        and consumed < MESSAGES
        and held["pendingOutboundBytes"] <= high + READ_BATCH * (SIZE + 200)
    )
    assert bounded is gated, (consumed, held["pendingOutboundBytes"])

    # Resume reading: only the writable event can deliver the rest.
    received = consumer.receive(1, MESSAGES, timeout=20)
    assert [m.sequence_id for m in received] == list(range(MESSAGES))
    assert all(m.payload == payload for m in received)


@pytest.mark.parametrize(
    "sub_type",
    [
        pb.CommandSubscribe.Shared,
        pb.CommandSubscribe.Key_Shared,
        pb.CommandSubscribe.Failover,
        pb.CommandSubscribe.Exclusive,
    ],
    ids=["Shared", "Key_Shared", "Failover", "Exclusive"],
)
def test_a_subscription_turned_away_by_another_ones_parked_send_gets_its_messages(
    sub_type: int,
) -> None:
    """Two subscriptions on one connection, as the official client puts a partitioned
    topic's consumers; each strategy meets the held-back consumer in its own way. The first
    one's messages fill the kernel's buffers and park the channel's writer in its send,
    under the high watermark (no writability flip). The second then gets permits for stored
    messages, finds its consumer not accepting writes and stops, with no write of its own in
    flight. Once the client reads again, the send's return is the one thing that can wake
    it: no FLOW, publish or ack follows. Found as a stalled 4-partition run in `make
    bench`'s partitions section."""
    first, second = "persistent://public/default/parked-1", "persistent://public/default/parked-2"
    count, payload = 32, b"p" * SIZE  # 256 KiB for the first: more than the kernel holds
    with (
        Broker(port=0, so_sndbuf=16384, high_watermark=1 << 22, low_watermark=1 << 21) as broker,
        RawClient(broker.address, timeout=10) as producer,
        RawClient(broker.address, timeout=10, rcvbuf=16384) as consumer,
    ):
        producer.handshake()
        consumer.handshake()
        for producer_id, topic in enumerate((first, second), start=1):
            producer.create_producer(topic, producer_id)
            consumer.subscribe(topic, "s", producer_id, sub_type=sub_type)
        for producer_id in (1, 2):
            for sequence_id in range(count):
                producer.send_raw(producer.send_frame(producer_id, sequence_id, payload))
        for _ in range(2 * count):
            producer.expect(pb.BaseCommand.SEND_RECEIPT)

        consumer.flow(1, count)  # then not read until both are checked
        wait_until(
            lambda: consumer_stats(broker, first, "s"),
            predicate=lambda stats: stats["sendBlocked"] and stats["writable"],
            message="the first consumer's writes to park the writer, under the high watermark",
            interval=0.005,
        )

        def read_passes() -> int:
            stats = broker.topic_stats(second)
            assert stats is not None
            passes: int = stats["subscriptions"]["s"]["readPasses"]
            return passes

        before = read_passes()
        consumer.flow(2, count)
        wait_until(
            read_passes,
            predicate=lambda passes: passes > before,
            message="the second subscription's read pass after its FLOW",
            interval=0.005,
        )
        turned_away = settled_consumer_stats(broker, second, "s")
        assert turned_away["msgOutCounter"] == 0
        assert turned_away["availablePermits"] == count
        assert turned_away["sendBlocked"], "the writer must still be parked: nothing was tested"

        received: dict[int, int] = {1: 0, 2: 0}
        while sum(received.values()) < 2 * count:
            frame = consumer.expect_frame(pb.BaseCommand.MESSAGE, timeout=10)
            received[frame.command.message.consumer_id] += 1
        assert received == {1: count, 2: count}


def test_failed_reads_back_off_exponentially_then_the_read_size_grows_back() -> None:
    h = Harness(GeventActor, manual_timers=True)
    try:
        h.topic.proxy().failing_reads = 3
        consumer = h.consumer("c", 1000)
        h.append(300)
        h.settle()
        delays = []
        for _ in range(3):
            pending = [t for t in h.timers if not t.done]
            assert len(pending) == 1, "one retry timer, never a second pending read"
            delays.append(pending[0].seconds)
            h.fire_timers()
            h.settle()
        assert delays == [15.0, 30.0, 60.0]  # initial, doubled, capped at the maximum
        reads = [r.max_entries for r in h.topic.proxy().reads.get()]
        assert reads[:4] == [100, 1, 1, 1], "after a failure, one entry at a time"
        assert reads[4:8] == [2, 4, 8, 16], "then doubling back towards the maximum"
        assert h.topic.proxy().overlapping_reads.get() == 0
        assert h.sent_to(consumer) == list(range(300))
    finally:
        h.stop()
