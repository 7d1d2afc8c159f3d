"""Seeded schedules that look for lost wake-ups: a dispatcher that stops with messages and
permits at hand and nothing left that will make it read again.

Each schedule puts several subscriptions (every type, some with several consumers) on two
consumer connections with small socket buffers and watermarks, the way the official client
puts a partitioned topic's consumers on one connection. A producer publishes keyed
messages in bursts on its own thread while each consumer connection reads in fits and
starts, pausing for random spells, grants permits as the official client does (half its
queue once half is received), acks what it got, and in some schedules asks for some messages
again, closes and reopens consumers, publishes some messages with a delivery delay, or runs
under a dispatch rate or an unacked-message limit, with Failover's hold after a change of
its active consumer at 0, 50 or 1,000 ms. Some schedules also seek subscriptions back, unload
topics (the producer and consumers are closed by the broker and come back, the producer
sending again what had no receipt) or unsubscribe a subscription and make it again at the
earliest message. Every subscription must get every message acknowledged, counted by
sequence id, and the broker must then report no backlog. A stall is reported when a
subscription gets nothing for `STALL_SECONDS` although the client reads everything and
grants permits: a dispatcher nobody will wake (the twenty-sixth pass's parked send was one:
see test_backpressure.py).
``WAKEUP_FUZZ_SEEDS=1-200`` runs more schedules.
"""

from __future__ import annotations

import itertools
import os
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from brokerlet import Broker
from brokerlet.testing.rawclient import ConnectionClosed, RawClient
from brokerlet.transport.protocol import (
    build_entry,
    decode_payload,
    encode_send,
    parse_metadata,
    pb,
)

T = pb.BaseCommand
SUB = pb.CommandSubscribe
TYPES = {"Shared": SUB.Shared, "Key_Shared": SUB.Key_Shared, "Failover": SUB.Failover}
NACKABLE = (SUB.Shared, SUB.Key_Shared)  # the client names messages to redeliver only there
STALL_SECONDS = 3.0
CHURN_INTERVAL = 0.25  # mean seconds between consumer closes, when a schedule churns
OPS_INTERVAL = 0.3  # mean seconds between seeks (and between unloads, unsubscribes) while due
EARLIEST = 2**64 - 1  # MessageId.earliest's ledger and entry ids: -1 as the uint64 on the wire
DEADLINE_SECONDS = 40.0
BACKLOG_CHECK_INTERVAL = 0.05  # seconds between asking the broker for a finished topic's backlog


def _seeds() -> list[int]:
    spec = os.environ.get("WAKEUP_FUZZ_SEEDS", "1-6")
    first, _, last = spec.partition("-")
    return list(range(int(first), int(last or first) + 1))


@dataclass
class Consumer:
    """One consumer of the schedule, as the client sees it."""

    consumer_id: int
    topic: str
    subscription: str
    queue: int
    connection: int
    sub_type: int
    name: str
    state: str = "live"  # or closing, waiting (to subscribe again), subscribing, or parked:
    # closed until its subscription is unsubscribed
    since_flow: int = 0
    to_ack: list[tuple[int, int, int]] = field(default_factory=list)  # ledger, entry, sequence


@dataclass
class Subscription:
    """One subscription, as the client sees it.

    A message counts by its sequence id, not where it is stored: a message sent again after
    the broker closed its producer may be stored twice."""

    topic: str
    name: str
    consumers: list[Consumer] = field(default_factory=list)
    acked: set[int] = field(default_factory=set)  # sequence ids
    acked_entries: set[int] = field(default_factory=set)  # where they were stored
    backlog: int | None = None  # the broker's msgBacklog, last asked; None: not asked yet
    seen: dict[int, tuple[int, int]] = field(default_factory=dict)  # seek targets:
    # entry id -> ledger id, publish time
    last_progress: float = 0.0
    keeper: Consumer | None = None  # unsubscribes once the others are parked


