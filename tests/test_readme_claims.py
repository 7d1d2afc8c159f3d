"""README "What works" claims that had no test of their own, each checked on a real broker
(or the dispatcher harness where the claim is about dispatch order), so that removing the
feature fails the test."""

from __future__ import annotations

import itertools
import logging
import os
import random
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pulsar
import pytest

from brokerlet import Broker, SettingsError
from brokerlet.actors._runtime import GeventActor
from brokerlet.config import load_settings
from brokerlet.dispatch.key_shared import entry_key_hash
from brokerlet.testing.rawclient import RawClient
from brokerlet.testing.waiting import wait_until
from brokerlet.transport.protocol import pb
from tests.dispatch_harness import Harness, failover_active, make_keyed_entry

T = pb.BaseCommand
SHARED = pb.CommandSubscribe.Shared


def official(broker: Broker) -> pulsar.Client:
    quiet = logging.getLogger("tests.pulsar-client")
    quiet.setLevel(logging.WARNING)
    return pulsar.Client(broker.service_url, operation_timeout_seconds=10, logger=quiet)


@pytest.fixture
def client(broker: Broker) -> Iterator[pulsar.Client]:
    running = official(broker)
    yield running
    running.close()


def subscription_stats(broker: Broker, topic: str, subscription: str) -> dict[str, Any]:
    stats = broker.topic_stats(topic)
    assert stats is not None, f"no topic {topic}"
    sub: dict[str, Any] = stats["subscriptions"][subscription]
    return sub


# Failover: among the lowest priority level, the hash ring's pick is active.


def subscribe_failover(client: RawClient, topic: str, name: str, priority: int) -> None:
    client.handshake()
    client.subscribe(
        topic,
        "fo",
        1,
        sub_type=pb.CommandSubscribe.Failover,
        consumer_name=name,
        priority_level=priority,
    )
    client.flow(1, 100)


def test_failover_picks_within_the_best_priority_level_and_hands_over_unacked(
    broker: Broker,
) -> None:
    # AbstractDispatcherSingleActiveConsumer: the best level's consumers on a hash ring.
    topic = "persistent://public/default/failover-order"
    active = failover_active(topic, ["b", "c"])
    standby = "c" if active == "b" else "b"
    with (
        RawClient(broker.address) as low_a,
        RawClient(broker.address) as high_c,
        RawClient(broker.address) as high_b,
        RawClient(broker.address) as producer,
    ):
        subscribe_failover(low_a, topic, "a", priority=1)  # best name, worse level
        subscribe_failover(high_c, topic, "c", priority=0)
        subscribe_failover(high_b, topic, "b", priority=0)
        clients = {"b": high_b, "c": high_c}
        producer.handshake()
        producer.create_producer(topic, 1)
        payloads = [f"f{i}".encode() for i in range(5)]
        for sequence, payload in enumerate(payloads):
            producer.produce(1, sequence, payload)

        assert [m.payload for m in clients[active].receive(1, 5)] == payloads
        out = {
            c["consumerName"]: c["msgOutCounter"]
            for c in subscription_stats(broker, topic, "fo")["consumers"]
        }
        assert out == {"a": 0, active: 5, standby: 0}

        clients[active].close_consumer(1)  # unacked: they move to the other of level 0
        assert [m.payload for m in clients[standby].receive(1, 5)] == payloads
        clients[standby].close_consumer(1)
        assert [m.payload for m in low_a.receive(1, 5)] == payloads


# Shared: round-robin in chunks of dispatcher_max_round_robin_batch_size.


