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
its active consumer at 0, 50 or 1,000 ms. Every subscription must get every message
acknowledged. A stall is reported when a subscription gets nothing for `STALL_SECONDS`
although the client reads everything and grants permits: a dispatcher nobody will wake (the
twenty-sixth pass's parked send was one: see test_backpressure.py).
``WAKEUP_FUZZ_SEEDS=1-200`` runs more schedules.
"""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from brokerlet import Broker
from brokerlet.testing.rawclient import RawClient
from brokerlet.transport.protocol import build_entry, encode_send, pb

T = pb.BaseCommand
SUB = pb.CommandSubscribe
TYPES = {"Shared": SUB.Shared, "Key_Shared": SUB.Key_Shared, "Failover": SUB.Failover}
NACKABLE = (SUB.Shared, SUB.Key_Shared)  # the client names messages to redeliver only there
STALL_SECONDS = 3.0
CHURN_INTERVAL = 0.25  # mean seconds between consumer closes, when a schedule churns
DEADLINE_SECONDS = 40.0


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
    live: bool = True
    closed: bool = False
    since_flow: int = 0
    to_ack: list[tuple[int, int]] = field(default_factory=list)


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
        )


def _publish(address: tuple[str, int], schedule: Schedule, errors: list[BaseException]) -> None:
    rng = random.Random(schedule.seed * 7919)
    try:
        with RawClient(address, timeout=10) as producer:
            producer.handshake()
            for producer_id, topic in enumerate(schedule.topics, start=1):
                producer.create_producer(topic, producer_id)
            sent = dict.fromkeys(range(1, len(schedule.topics) + 1), 0)
            outstanding = 0
            while any(count < schedule.messages for count in sent.values()):
                producer_id = rng.choice(
                    [p for p, count in sent.items() if count < schedule.messages]
                )
                burst = min(rng.randint(1, 64), schedule.messages - sent[producer_id])
                frames = []
                for _ in range(burst):
                    sequence_id = sent[producer_id]
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
                    sent[producer_id] += 1
                producer.send_raw(b"".join(frames))
                outstanding += burst
                if rng.random() < 0.3:  # sometimes wait for the receipts: bursts spread out
                    for _ in range(outstanding):
                        producer.expect(T.SEND_RECEIPT)
                    outstanding = 0
            for _ in range(outstanding):
                producer.expect(T.SEND_RECEIPT)
    except BaseException as error:  # reported by the test, not lost on this thread
        errors.append(error)


def _owed(schedule: Schedule, received: dict[tuple[str, str], set[int]]) -> list[tuple[str, str]]:
    return [key for key, got in received.items() if len(got) < schedule.messages]


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
    ) as broker:
        connections = [
            RawClient(broker.address, timeout=10, rcvbuf=rng.choice([4096, 16384])) for _ in (0, 1)
        ]
        try:
            consumers: dict[int, Consumer] = {}
            for connection in connections:
                connection.handshake()
            for topic, name, kind, count in schedule.subscriptions:
                for index in range(count):
                    consumer_id = len(consumers) + 1
                    connection = rng.randrange(2)
                    connections[connection].subscribe(
                        topic,
                        name,
                        consumer_id,
                        sub_type=TYPES.get(kind, SUB.Exclusive),
                        consumer_name=f"{name}-{index}",
                    )
                    consumers[consumer_id] = Consumer(
                        consumer_id,
                        topic,
                        name,
                        rng.choice([1, 5, 20, 100, 1000]),
                        connection,
                        TYPES.get(kind, SUB.Exclusive),
                        f"{name}-{index}",
                    )
            for consumer in consumers.values():
                connections[consumer.connection].flow(consumer.consumer_id, consumer.queue)

            errors: list[BaseException] = []
            publisher = threading.Thread(
                target=_publish, args=(broker.address, schedule, errors), daemon=True
            )
            publisher.start()
            received = {(t, s): set[int]() for t, s, _, _ in schedule.subscriptions}
            _consume(schedule, rng, connections, consumers, received, broker)
            publisher.join(timeout=10)
            assert not errors, errors
        finally:
            for connection in connections:
                connection.close()


def _consume(
    schedule: Schedule,
    rng: random.Random,
    connections: list[RawClient],
    consumers: dict[int, Consumer],
    received: dict[tuple[str, str], set[int]],
    broker: Broker,
) -> None:
    paused_until = [0.0, 0.0]
    requests: dict[int, Consumer] = {}  # request id -> the consumer closing or subscribing
    resubscribe: list[tuple[float, Consumer]] = []
    request_ids = iter(range(1_000_000, 2_000_000))
    deadline = time.monotonic() + DEADLINE_SECONDS
    last_progress = dict.fromkeys(received, time.monotonic())  # per subscription
    previous = time.monotonic()
    while _owed(schedule, received):
        now = time.monotonic()
        elapsed, previous = now - previous, now
        assert now < deadline, "out of time; " + _state(
            schedule, consumers, received, broker, requests
        )
        if schedule.churn and rng.random() < elapsed / CHURN_INTERVAL:
            live = [c for c in consumers.values() if c.live]
            if live:
                consumer = rng.choice(live)
                consumer.live = False
                consumer.to_ack.clear()  # never acked: the broker delivers them again
                request_id = next(request_ids)
                requests[request_id] = consumer
                close = pb.CommandCloseConsumer(
                    consumer_id=consumer.consumer_id, request_id=request_id
                )
                connections[consumer.connection].send_command(
                    T(type=T.CLOSE_CONSUMER, close_consumer=close)
                )
        for when, consumer in list(resubscribe):
            if when <= now:
                resubscribe.remove((when, consumer))
                request_id = next(request_ids)
                requests[request_id] = consumer
                connections[consumer.connection].send_command(
                    RawClient.subscribe_command(
                        consumer.topic,
                        consumer.subscription,
                        consumer.consumer_id,
                        request_id=request_id,
                        sub_type=consumer.sub_type,
                        consumer_name=consumer.name,
                    )
                )
        for index, connection in enumerate(connections):
            if now < paused_until[index]:
                continue
            if rng.random() < schedule.pause_chance:
                paused_until[index] = now + rng.uniform(0.001, schedule.longest_pause)
                continue
            for _ in range(rng.randint(1, 200)):
                try:
                    frame = connection.recv_frame(timeout=0.001)
                except TimeoutError:  # idle: the acks held back go now (the client's timer)
                    for consumer in consumers.values():
                        if consumer.connection == index and consumer.to_ack:
                            _ack(connection, consumer, received)
                    break
                kind = frame.command.type
                if kind == T.SUCCESS:
                    consumer = requests.pop(frame.command.success.request_id)
                    if consumer.live or consumer.closed:  # its SUBSCRIBE: grant the queue
                        consumer.live, consumer.closed, consumer.since_flow = True, False, 0
                        connection.flow(consumer.consumer_id, consumer.queue)
                    else:
                        consumer.closed = True
                        resubscribe.append((now + rng.uniform(0, 0.05), consumer))
                    continue
                assert kind in (T.MESSAGE, T.ACTIVE_CONSUMER_CHANGE), frame.command
                if kind != T.MESSAGE:
                    continue
                message = frame.command.message
                consumer = consumers[message.consumer_id]
                if not consumer.live:
                    continue  # in flight when it closed: the broker delivers it again
                last_progress[(consumer.topic, consumer.subscription)] = time.monotonic()
                entry = (message.message_id.ledger_id, message.message_id.entry_id)
                consumer.since_flow += 1
                if consumer.since_flow >= max(1, consumer.queue // 2):
                    connection.flow(consumer.consumer_id, consumer.since_flow)
                    consumer.since_flow = 0
                if consumer.sub_type in NACKABLE and rng.random() < schedule.nacks:
                    connection.send_command(_negative_ack(consumer.consumer_id, entry))
                    continue  # counted once it comes back and is acked
                consumer.to_ack.append(entry)
                if len(consumer.to_ack) >= rng.randint(1, 20):
                    _ack(connection, consumer, received)
        now = time.monotonic()
        for consumer in [*requests.values(), *(c for _, c in resubscribe)]:
            last_progress[(consumer.topic, consumer.subscription)] = now  # churning
        for key in _owed(schedule, received):
            if now - last_progress[key] > STALL_SECONDS:
                raise AssertionError(
                    f"nothing for {key} in {STALL_SECONDS} s while reading; "
                    + _state(schedule, consumers, received, broker, requests)
                )


def _state(
    schedule: Schedule,
    consumers: dict[int, Consumer],
    received: dict[tuple[str, str], set[int]],
    broker: Broker,
    requests: dict[int, Consumer],
) -> str:
    owed = _owed(schedule, received)
    unanswered = {request_id: c.consumer_id for request_id, c in requests.items()}
    return (
        f"seed {schedule.seed} ({schedule}); unanswered requests {unanswered}; "
        f"owed {[(key, len(received[key])) for key in owed]}"
        f" of {schedule.messages}; their consumers "
        f"{[c for c in consumers.values() if (c.topic, c.subscription) in owed]}; "
        f"stats { {topic: broker.topic_stats(topic) for topic in schedule.topics} }"
    )


def _ack(
    connection: RawClient, consumer: Consumer, received: dict[tuple[str, str], set[int]]
) -> None:
    for ledger_id, entry_id in consumer.to_ack:
        connection.ack(consumer.consumer_id, [entry_id], ledger_id)
        received[(consumer.topic, consumer.subscription)].add(entry_id)
    consumer.to_ack.clear()


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