@dataclass
class Schedule:
    """What a seed decides before anything runs."""

    seed: int
    sndbuf: int
    high_watermark: int
    topics: list[str]
    messages: int
    payload_sizes: tuple[int, int]
    subscriptions: list[tuple[str, str, str, int]]  # topic, name, type, consumers
    pause_chance: float
    longest_pause: float
    churn: bool
    delayed: float  # share of messages delivered after a delay (Shared and Key_Shared)
    nacks: float  # share of messages a Shared or Key_Shared consumer asks for again
    read_batch: int
    storage: dict[str, Any]  # Broker settings: memory, or disk with or without a cache
    limits: dict[str, Any]  # Broker settings: a dispatch rate or an unacked-message limit
    failover_hold_ms: int  # active_consumer_failover_delay_time_millis
    seeks: int  # how many times a consumer seeks its subscription back
    unloads: int  # how many times a topic is unloaded (the admin API's unload)
    unsubscribes: int  # how many times a subscription is deleted and made again

    @classmethod
    def draw(cls, seed: int) -> Schedule:
        rng = random.Random(seed)
        topics = [f"persistent://public/default/wake-{seed}-{i}" for i in range(rng.randint(1, 3))]
        subscriptions = []
        for topic in topics:
            for index in range(rng.randint(1, 3)):
                kind = rng.choice([*TYPES, "Exclusive"])
                consumers = 1 if kind == "Exclusive" else rng.randint(1, 3)
                subscriptions.append((topic, f"s{index}", kind, consumers))
        return cls(
            seed=seed,
            sndbuf=rng.choice([4096, 16384, 65536]),
            high_watermark=rng.choice([8192, 32768, 131072]),
            topics=topics,
            messages=rng.randint(300, 1500),
            payload_sizes=(rng.choice([10, 200]), rng.choice([400, 3000])),
            subscriptions=subscriptions,
            pause_chance=rng.choice([0.02, 0.1, 0.3]),
            longest_pause=rng.choice([0.01, 0.05, 0.2]),
            churn=rng.random() < 0.5,
            delayed=rng.choice([0.0, 0.0, 0.1]),
            nacks=rng.choice([0.0, 0.0, 0.05]),
            storage=rng.choice(
                [
                    {"storage": "memory"},
                    {"storage": "disk", "cache_bytes": 16 << 20},
                    {"storage": "disk", "cache_bytes": 0},  # every read from the segment files
                ]
            ),
            read_batch=rng.choice([1, 10, 100, 500]),
            limits=rng.choice(
                [
                    {},
                    {},
                    {"dispatch_throttling_rate_per_subscription_in_msg": 3000},
                    {"dispatch_throttling_rate_per_topic_in_byte": 4 << 20},
                    {"dispatch_throttling_rate_in_msg": 8000},
                    {"max_unacked_messages_per_consumer": 20},
                    {"max_unacked_messages_per_subscription": 40},
                ]
            ),
            failover_hold_ms=rng.choice([0, 50, 1000]),
            seeks=rng.choice([0, 0, 2, 4]),
            unloads=rng.choice([0, 0, 1, 3]),
            unsubscribes=rng.choice([0, 0, 1, 2]),
        )