@pytest.mark.parametrize("chunk", [1, 3, 20])
def test_shared_round_robin_hands_out_chunks_of_the_configured_size(chunk: int) -> None:
    settings = load_settings(env={}, overrides={"dispatcherMaxRoundRobinBatchSize": chunk})
    h = Harness(GeventActor, settings=settings)
    try:
        a, b = h.consumer("a", 100), h.consumer("b", 100)
        h.append(12)  # one Append: one read of all 12
        h.settle()
        assert h.sent_to(a) == [i for i in range(12) if (i // chunk) % 2 == 0]
        assert h.sent_to(b) == [i for i in range(12) if (i // chunk) % 2 == 1]
    finally:
        h.stop()


# SEEK and readers to a message id in the middle of the stream.


def test_seek_to_a_mid_stream_message_id_replays_from_it(
    client: pulsar.Client,
) -> None:
    topic = "persistent://public/default/seek-mid"
    producer = client.create_producer(topic, batching_enabled=False)
    consumer = client.subscribe(topic, "seeker")
    ids = [producer.send(f"s{i}".encode()) for i in range(20)]
    for _ in range(20):
        consumer.acknowledge(consumer.receive(5000))
    consumer.seek(ids[12])
    # The broker resets the cursor to the id itself (ManagedCursor.resetCursor); the C++
    # client then drops that one message, as its consumers start exclusive of a start id.
    again = [consumer.receive(5000).data() for _ in range(7)]
    assert again == [f"s{i}".encode() for i in range(13, 20)]
    with pytest.raises(pulsar.Timeout):
        consumer.receive(200)


@pytest.mark.parametrize("inclusive", [False, True])
def test_a_reader_from_a_mid_stream_message_id(client: pulsar.Client, inclusive: bool) -> None:
    topic = f"persistent://public/default/reader-mid-{inclusive}"
    producer = client.create_producer(topic, batching_enabled=False)
    ids = [producer.send(f"r{i}".encode()) for i in range(10)]
    reader = client.create_reader(topic, ids[6], start_message_id_inclusive=inclusive)
    seen = []
    while reader.has_message_available():
        seen.append(reader.read_next(5000).data())
    first = 6 if inclusive else 7
    assert seen == [f"r{i}".encode() for i in range(first, 10)]
    reader.close()


# Key_Shared: normal reads look ahead past the replay set only within the thresholds.


@pytest.mark.parametrize(
    ("per_consumer", "per_subscription", "look_ahead"),
    [(3, 0, False), (0, 4, False), (1000, 0, True)],
    ids=["per-consumer cap", "per-subscription cap", "room to look ahead"],
)
def test_key_shared_look_ahead_stops_at_the_replay_thresholds(
    per_consumer: int, per_subscription: int, look_ahead: bool
) -> None:
    settings = load_settings(
        env={},
        overrides={
            "keySharedLookAheadMsgInReplayThresholdPerConsumer": per_consumer,
            "keySharedLookAheadMsgInReplayThresholdPerSubscription": per_subscription,
            "key_shared_unblocking_interval_ms": 0,
        },
    )
    h = Harness(GeventActor, sub_type=pb.CommandSubscribe.Key_Shared, settings=settings)
    try:
        stuck, free = h.consumer("stuck"), h.consumer("free", 100)  # "stuck" has no permits
        rules = h.proxy.key_shared.get()
        owners: dict[str, list[str]] = {"stuck": [], "free": []}
        for key in (f"key-{i}" for i in range(300)):
            owner = rules.selector.select(entry_key_hash(make_keyed_entry(0, key)))
            owners[owner.name].append(key)
        # Ten entries "stuck" cannot take, then five "free" could.
        h.append_keyed(owners["stuck"][:10] + owners["free"][:5])
        h.settle()
        replay = len(h.proxy.replay.get())
        if look_ahead:
            assert h.sent_to(free) == list(range(10, 15))
            assert replay == 10
        else:
            limit = min(t for t in (per_consumer * 2, per_subscription) if t > 0)
            assert h.sent_to(free) == [], "normal reads went on past the replay threshold"
            assert replay == limit
        stuck.flow(100)  # the replay set drains, and reads resume
        wait_until(
            lambda: (h.settle(), len(h.sent_to(free)))[1],
            predicate=lambda sent: sent == 5,
            message="the free consumer's keys",
        )
        assert h.sent_to(stuck) == list(range(10))
    finally:
        h.stop()


# Redelivery when a consumer's connection drops (no CLOSE_CONSUMER).


def test_a_disconnected_consumers_unacked_messages_are_redelivered(
    broker: Broker, client: pulsar.Client
) -> None:
    topic = "persistent://public/default/redeliver-on-disconnect"
    producer = client.create_producer(topic, batching_enabled=False)
    payloads = [f"d{i}".encode() for i in range(5)]
    with RawClient(broker.address) as gone:
        gone.handshake()
        gone.subscribe(topic, "sub", 1, sub_type=SHARED)
        for payload in payloads:
            producer.send(payload)
        gone.flow(1, 100)
        assert [m.payload for m in gone.receive(1, 5)] == payloads  # and never acked
    # The socket is closed without a CLOSE_CONSUMER: a disconnect, not a close.
    consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared)
    again = [consumer.receive(5000) for _ in payloads]
    assert sorted(m.data() for m in again) == payloads
    assert [m.redelivery_count() for m in again] == [1] * 5


# Compression and chunking are client-side; the broker stores what it gets.


@pytest.mark.parametrize(
    "compression",
    [
        pulsar.CompressionType.LZ4,
        pulsar.CompressionType.ZLib,
        pulsar.CompressionType.ZSTD,
        pulsar.CompressionType.SNAPPY,
    ],
    ids=["lz4", "zlib", "zstd", "snappy"],
)
@pytest.mark.parametrize("batching", [False, True], ids=["unbatched", "batched"])
def test_compressed_messages_pass_through_as_stored(
    broker: Broker, client: pulsar.Client, compression: Any, batching: bool
) -> None:
    topic = f"persistent://public/default/compressed-{compression}-{batching}"
    consumer = client.subscribe(topic, "sub")
    producer = client.create_producer(
        topic,
        compression_type=compression,
        batching_enabled=batching,
        batching_max_publish_delay_ms=5,
    )
    payloads = [(f"message {i} " * 200).encode() for i in range(10)]
    for payload in payloads:
        producer.send_async(payload, None)
    producer.flush()
    got = [consumer.receive(5000) for _ in payloads]
    assert [m.data() for m in got] == payloads
    stats = broker.topic_stats(topic)
    assert stats is not None
    # Stored compressed (verbatim): far less than the 24 KB of payload.
    assert 0 < stats["storageSize"] < sum(map(len, payloads)) // 4


def test_a_chunked_message_goes_through_and_is_stored_in_chunks() -> None:
    with Broker(port=0, max_message_size=16 * 1024) as small:
        client = official(small)
        try:
            topic = "persistent://public/default/chunked"
            consumer = client.subscribe(topic, "sub")
            producer = client.create_producer(topic, batching_enabled=False, chunking_enabled=True)
            payload = random.Random(1).randbytes(100_000)  # incompressible, > 6 chunks
            producer.send(payload)
            message = consumer.receive(10000)
            assert message.data() == payload
            consumer.acknowledge(message)
            stats = small.topic_stats(topic)
            assert stats is not None
            assert stats["msgInCounter"] >= 100_000 // (16 * 1024), "stored as chunks"
        finally:
            client.close()


# Settings: the CLI's bad-setting exit, Broker(**bad), camelCase keyword arguments.


def test_the_cli_stops_on_a_bad_setting_with_key_value_and_rule() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "brokerlet", "serve", "--dispatcher-max-read-batch-size", "-3"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**os.environ, "BROKERLET_CONFIG": ""},
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip() == (
        "brokerlet: bad setting: dispatcher_max_read_batch_size = -3: must be an integer >= 1 "
        "(from --dispatcher-max-read-batch-size)"
    )


def test_broker_keyword_arguments_take_either_spelling_and_refuse_bad_values() -> None:
    assert Broker(dispatcherMaxReadBatchSize=50).settings.dispatcher_max_read_batch_size == 50
    assert Broker(dispatcher_max_read_batch_size=7).settings.dispatcher_max_read_batch_size == 7
    with pytest.raises(SettingsError, match=r"dispatcher_max_read_batch_size = -3: .*>= 1"):
        Broker(dispatcher_max_read_batch_size=-3)
    with pytest.raises(SettingsError, match=r"unknown setting 'dispatcher_max_read_batchsize'"):
        Broker(dispatcher_max_read_batchsize=5)


# Socket options on the broker's side of an accepted connection.

_TCP_NOTSENT_LOWAT = getattr(socket, "TCP_NOTSENT_LOWAT", 25)  # 25 on Linux


def accepted_socket(broker: Broker, client: RawClient) -> socket.socket:
    """The broker's end of ``client``'s connection (through the server's connection set)."""
    mine = client.sock.getsockname()
    server = broker._server  # the test looks inside: the options are not visible outside
    assert server is not None
    (sock,) = [s for s in server._connections if s.getpeername()[:2] == mine[:2]]
    return sock


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="TCP_NOTSENT_LOWAT is Linux's")
@pytest.mark.parametrize(
    ("settings", "nodelay", "lowat"),
    [({}, True, 16384), ({"tcp_nodelay": False, "tcp_notsent_lowat": 4096}, False, 4096)],
    ids=["defaults", "configured"],
)
def test_accepted_sockets_get_nodelay_and_notsent_lowat(
    settings: dict[str, Any], nodelay: bool, lowat: int
) -> None:
    with Broker(port=0, **settings) as running, RawClient(running.address) as client:
        client.handshake()
        sock = accepted_socket(running, client)
        assert bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)) is nodelay
        assert sock.getsockopt(socket.IPPROTO_TCP, _TCP_NOTSENT_LOWAT) == lowat