class Publisher:
    """The producer side, on a thread of its own: publishes every topic's messages in bursts.

    When the broker closes a producer (CLOSE_PRODUCER) or the connection (a SEND for a
    producer it had closed), it creates the producer again and sends again whatever had no
    receipt, as the official client does.
    """

    def __init__(self, address: tuple[str, int], schedule: Schedule) -> None:
        self.address = address
        self.schedule = schedule
        self.rng = random.Random(schedule.seed * 7919)
        self.topics = dict(enumerate(schedule.topics, start=1))  # producer id -> topic
        self.sent = dict.fromkeys(self.topics, 0)
        self.unreceipted: dict[int, dict[int, bytes]] = {p: {} for p in self.topics}
        self.ready: set[int] = set()
        self.creating: dict[int, int] = {}  # request id -> producer id
        self.request_ids = itertools.count()
        self.client: RawClient | None = None
        self.reconnects = 0
        self.errors: list[BaseException] = []

    def run(self) -> None:
        try:
            self._publish(time.monotonic() + DEADLINE_SECONDS)
        except BaseException as error:  # reported by the test, not lost on this thread
            self.errors.append(error)
        finally:
            if self.client is not None:
                self.client.close()

    def __repr__(self) -> str:
        unreceipted = {p: len(frames) for p, frames in self.unreceipted.items()}
        return (
            f"Publisher(sent={self.sent}, unreceipted={unreceipted}, ready={self.ready}, "
            f"reconnects={self.reconnects})"
        )

    def _publish(self, deadline: float) -> None:
        messages = self.schedule.messages
        while any(n < messages for n in self.sent.values()) or any(self.unreceipted.values()):
            assert time.monotonic() < deadline, f"publisher out of time: {self}"
            try:
                if self.client is None:
                    self._connect()
                writable = [p for p in sorted(self.ready) if self.sent[p] < messages]
                if not writable:
                    self._read(0.05)
                    continue
                self._burst(self.rng.choice(writable))
                if self.rng.random() < 0.3:  # sometimes wait for the receipts: bursts spread out
                    while any(self.unreceipted.values()) and time.monotonic() < deadline:
                        self._read(0.05)
            except (ConnectionClosed, ConnectionError):
                assert self.client is not None
                self.client.close()
                self.client = None

    def _connect(self) -> None:
        self.reconnects += any(self.sent.values())
        self.client = RawClient(self.address, timeout=10)
        self.client.handshake()
        self.ready.clear()
        self.creating.clear()
        for producer_id in self.topics:
            self._create(producer_id)

    def _create(self, producer_id: int) -> None:
        assert self.client is not None
        request_id = next(self.request_ids)
        self.creating[request_id] = producer_id
        self.client.send_command(
            T(
                type=T.PRODUCER,
                producer=pb.CommandProducer(
                    topic=self.topics[producer_id], producer_id=producer_id, request_id=request_id
                ),
            )
        )

    def _burst(self, producer_id: int) -> None:
        assert self.client is not None
        rng, schedule = self.rng, self.schedule
        burst = min(rng.randint(1, 64), schedule.messages - self.sent[producer_id])
        frames = []
        for _ in range(burst):
            sequence_id = self.sent[producer_id]
            metadata = pb.MessageMetadata(
                producer_name=f"wake-{schedule.seed}",
                sequence_id=sequence_id,
                publish_time=int(time.time() * 1000),
                partition_key=f"key-{rng.randrange(50)}",
            )
            if rng.random() < schedule.delayed:
                metadata.deliver_at_time = metadata.publish_time + rng.randint(1, 300)
            entry = build_entry(metadata, b"m" * rng.randint(*schedule.payload_sizes))
            header, body = encode_send(producer_id, sequence_id, 1, entry)
            frames.append(header + body)
            self.unreceipted[producer_id][sequence_id] = header + body
            self.sent[producer_id] += 1
        self.client.send_raw(b"".join(frames))

    def _read(self, timeout: float) -> None:
        assert self.client is not None
        try:
            frame = self.client.recv_frame(timeout)
        except TimeoutError:
            return
        command = frame.command
        if command.type == T.SEND_RECEIPT:
            receipt = command.send_receipt
            self.unreceipted[receipt.producer_id].pop(receipt.sequence_id, None)
        elif command.type == T.CLOSE_PRODUCER:  # an unload: create it again
            producer_id = command.close_producer.producer_id
            self.ready.discard(producer_id)
            if producer_id not in self.creating.values():
                self._create(producer_id)
        elif command.type == T.PRODUCER_SUCCESS:
            producer_id = self.creating.pop(command.producer_success.request_id)
            self.ready.add(producer_id)
            again = self.unreceipted[producer_id]
            if again:  # stored or not, no receipt came: the official client sends them again
                self.client.send_raw(b"".join(again[s] for s in sorted(again)))
        else:
            raise AssertionError(f"publisher got {command}")


def run_schedule(schedule: Schedule, data_dir: Path) -> None:
    rng = random.Random(schedule.seed)
    with Broker(
        port=0,
        so_sndbuf=schedule.sndbuf,
        high_watermark=schedule.high_watermark,
        low_watermark=schedule.high_watermark // 2,
        dispatcher_max_read_batch_size=schedule.read_batch,
        data_dir=str(data_dir),
        **schedule.storage,
        **schedule.limits,
        active_consumer_failover_delay_time_millis=schedule.failover_hold_ms,
        # A subscription made again at the earliest message owes every one: keep them all.
        **(
            {"default_retention_time_in_minutes": -1, "default_retention_size_in_mb": -1}
            if schedule.unsubscribes
            else {}
        ),
    ) as broker:
        connections = [
            RawClient(broker.address, timeout=10, rcvbuf=rng.choice([4096, 16384])) for _ in (0, 1)
        ]
        try:
            subscriptions = [Subscription(t, s) for t, s, _, _ in schedule.subscriptions]
            consumer_id = itertools.count(1)
            for connection in connections:
                connection.handshake()
            for subscription, (topic, name, kind, count) in zip(
                subscriptions, schedule.subscriptions, strict=True
            ):
                for index in range(count):
                    consumer = Consumer(
                        next(consumer_id),
                        topic,
                        name,
                        0,
                        rng.randrange(2),
                        TYPES.get(kind, SUB.Exclusive),
                        f"{name}-{index}",
                    )
                    connections[consumer.connection].subscribe(
                        topic,
                        name,
                        consumer.consumer_id,
                        sub_type=consumer.sub_type,
                        consumer_name=consumer.name,
                    )
                    consumer.queue = rng.choice([1, 5, 20, 100, 1000])
                    subscription.consumers.append(consumer)
            for subscription in subscriptions:
                for consumer in subscription.consumers:
                    connections[consumer.connection].flow(consumer.consumer_id, consumer.queue)

            publisher = Publisher(broker.address, schedule)
            thread = threading.Thread(target=publisher.run, daemon=True)
            thread.start()
            Client(schedule, rng, connections, subscriptions, broker, publisher, thread).run()
            thread.join(timeout=10)
            assert not publisher.errors, publisher.errors
        finally:
            for connection in connections:
                connection.close()