# Stats on a real broker: rates, backlog, unacked and blocked counts, key hash ranges.


def test_stats_report_rates_backlog_unacked_blocked_and_hash_ranges() -> None:
    topic = "persistent://public/default/stats-fields"
    with Broker(port=0, max_unacked_messages_per_consumer=5) as running:
        client = official(running)
        try:
            producer = client.create_producer(topic, batching_enabled=False)
            shared = client.subscribe(
                topic, "shared", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=100
            )
            keyed = [
                client.subscribe(
                    topic, "keyed", consumer_type=pulsar.ConsumerType.KeyShared, consumer_name=name
                )
                for name in ("k1", "k2")
            ]
            for i in range(20):
                producer.send(f"m{i}".encode(), partition_key=f"key{i}")

            def blocked() -> dict[str, Any] | None:
                sub = subscription_stats(running, topic, "shared")
                (consumer,) = sub["consumers"]
                return sub if consumer["blockedConsumerOnUnackedMsgs"] else None

            sub = wait_until(blocked, message="the shared consumer to block at 5 unacked")
            (consumer,) = sub["consumers"]
            assert consumer["unackedMessages"] == 5
            assert sub["unackedMessages"] == 5
            assert sub["msgBacklog"] == 20

            # Rates are per second over a window of at least a second (and the stats may be
            # snapshots published a moment apart), so wait for both to show.
            def rates_shown() -> dict[str, Any] | None:
                stats = running.topic_stats(topic)
                if not stats or stats["msgRateIn"] <= 0:
                    return None
                return stats if stats["subscriptions"]["shared"]["msgRateOut"] > 0 else None

            stats = wait_until(rates_shown, message="non-zero msgRateIn and msgRateOut", timeout=5)
            assert stats["msgInCounter"] == 20
            assert 0 < stats["msgRateIn"] <= 20 / 0.9

            ranges = {
                c["consumerName"]: c["keyHashRanges"]
                for c in stats["subscriptions"]["keyed"]["consumers"]
            }
            assert set(ranges) == {"k1", "k2"}
            spans = []
            for name, texts in ranges.items():
                assert texts, f"{name} owns no hash range"
                for text in texts:
                    low, high = map(int, re.fullmatch(r"\[(\d+), (\d+)\]", text).groups())  # type: ignore[union-attr]
                    spans.append((low, high))
            spans.sort()
            assert all(a[1] < b[0] for a, b in itertools.pairwise(spans)), spans
            for subscribed in (shared, *keyed):  # open until the stats were read
                subscribed.close()
        finally:
            client.close()