class Client:
    """The consumer side: every subscription's consumers, on two connections."""

    def __init__(
        self,
        schedule: Schedule,
        rng: random.Random,
        connections: list[RawClient],
        subscriptions: list[Subscription],
        broker: Broker,
        publisher: Publisher,
        publishing: threading.Thread,
    ) -> None:
        self.schedule = schedule
        self.rng = rng
        self.connections = connections
        self.subscriptions = {(s.topic, s.name): s for s in subscriptions}
        self.consumers = {c.consumer_id: c for s in subscriptions for c in s.consumers}
        self.broker = broker
        self.publisher = publisher
        self.publishing = publishing
        self.requests: dict[int, tuple[str, Consumer]] = {}  # request id -> what, for whom
        self.resubscribe: list[tuple[float, Consumer]] = []
        self.request_ids = itertools.count(1_000_000)
        self.backlogs_asked = dict.fromkeys(schedule.topics, 0.0)
        self.seeks = schedule.seeks  # still to do
        self.unloads = schedule.unloads
        self.unsubscribes = schedule.unsubscribes

    def run(self) -> None:
        paused_until = [0.0, 0.0]
        deadline = time.monotonic() + DEADLINE_SECONDS
        previous = time.monotonic()
        for subscription in self.subscriptions.values():
            subscription.last_progress = previous
        while not self._done():
            now = time.monotonic()
            elapsed, previous = now - previous, now
            assert now < deadline, "out of time; " + self.state()
            if self.schedule.churn and self.rng.random() < elapsed / CHURN_INTERVAL:
                self._churn()
            if self.seeks and self.rng.random() < elapsed / OPS_INTERVAL:
                self._seek()
            if self.unloads and self.rng.random() < elapsed / OPS_INTERVAL:
                self._unload()
            if self.unsubscribes and self.rng.random() < elapsed / OPS_INTERVAL:
                self._unsubscribe()
            for when, consumer in list(self.resubscribe):
                if when <= now:
                    self.resubscribe.remove((when, consumer))
                    self._subscribe(consumer)
            for index, connection in enumerate(self.connections):
                if now < paused_until[index]:
                    continue
                if self.rng.random() < self.schedule.pause_chance:
                    paused_until[index] = now + self.rng.uniform(0.001, self.schedule.longest_pause)
                    continue
                self._read(index, connection)
            now = time.monotonic()
            for subscription in self._owed():
                if any(c.state != "live" for c in subscription.consumers):
                    subscription.last_progress = now  # churning
                elif now - subscription.last_progress > STALL_SECONDS:
                    raise AssertionError(
                        f"nothing for {subscription.topic} {subscription.name} in "
                        f"{STALL_SECONDS} s while reading; " + self.state()
                    )

    def _done(self) -> bool:
        """Every message acked, by the client's count and then by the broker's, asked again
        once nothing can change it: the publisher done (it may have stored a message twice)
        and no request in flight (a seek moves the broker's cursor back)."""
        if self.publishing.is_alive() or self.requests or self._owed():
            return False
        for subscription in self.subscriptions.values():
            subscription.backlog = None
        self.backlogs_asked = dict.fromkeys(self.backlogs_asked, 0.0)
        return not self._owed()

    def _owed(self) -> list[Subscription]:
        """Subscriptions with a message not yet acked, by the client's count or the broker's:
        the broker's backlog is asked only once the client has acked every message."""
        now = time.monotonic()
        owed = []
        for subscription in self.subscriptions.values():
            if len(subscription.acked) < self.schedule.messages:
                subscription.backlog = None
                owed.append(subscription)
                continue
            topic = subscription.topic
            if (
                subscription.backlog != 0
                and now - self.backlogs_asked[topic] > BACKLOG_CHECK_INTERVAL
            ):
                self.backlogs_asked[topic] = now
                stats = self.broker.topic_stats(topic) or {}
                for name, figures in stats.get("subscriptions", {}).items():
                    if (topic, name) in self.subscriptions:
                        self.subscriptions[topic, name].backlog = figures["msgBacklog"]
            if subscription.backlog != 0:
                owed.append(subscription)
        return owed

    def _live(self) -> list[Consumer]:
        """Live consumers, but for those of a subscription being unsubscribed."""
        return [
            c
            for c in self.consumers.values()
            if c.state == "live" and self.subscriptions[c.topic, c.subscription].keeper is None
        ]

    def _churn(self) -> None:
        live = self._live()
        if live:
            self._close(self.rng.choice(live))

    def _seek(self) -> None:
        """A live consumer seeks its subscription: to a message it received, or the
        earliest, by message id or by publish time. The broker closes all its consumers."""
        live = self._live()
        if not live:
            return
        self.seeks -= 1
        consumer = self.rng.choice(live)
        subscription = self.subscriptions[consumer.topic, consumer.subscription]
        # Only back: a seek acknowledges everything before its target, so the client must
        # have acked all of that itself for its count to stay honest.
        acked_below = next(e for e in itertools.count() if e not in subscription.acked_entries)
        targets = [e for e in subscription.seen if e <= acked_below]
        seek = pb.CommandSeek(
            consumer_id=consumer.consumer_id, request_id=self._request("seek", consumer)
        )
        how = self.rng.randrange(4)
        if how == 0 or not targets:
            seek.message_id.ledger_id = seek.message_id.entry_id = EARLIEST
        elif how == 1:
            seek.message_publish_time = 0
        else:
            entry_id = self.rng.choice(targets)
            ledger_id, publish_time = subscription.seen[entry_id]
            if how == 2:
                seek.message_id.ledger_id, seek.message_id.entry_id = ledger_id, entry_id
            elif not self.schedule.unloads:
                # Publish times rise with entry ids: the first at this time is no later. Not
                # so once the publisher sends again after an unload, with the old times.
                seek.message_publish_time = publish_time
            else:
                seek.message_publish_time = 0
        self.connections[consumer.connection].send_command(T(type=T.SEEK, seek=seek))

    def _unload(self) -> None:
        """Through the admin API: the broker closes the topic's producers and consumers,
        which create and subscribe again."""
        self.unloads -= 1
        topic = self.rng.choice(self.schedule.topics)
        url = f"{self.broker.web_service_url}/admin/v2/{topic.replace('://', '/')}/unload"
        response = requests.put(url, timeout=10)
        assert response.status_code == 204, response.text

    def _unsubscribe(self) -> None:
        """Unsubscribe a subscription whose consumers are all live: close all but one, then
        UNSUBSCRIBE from that one (the broker refuses while others are connected). All then
        subscribe again, at the earliest message: a new subscription that owes every one."""
        ready = [
            s
            for s in self.subscriptions.values()
            if s.keeper is None and all(c.state == "live" for c in s.consumers)
        ]
        if not ready:
            return
        self.unsubscribes -= 1
        subscription = self.rng.choice(ready)
        subscription.keeper = self.rng.choice(subscription.consumers)
        others = [c for c in subscription.consumers if c is not subscription.keeper]
        for consumer in others:
            self._close(consumer, "park")
        if not others:
            self._unsubscribe_when_parked(subscription)

    def _unsubscribe_when_parked(self, subscription: Subscription) -> None:
        keeper = subscription.keeper
        assert keeper is not None
        if any(c.state != "parked" for c in subscription.consumers if c is not keeper):
            return
        if keeper.state != "live":  # the broker closed it meanwhile (an unload): give up
            self._unsubscribe_abandoned(subscription)
            return
        unsubscribe = pb.CommandUnsubscribe(
            consumer_id=keeper.consumer_id, request_id=self._request("unsubscribe", keeper)
        )
        self.connections[keeper.connection].send_command(
            T(type=T.UNSUBSCRIBE, unsubscribe=unsubscribe)
        )

    def _unsubscribe_abandoned(self, subscription: Subscription) -> None:
        subscription.keeper = None
        for consumer in subscription.consumers:
            if consumer.state == "parked":
                self._again_soon(consumer)

    def _unsubscribed(self, subscription: Subscription) -> None:
        assert subscription.keeper is not None
        assert subscription.keeper.state == "live", subscription.keeper
        subscription.keeper = None
        subscription.acked.clear()
        subscription.acked_entries.clear()
        subscription.seen.clear()
        subscription.backlog = None
        for consumer in subscription.consumers:
            self._again_soon(consumer)

    def _close(self, consumer: Consumer, why: str = "close") -> None:
        consumer.state = "closing"
        consumer.to_ack.clear()  # never acked: the broker delivers them again
        request_id = self._request(why, consumer)
        close = pb.CommandCloseConsumer(consumer_id=consumer.consumer_id, request_id=request_id)
        self.connections[consumer.connection].send_command(
            T(type=T.CLOSE_CONSUMER, close_consumer=close)
        )

    def _subscribe(self, consumer: Consumer) -> None:
        consumer.state = "subscribing"
        self.connections[consumer.connection].send_command(
            RawClient.subscribe_command(
                consumer.topic,
                consumer.subscription,
                consumer.consumer_id,
                request_id=self._request("subscribe", consumer),
                sub_type=consumer.sub_type,
                consumer_name=consumer.name,
            )
        )

    def _request(self, what: str, consumer: Consumer) -> int:
        request_id = next(self.request_ids)
        self.requests[request_id] = (what, consumer)
        return request_id

    def _again_soon(self, consumer: Consumer) -> None:
        """Closed: subscribe again after a while, as the official client reconnects."""
        consumer.state = "waiting"
        consumer.to_ack.clear()
        self.resubscribe.append((time.monotonic() + self.rng.uniform(0, 0.05), consumer))

    def _read(self, index: int, connection: RawClient) -> None:
        for _ in range(self.rng.randint(1, 200)):
            try:
                frame = connection.recv_frame(timeout=0.001)
            except TimeoutError:  # idle: the acks held back go now (the client's timer)
                for consumer in self.consumers.values():
                    if consumer.connection == index and consumer.to_ack:
                        self._ack(consumer)
                return
            command = frame.command
            if command.type == T.MESSAGE:
                self._message(connection, frame.command.message, frame.payload)
            elif command.type == T.SUCCESS:
                self._answered(*self.requests.pop(command.success.request_id))
            elif command.type == T.ERROR:
                self._refused(command.error)
            elif command.type == T.CLOSE_CONSUMER:
                consumer = self.consumers[command.close_consumer.consumer_id]
                if consumer.state == "live":  # else closed by the client as well, or before
                    self._again_soon(consumer)
            else:
                assert command.type == T.ACTIVE_CONSUMER_CHANGE, command

    def _answered(self, what: str, consumer: Consumer) -> None:
        if what == "subscribe":  # grant the queue
            consumer.state, consumer.since_flow = "live", 0
            self.connections[consumer.connection].flow(consumer.consumer_id, consumer.queue)
        elif what == "seek":
            pass  # the CLOSE_CONSUMER frames came first and our consumers subscribe again
        elif what == "park":
            consumer.state = "parked"
            self._unsubscribe_when_parked(self.subscriptions[consumer.topic, consumer.subscription])
        elif what == "unsubscribe":
            self._unsubscribed(self.subscriptions[consumer.topic, consumer.subscription])
        else:
            assert what == "close", what
            self._again_soon(consumer)

    def _refused(self, error: pb.CommandError) -> None:
        what, consumer = self.requests.pop(error.request_id)
        # Only as a race: the broker had closed the consumer (an unload, another consumer's
        # seek) before the request came; its CLOSE_CONSUMER makes it subscribe again.
        assert what in ("seek", "unsubscribe"), (error, consumer)
        assert error.error == pb.ConsumerNotFound, (error, consumer)
        if what == "unsubscribe":
            self._unsubscribe_abandoned(self.subscriptions[consumer.topic, consumer.subscription])

    def _message(
        self, connection: RawClient, message: pb.CommandMessage, payload: bytes | None
    ) -> None:
        consumer = self.consumers[message.consumer_id]
        if consumer.state != "live":
            return  # in flight when it closed: the broker delivers it again
        subscription = self.subscriptions[consumer.topic, consumer.subscription]
        subscription.last_progress = time.monotonic()
        assert payload is not None
        metadata = parse_metadata(decode_payload(payload).entry)
        sequence_id = metadata.sequence_id
        entry = (message.message_id.ledger_id, message.message_id.entry_id)
        if self.seeks:
            subscription.seen[entry[1]] = (entry[0], metadata.publish_time)
        consumer.since_flow += 1
        if consumer.since_flow >= max(1, consumer.queue // 2):
            connection.flow(consumer.consumer_id, consumer.since_flow)
            consumer.since_flow = 0
        if consumer.sub_type in NACKABLE and self.rng.random() < self.schedule.nacks:
            connection.send_command(_negative_ack(consumer.consumer_id, entry))
            return  # counted once it comes back and is acked
        consumer.to_ack.append((*entry, sequence_id))
        if len(consumer.to_ack) >= self.rng.randint(1, 20):
            self._ack(consumer)

    def _ack(self, consumer: Consumer) -> None:
        connection = self.connections[consumer.connection]
        subscription = self.subscriptions[consumer.topic, consumer.subscription]
        for ledger_id, entry_id, sequence_id in consumer.to_ack:
            connection.ack(consumer.consumer_id, [entry_id], ledger_id)
            subscription.acked.add(sequence_id)
            subscription.acked_entries.add(entry_id)
        consumer.to_ack.clear()

    def state(self) -> str:
        unanswered = {r: (what, c.consumer_id) for r, (what, c) in self.requests.items()}
        owed = self._owed()
        return (
            f"seed {self.schedule.seed} ({self.schedule}); seeks left {self.seeks}, "
            f"unloads left {self.unloads}, unsubscribes left {self.unsubscribes}; "
            f"unanswered requests {unanswered}; "
            f"owed {[(s.topic, s.name, len(s.acked), s.backlog) for s in owed]}"
            f" of {self.schedule.messages}; their consumers "
            f"{[s.consumers for s in owed]}; {self.publisher}; stats "
            f"{ {topic: self.broker.topic_stats(topic) for topic in self.schedule.topics} }"
        )


def _negative_ack(consumer_id: int, entry: tuple[int, int]) -> pb.BaseCommand:
    ledger_id, entry_id = entry
    again = pb.CommandRedeliverUnacknowledgedMessages(
        consumer_id=consumer_id,
        message_ids=[pb.MessageIdData(ledger_id=ledger_id, entry_id=entry_id)],
    )
    return T(type=T.REDELIVER_UNACKNOWLEDGED_MESSAGES, redeliver_unacknowledged_messages=again)


@pytest.mark.timeout(DEADLINE_SECONDS + 20)
@pytest.mark.parametrize("seed", _seeds())
def test_every_subscription_gets_every_message_whatever_the_client_pauses(
    seed: int, tmp_path: Path
) -> None:
    run_schedule(Schedule.draw(seed), tmp_path)
