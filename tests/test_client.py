"""Tests for brokerlet's gevent-native Pulsar client.

Most tests run the client in the test's own gevent hub against a real brokerlet started with
``Broker(port=0).start()`` on a thread of its own. Behaviour brokerlet never shows (lookup
redirects, partitioned topics, failed lookups, broker-side closes, unanswered keep-alives,
missing receipts) comes from a ``ScriptedBroker``: a small endpoint on the test's hub, built
on brokerlet's codec, that answers only what each test tells it to.

Every wait has a bound; nothing sleeps to synchronise.
"""

from __future__ import annotations

import itertools
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import gevent
import gevent.event
import gevent.server
import gevent.socket
import pytest

from brokerlet import Broker
from brokerlet.client import (
    AlreadyClosed,
    Client,
    ConnectError,
    Consumer,
    ConsumerBusy,
    ConsumerType,
    CumulativeAcknowledgementNotAllowedError,
    InitialPosition,
    InvalidConfiguration,
    InvalidTopicName,
    Message,
    MessageId,
    PulsarError,
    Timeout,
    TopicNotFound,
)
from brokerlet.client.types import (
    java_string_hash,
    normalize_topic,
    parse_service_url,
)
from brokerlet.testing.waiting import wait_until
from brokerlet.transport.protocol import (
    FrameDecoder,
    build_entry,
    crc32c,
    decode_payload,
    encode_batch,
    encode_command,
    encode_payload_command,
    encode_send_receipt,
    parse_metadata,
    pb,
)

T = pb.BaseCommand
WAIT = 5.0  # bound for any single wait; passing runs take milliseconds
_topics = itertools.count()


# -- fixtures and helpers -----------------------------------------------------------------


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    running = Broker(port=0).start()
    yield running
    running.stop()


@pytest.fixture
def client(broker: Broker) -> Iterator[Client]:
    client = Client(broker.service_url, operation_timeout_seconds=WAIT)
    yield client
    client.close()


@pytest.fixture
def topic() -> str:
    return f"persistent://public/default/client-{next(_topics)}-{time.monotonic_ns()}"


def receive_n(consumer: Consumer, count: int, *, ack: bool = True) -> list[Message]:
    messages = []
    for _ in range(count):
        message = consumer.receive(int(WAIT * 1000))
        if ack:
            consumer.acknowledge(message)
        messages.append(message)
    return messages


def wait_queued(consumer: Consumer, count: int) -> None:
    """Wait until ``count`` messages sit in the consumer's local queue."""
    wait_until(
        lambda: len(consumer._queue),
        predicate=lambda queued: queued == count,
        message=f"{count} messages in the local queue",
        timeout=WAIT,
        interval=0.01,
    )


def nothing_more(consumer: Consumer, wait_ms: int = 150) -> bool:
    try:
        consumer.receive(wait_ms)
    except Timeout:
        return True
    return False


class ScriptedBroker:
    """A Pulsar endpoint on the test's hub that answers only what a test scripts.

    It always answers CONNECT and records every command it receives. ``handlers`` maps a
    command type to ``handler(broker, sock, command)``; commands without a handler go
    unanswered.
    """

    def __init__(
        self, handlers: dict[int, Callable[[ScriptedBroker, Any, pb.BaseCommand], None]]
    ) -> None:
        self.handlers = handlers
        self.received: list[pb.BaseCommand] = []
        self.payloads: list[bytes] = []
        self.connections = 0
        self.disconnects = 0
        self._changed = gevent.event.Event()
        self._server = gevent.server.StreamServer(("127.0.0.1", 0), self._serve)
        self._server.start()

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self._server.address[1]}"

    def stop(self) -> None:
        self._server.stop(timeout=1)

    def commands(self, kind: int) -> list[pb.BaseCommand]:
        return [c for c in self.received if c.type == kind]

    def wait_for(self, condition: Callable[[], bool]) -> None:
        deadline = time.monotonic() + WAIT
        while not condition():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pytest.fail("the scripted broker did not see what the test expected")
            self._changed.clear()
            self._changed.wait(remaining)

    def wait_for_command(self, kind: int, count: int = 1) -> pb.BaseCommand:
        self.wait_for(lambda: len(self.commands(kind)) >= count)
        return self.commands(kind)[count - 1]

    def _serve(self, sock: Any, _address: object) -> None:
        self.connections += 1
        self._changed.set()
        decoder = FrameDecoder(64 * 1024 * 1024)
        try:
            while True:
                data = sock.recv(65536)
                if not data:
                    break
                for frame in decoder.feed(data):
                    command = frame.command
                    self.received.append(command)
                    if frame.payload is not None:
                        self.payloads.append(frame.payload)
                    self._changed.set()
                    if command.type == T.CONNECT:
                        send(
                            sock,
                            T(
                                type=T.CONNECTED,
                                connected=pb.CommandConnected(
                                    server_version="scripted",
                                    protocol_version=20,
                                    max_message_size=5 * 1024 * 1024,
                                ),
                            ),
                        )
                    handler = self.handlers.get(command.type)
                    if handler is not None:
                        handler(self, sock, command)
        except OSError:
            pass
        finally:
            self.disconnects += 1
            self._changed.set()
            sock.close()


def send(sock: Any, command: pb.BaseCommand) -> None:
    sock.sendall(encode_command(command))


def metadata_answer(partitions: int) -> Callable[[ScriptedBroker, Any, pb.BaseCommand], None]:
    def answer(_broker: ScriptedBroker, sock: Any, command: pb.BaseCommand) -> None:
        response = pb.CommandPartitionedTopicMetadataResponse(
            request_id=command.partitioned_metadata.request_id,
            partitions=partitions,
            response=pb.CommandPartitionedTopicMetadataResponse.Success,
        )
        send(sock, T(type=T.PARTITIONED_METADATA_RESPONSE, partitioned_metadata_response=response))

    return answer


def lookup_answer(
    url: Callable[[], str], kind: int = pb.CommandLookupTopicResponse.Connect
) -> Callable[[ScriptedBroker, Any, pb.BaseCommand], None]:
    def answer(_broker: ScriptedBroker, sock: Any, command: pb.BaseCommand) -> None:
        response = pb.CommandLookupTopicResponse(
            request_id=command.lookup.request_id,
            response=kind,  # type: ignore[arg-type]
            broker_service_url=url(),
            authoritative=True,
        )
        send(sock, T(type=T.LOOKUP_RESPONSE, lookup_response=response))

    return answer


def producer_answer(_broker: ScriptedBroker, sock: Any, command: pb.BaseCommand) -> None:
    request = command.producer
    send(
        sock,
        T(
            type=T.PRODUCER_SUCCESS,
            producer_success=pb.CommandProducerSuccess(
                request_id=request.request_id,
                producer_name=request.producer_name or "scripted-0",
                last_sequence_id=-1,
            ),
        ),
    )


def success_answer(field: str) -> Callable[[ScriptedBroker, Any, pb.BaseCommand], None]:
    def answer(_broker: ScriptedBroker, sock: Any, command: pb.BaseCommand) -> None:
        request_id = getattr(command, field).request_id
        send(sock, T(type=T.SUCCESS, success=pb.CommandSuccess(request_id=request_id)))

    return answer


def receipt_answer(_broker: ScriptedBroker, sock: Any, command: pb.BaseCommand) -> None:
    request = command.send
    sock.sendall(
        encode_send_receipt(
            request.producer_id, request.sequence_id, request.sequence_id, 9, request.sequence_id
        )
    )


@pytest.fixture
def scripted() -> Iterator[list[ScriptedBroker]]:
    """Scripted brokers a test creates; stopped afterwards."""
    created: list[ScriptedBroker] = []
    yield created
    for endpoint in created:
        endpoint.stop()


def self_serving(
    scripted: list[ScriptedBroker],
    extra: dict[int, Callable[[ScriptedBroker, Any, pb.BaseCommand], None]] | None = None,
) -> ScriptedBroker:
    """A scripted broker that looks topics up to itself and accepts producers and closes."""
    endpoint: ScriptedBroker
    handlers: dict[int, Callable[[ScriptedBroker, Any, pb.BaseCommand], None]] = {
        T.PARTITIONED_METADATA: metadata_answer(0),
        T.LOOKUP: lookup_answer(lambda: endpoint.url),
        T.PRODUCER: producer_answer,
        T.CLOSE_PRODUCER: success_answer("close_producer"),
        T.CLOSE_CONSUMER: success_answer("close_consumer"),
    }
    handlers.update(extra or {})
    endpoint = ScriptedBroker(handlers)
    scripted.append(endpoint)
    return endpoint


# -- producing and consuming against brokerlet ---------------------------------------------


def test_round_trip_keeps_keys_properties_and_timestamps(client: Client, topic: str) -> None:
    consumer = client.subscribe(topic, "sub")
    producer = client.create_producer(topic, producer_name="round-trip")
    before = int(time.time() * 1000)
    sent = producer.send(
        b"hello",
        partition_key="key-1",
        ordering_key=b"order-1",
        properties={"a": "1", "b": "2"},
        event_timestamp=1234,
    )
    plain = producer.send(b"plain")

    first, second = receive_n(consumer, 2)

    assert first.data() == b"hello"
    assert first.partition_key() == "key-1"
    assert first.ordering_key() == b"order-1"
    assert first.properties() == {"a": "1", "b": "2"}
    assert first.event_timestamp() == 1234
    assert first.producer_name() == "round-trip" == producer.producer_name
    assert first.topic_name() == topic == producer.topic == consumer.topic
    assert before <= first.publish_timestamp() <= int(time.time() * 1000)
    assert first.message_id() == sent
    assert first.redelivery_count() == 0
    assert (second.data(), second.partition_key(), second.ordering_key()) == (b"plain", "", None)
    assert second.properties() == {}
    assert second.message_id() == plain
    assert sent.batch_index == -1
    assert sent < plain


def test_short_topic_names_are_expanded(client: Client) -> None:
    name = f"short-{time.monotonic_ns()}"
    consumer = client.subscribe(name, "sub")
    client.create_producer(name).send(b"x")

    message = consumer.receive(int(WAIT * 1000))

    assert message.topic_name() == f"persistent://public/default/{name}"


def test_shared_consumers_get_disjoint_sets_covering_every_message(
    client: Client, topic: str
) -> None:
    first = client.subscribe(
        topic, "shared", consumer_type=ConsumerType.Shared, receiver_queue_size=10
    )
    second = client.subscribe(
        topic, "shared", consumer_type=ConsumerType.Shared, receiver_queue_size=10
    )
    producer = client.create_producer(topic)
    expected = {b"m%d" % i for i in range(60)}
    for body in sorted(expected):
        producer.send_async(body, lambda error, _id: None)
    producer.flush()

    got: list[list[bytes]] = [[], []]
    deadline = time.monotonic() + WAIT
    while len(got[0]) + len(got[1]) < len(expected) and time.monotonic() < deadline:
        for index, consumer in enumerate((first, second)):
            try:
                message = consumer.receive(20)
            except Timeout:
                continue
            consumer.acknowledge(message)
            got[index].append(message.data())

    assert got[0], "both consumers should receive part of the stream"
    assert got[1], "both consumers should receive part of the stream"
    assert not set(got[0]) & set(got[1])
    assert sorted(got[0] + got[1]) == sorted(expected)
    assert nothing_more(first)
    assert nothing_more(second)


def test_shared_prefers_the_lowest_priority_level_with_permits(client: Client, topic: str) -> None:
    high = client.subscribe(
        topic, "prio", consumer_type=ConsumerType.Shared, receiver_queue_size=6, priority_level=0
    )
    low = client.subscribe(
        topic, "prio", consumer_type=ConsumerType.Shared, receiver_queue_size=50, priority_level=1
    )
    producer = client.create_producer(topic)
    for i in range(6):
        producer.send(b"%d" % i)
    # Level 0 has permits for all six: level 1 gets nothing.
    assert nothing_more(low)
    # Level 0's queue is full and unread, so it has no permits: level 1 takes what follows.
    for i in range(6, 10):
        producer.send(b"%d" % i)
    assert sorted(m.data() for m in receive_n(low, 4)) == [b"%d" % i for i in range(6, 10)]
    assert sorted(m.data() for m in receive_n(high, 6)) == [b"%d" % i for i in range(6)]


def test_batched_producer_messages_arrive_split_with_batch_indexes(
    client: Client, topic: str
) -> None:
    consumer = client.subscribe(topic, "sub")
    producer = client.create_producer(
        topic, batching_enabled=True, batching_max_messages=4, batching_max_publish_delay_ms=1000
    )
    receipts: list[tuple[PulsarError | None, MessageId | None]] = []
    for i in range(10):
        producer.send_async(
            b"b%d" % i,
            lambda error, mid: receipts.append((error, mid)),
            properties={"i": str(i)},
            partition_key=f"k{i}",
        )
    producer.flush()  # the last two would otherwise wait for the 1 s delay

    messages = receive_n(consumer, 10)

    assert [error for error, _ in receipts] == [None] * 10
    ids = [mid for _, mid in receipts]
    assert ids == [m.message_id() for m in messages]
    entries = sorted({(mid.ledger_id, mid.entry_id) for mid in ids if mid is not None})
    assert len(entries) == 3  # batches of 4, 4 and 2
    assert [mid.batch_index for mid in ids if mid is not None] == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    assert [m.data() for m in messages] == [b"b%d" % i for i in range(10)]
    assert [m.properties() for m in messages] == [{"i": str(i)} for i in range(10)]
    assert [m.partition_key() for m in messages] == [f"k{i}" for i in range(10)]


def test_a_batch_is_acked_only_when_all_its_messages_are(client: Client, topic: str) -> None:
    consumer = client.subscribe(topic, "sub", consumer_type=ConsumerType.Shared)
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=3)
    for i in range(3):
        producer.send_async(b"%d" % i, lambda error, mid: None)
    producer.flush()
    first, second, third = receive_n(consumer, 3, ack=False)
    consumer.acknowledge(first)
    consumer.acknowledge(third)
    consumer.close()  # flushes acks; the batch is still not fully acked

    again = client.subscribe(topic, "sub", consumer_type=ConsumerType.Shared)
    redelivered = receive_n(again, 3)
    again.close()

    # The whole entry comes back: the broker knows nothing of partial batches.
    assert sorted(m.data() for m in redelivered) == [b"0", b"1", b"2"]
    assert second.message_id().batch_index == 1

    # Now fully acked: a new consumer of the subscription sees nothing.
    last = client.subscribe(topic, "sub", consumer_type=ConsumerType.Shared)
    assert nothing_more(last)


def test_batches_flush_on_the_delay_timer(client: Client, topic: str) -> None:
    consumer = client.subscribe(topic, "sub")
    producer = client.create_producer(
        topic, batching_enabled=True, batching_max_publish_delay_ms=20
    )
    done = gevent.event.AsyncResult()
    producer.send_async(b"lonely", lambda error, mid: done.set((error, mid)))

    error, message_id = done.get(timeout=WAIT)

    assert error is None
    assert message_id.batch_index == 0
    assert consumer.receive(int(WAIT * 1000)).data() == b"lonely"


def test_sync_send_with_batching_returns_batch_index(client: Client, topic: str) -> None:
    producer = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=1)
    first = producer.send(b"a")
    second = producer.send(b"b")

    assert (first.batch_index, second.batch_index) == (0, 0)
    assert (first.ledger_id, first.entry_id) < (second.ledger_id, second.entry_id)


def test_negative_ack_is_redelivered_with_redelivery_count_one(client: Client, topic: str) -> None:
    consumer = client.subscribe(
        topic, "sub", consumer_type=ConsumerType.Shared, negative_ack_redelivery_delay_ms=100
    )
    producer = client.create_producer(topic)
    sent = producer.send(b"retry me")
    producer.send(b"fine")
    first, fine = receive_n(consumer, 2, ack=False)
    consumer.acknowledge(fine)
    nacked_at = time.monotonic()
    consumer.negative_acknowledge(first)

    again = consumer.receive(int(WAIT * 1000))

    assert time.monotonic() - nacked_at >= 0.09
    assert again.message_id() == sent
    assert again.data() == b"retry me"
    assert (first.redelivery_count(), again.redelivery_count()) == (0, 1)
    consumer.acknowledge(again)
    assert nothing_more(consumer)


def test_negative_ack_on_exclusive_redelivers_everything_unacked(
    client: Client, topic: str
) -> None:
    consumer = client.subscribe(topic, "sub", negative_ack_redelivery_delay_ms=50)
    producer = client.create_producer(topic)
    for i in range(3):
        producer.send(b"%d" % i)
    first, *_rest = receive_n(consumer, 3, ack=False)
    consumer.negative_acknowledge(first)

    # Exclusive nacks carry no ids: every unacked message comes back.
    again = receive_n(consumer, 3)

    assert [m.data() for m in again] == [b"0", b"1", b"2"]
    assert [m.redelivery_count() for m in again] == [1, 1, 1]


def test_redeliver_unacknowledged_drops_the_local_queue(client: Client, topic: str) -> None:
    consumer = client.subscribe(topic, "sub", receiver_queue_size=100)
    producer = client.create_producer(topic)
    for i in range(5):
        producer.send(b"%d" % i)
    taken = receive_n(consumer, 2, ack=False)
    # Wait for the other three to be queued locally, so the redelivery must drop them.
    wait_queued(consumer, 3)

    consumer.redeliver_unacknowledged_messages()
    again = receive_n(consumer, 5)

    assert [m.data() for m in taken] == [b"0", b"1"]
    assert [m.data() for m in again] == [b"0", b"1", b"2", b"3", b"4"]
    assert all(m.redelivery_count() == 1 for m in again)
    assert nothing_more(consumer)


def test_unacked_messages_of_a_closed_consumer_go_to_the_other(client: Client, topic: str) -> None:
    first = client.subscribe(topic, "shared", consumer_type=ConsumerType.Shared)
    producer = client.create_producer(topic)
    for i in range(5):
        producer.send(b"%d" % i)
    received = receive_n(first, 5, ack=False)
    first.acknowledge(received[0])
    second = client.subscribe(topic, "shared", consumer_type=ConsumerType.Shared)

    first.close()
    moved = receive_n(second, 4)

    assert sorted(m.data() for m in moved) == [b"1", b"2", b"3", b"4"]
    assert nothing_more(second)
    with pytest.raises(AlreadyClosed):
        first.receive(10)


def test_exclusive_subscription_rejects_a_second_consumer(client: Client, topic: str) -> None:
    client.subscribe(topic, "only-one")

    with pytest.raises(ConsumerBusy) as raised:
        client.subscribe(topic, "only-one")

    assert isinstance(raised.value, PulsarError)
    assert raised.value.code == pb.ConsumerBusy


def test_failover_cumulative_ack_survives_a_new_consumer(client: Client, topic: str) -> None:
    consumer = client.subscribe(topic, "fo", consumer_type=ConsumerType.Failover)
    producer = client.create_producer(topic)
    for i in range(10):
        producer.send(b"%d" % i)
    messages = receive_n(consumer, 10, ack=False)
    consumer.acknowledge_cumulative(messages[5])
    consumer.close()

    successor = client.subscribe(topic, "fo", consumer_type=ConsumerType.Failover)
    rest = receive_n(successor, 4)

    assert [m.data() for m in rest] == [b"6", b"7", b"8", b"9"]
    assert nothing_more(successor)


@pytest.mark.parametrize(("acked_index", "back"), [(1, [b"b0", b"b1", b"b2"]), (2, [])])
def test_cumulative_ack_inside_a_batch_covers_the_batch_only_when_complete(
    client: Client, topic: str, acked_index: int, back: list[bytes]
) -> None:
    consumer = client.subscribe(topic, "fo", consumer_type=ConsumerType.Failover)
    client.create_producer(topic).send(b"single")
    batcher = client.create_producer(topic, batching_enabled=True, batching_max_messages=3)
    for i in range(3):
        batcher.send_async(b"b%d" % i, lambda error, mid: None)
    batcher.flush()
    messages = receive_n(consumer, 4, ack=False)
    consumer.acknowledge_cumulative(messages[1 + acked_index])
    consumer.close()

    successor = client.subscribe(topic, "fo", consumer_type=ConsumerType.Failover)
    again = [m.data() for m in receive_n(successor, len(back))]

    # Part of a batch unacked: only the entry before it is acked, so the batch returns.
    assert again == back
    assert nothing_more(successor)


def test_cumulative_ack_is_refused_on_shared(client: Client, topic: str) -> None:
    consumer = client.subscribe(topic, "sub", consumer_type=ConsumerType.Shared)
    client.create_producer(topic).send(b"x")
    message = consumer.receive(int(WAIT * 1000))

    with pytest.raises(CumulativeAcknowledgementNotAllowedError):
        consumer.acknowledge_cumulative(message)


def test_small_receiver_queue_is_refilled(broker: Broker, client: Client, topic: str) -> None:
    consumer = client.subscribe(topic, "sub", receiver_queue_size=5)
    producer = client.create_producer(topic)
    for i in range(50):
        producer.send_async(b"%d" % i, lambda error, mid: None)
    producer.flush()

    def delivered() -> int:
        stats = broker.topic_stats(topic)
        assert stats is not None
        return int(stats["subscriptions"]["sub"]["msgOutCounter"])

    # Only the queue's worth is pushed ahead of receive(), and the permits are used up.
    wait_queued(consumer, 5)
    stats = broker.topic_stats(topic)
    assert stats is not None
    assert stats["subscriptions"]["sub"]["consumers"][0]["availablePermits"] == 0
    assert delivered() == 5
    messages = receive_n(consumer, 50)

    assert [m.data() for m in messages] == [b"%d" % i for i in range(50)]
    assert delivered() == 50


def test_receive_times_out(client: Client, topic: str) -> None:
    consumer = client.subscribe(topic, "sub")
    started = time.monotonic()

    with pytest.raises(Timeout):
        consumer.receive(150)

    assert 0.14 <= time.monotonic() - started < 2


def test_a_waiting_receive_wakes_for_a_message(client: Client, topic: str) -> None:
    consumer = client.subscribe(topic, "sub")
    producer = client.create_producer(topic)
    waiting = gevent.spawn(consumer.receive, int(WAIT * 1000))
    gevent.idle()  # every ready greenlet has run: the receive is now waiting
    assert not waiting.ready()

    producer.send(b"wake up")

    assert waiting.get(timeout=WAIT).data() == b"wake up"


def test_producer_and_consumer_reconnect_after_a_broker_restart(topic: str) -> None:
    first = Broker(port=0).start()
    host, port = first.address
    client = Client(first.service_url, operation_timeout_seconds=WAIT)
    second: Broker | None = None
    try:
        consumer = client.subscribe(topic, "sub", consumer_type=ConsumerType.Shared)
        producer = client.create_producer(topic)
        producer.send(b"before")
        assert consumer.receive(int(WAIT * 1000)).data() == b"before"

        first.stop()
        second = Broker(port=port, host=host).start()
        # The subscription is new on the restarted (in-memory) broker: the consumer must be
        # back before the message is sent, or Latest would skip it.
        wait_until(
            lambda: consumer.is_connected() and producer.is_connected(),
            message="the consumer and producer to reconnect",
            timeout=WAIT,
            interval=0.01,
        )
        sent = producer.send(b"after")
        received = consumer.receive(int(WAIT * 1000))

        assert received.data() == b"after"
        assert received.message_id() == sent
    finally:
        client.close()
        first.stop()
        if second is not None:
            second.stop()


# -- pausing reads -------------------------------------------------------------------------


def test_pause_reading_makes_the_broker_see_an_unwritable_consumer(topic: str) -> None:
    small = Broker(port=0, so_sndbuf=4096, high_watermark=8192, low_watermark=4096).start()
    reader = Client(small.service_url, operation_timeout_seconds=WAIT, so_rcvbuf=4096)
    writer = Client(small.service_url, operation_timeout_seconds=WAIT)
    try:
        consumer = reader.subscribe(topic, "sub", receiver_queue_size=1000)
        producer = writer.create_producer(topic, block_if_queue_full=True)

        def consumer_writable() -> bool:
            stats = small.topic_stats(topic)
            assert stats is not None
            return bool(stats["subscriptions"]["sub"]["consumers"][0]["writable"])

        consumer.pause_reading()
        body = b"x" * 1000
        for i in range(400):
            producer.send_async(b"%04d" % i + body, lambda error, mid: None)
        producer.flush()

        wait_until(
            lambda: not consumer_writable(),
            message="the broker to see the paused consumer unwritable",
            timeout=WAIT,
            interval=0.01,
        )
        assert nothing_more(consumer, 100)

        consumer.resume_reading()
        messages = receive_n(consumer, 400)

        assert [m.data()[:4] for m in messages] == [b"%04d" % i for i in range(400)]
        wait_until(
            consumer_writable,
            message="the broker to see the consumer writable again",
            timeout=WAIT,
            interval=0.01,
        )
    finally:
        reader.close()
        writer.close()
        small.stop()


def test_client_pause_reading_holds_delivery_until_resumed(client: Client, topic: str) -> None:
    consumer = client.subscribe(topic, "sub")
    other = Client(client.service_url, operation_timeout_seconds=WAIT)
    try:
        producer = other.create_producer(topic)
        client.pause_reading()
        for i in range(20):
            producer.send(b"%d" % i)

        assert nothing_more(consumer)

        client.resume_reading()
        assert [m.data() for m in receive_n(consumer, 20)] == [b"%d" % i for i in range(20)]
    finally:
        other.close()


# -- lookups, partitions and errors (scripted brokers) ---------------------------------------


def test_lookup_follows_redirects_to_partitions_on_another_broker(
    broker: Broker, scripted: list[ScriptedBroker], topic: str
) -> None:
    # service -> Redirect(authoritative) -> second -> Connect -> brokerlet, for 3 partitions
    second = ScriptedBroker({T.LOOKUP: lookup_answer(lambda: broker.service_url)})
    service = ScriptedBroker(
        {
            T.PARTITIONED_METADATA: metadata_answer(3),
            T.LOOKUP: lookup_answer(lambda: second.url, pb.CommandLookupTopicResponse.Redirect),
        }
    )
    scripted.extend([service, second])
    client = Client(service.url, operation_timeout_seconds=WAIT)
    try:
        assert client.get_topic_partitions(topic) == [f"{topic}-partition-{i}" for i in range(3)]
        consumer = client.subscribe(topic, "sub", consumer_type=ConsumerType.Shared)
        producer = client.create_producer(topic)
        keyed = [producer.send(b"k", partition_key="same-key") for _ in range(3)]
        spread = [producer.send(b"%d" % i) for i in range(6)]

        messages = receive_n(consumer, 9)

        expected_partition = java_string_hash("same-key") % 3
        assert {mid.partition for mid in keyed} == {expected_partition}
        assert sorted(mid.partition for mid in spread) == [0, 0, 1, 1, 2, 2]  # round robin
        assert sorted(m.message_id() for m in messages) == sorted(keyed + spread)
        assert {m.topic_name() for m in messages} == {f"{topic}-partition-{i}" for i in range(3)}
        stats = broker.stats()
        assert all(f"{topic}-partition-{i}" in stats for i in range(3))
        redirected = second.commands(T.LOOKUP)
        assert redirected
        assert all(c.lookup.authoritative for c in redirected)
        assert not any(c.lookup.authoritative for c in service.commands(T.LOOKUP))
    finally:
        client.close()


def test_an_error_inside_a_lookup_answer_is_raised(scripted: list[ScriptedBroker]) -> None:
    def refuse(_broker: ScriptedBroker, sock: Any, command: pb.BaseCommand) -> None:
        send(
            sock,
            T(
                type=T.LOOKUP_RESPONSE,
                lookup_response=pb.CommandLookupTopicResponse(
                    request_id=command.lookup.request_id,
                    response=pb.CommandLookupTopicResponse.Failed,
                    error=pb.TopicNotFound,
                    message="no such topic",
                ),
            ),
        )

    service = ScriptedBroker({T.PARTITIONED_METADATA: metadata_answer(0), T.LOOKUP: refuse})
    scripted.append(service)
    client = Client(service.url, operation_timeout_seconds=WAIT)
    try:
        started = time.monotonic()
        with pytest.raises(TopicNotFound) as raised:
            client.create_producer("missing")
        assert raised.value.code == pb.TopicNotFound
        assert "no such topic" in str(raised.value)
        assert time.monotonic() - started < 1  # answered, not timed out
    finally:
        client.close()


def test_send_frames_carry_metadata_and_checksum(scripted: list[ScriptedBroker]) -> None:
    endpoint = self_serving(scripted, {T.SEND: receipt_answer})
    client = Client(endpoint.url, operation_timeout_seconds=WAIT)
    try:
        producer = client.create_producer("t", producer_name="named")
        message_id = producer.send(b"body", partition_key="pk", properties={"p": "v"})

        command = endpoint.wait_for_command(T.SEND)
        payload = decode_payload(endpoint.payloads[0])
        metadata = parse_metadata(payload.entry)
        assert payload.checksum_ok
        assert payload.entry.endswith(b"body")
        assert (metadata.producer_name, metadata.sequence_id, metadata.partition_key) == (
            "named",
            0,
            "pk",
        )
        assert not metadata.HasField("num_messages_in_batch")
        assert [(kv.key, kv.value) for kv in metadata.properties] == [("p", "v")]
        assert (command.send.sequence_id, command.send.num_messages) == (0, 1)
        assert message_id == MessageId(9, 0)
        registered = endpoint.commands(T.PRODUCER)[0].producer
        assert registered.topic == "persistent://public/default/t"
        assert registered.producer_name == "named"
        assert registered.user_provided_producer_name
    finally:
        client.close()


def test_send_times_out_without_a_receipt(scripted: list[ScriptedBroker]) -> None:
    endpoint = self_serving(scripted)  # never answers SEND
    client = Client(endpoint.url, operation_timeout_seconds=WAIT)
    try:
        producer = client.create_producer("t", send_timeout_millis=150)
        started = time.monotonic()
        with pytest.raises(Timeout):
            producer.send(b"lost")
        assert 0.14 <= time.monotonic() - started < 2
    finally:
        client.close()


def test_a_full_pending_queue_fails_fast(scripted: list[ScriptedBroker]) -> None:
    endpoint = self_serving(scripted)  # never answers SEND
    # Closing waits up to the operation timeout for receipts that never come: keep it short.
    client = Client(endpoint.url, operation_timeout_seconds=0.2)
    try:
        producer = client.create_producer("t", max_pending_messages=2, send_timeout_millis=0)
        outcomes: list[str] = []
        for _ in range(3):
            producer.send_async(b"x", lambda error, mid: outcomes.append(type(error).__name__))
        assert outcomes == ["ProducerQueueIsFull"]
    finally:
        client.close()
    assert outcomes == ["ProducerQueueIsFull", "AlreadyClosed", "AlreadyClosed"]


def test_a_full_pending_queue_blocks_until_there_is_room(scripted: list[ScriptedBroker]) -> None:
    endpoint = self_serving(scripted)  # never answers SEND: room comes from send timeouts
    client = Client(endpoint.url, operation_timeout_seconds=0.2)
    try:
        producer = client.create_producer(
            "t", max_pending_messages=1, block_if_queue_full=True, send_timeout_millis=100
        )
        events: list[str] = []
        producer.send_async(b"1", lambda error, mid: events.append(f"1 {type(error).__name__}"))
        blocked = gevent.spawn(producer.send_async, b"2", lambda error, mid: None)
        gevent.idle()  # every ready greenlet has run: the send is now at the full queue

        assert not blocked.ready()
        blocked.join(timeout=WAIT)
        assert blocked.ready(), "the blocked send was never admitted"
        events.append("2 admitted")
        assert events == ["1 Timeout", "2 admitted"]
        assert blocked.successful()
    finally:
        client.close()


def test_producer_re_registers_and_resends_when_the_broker_closes_it(
    scripted: list[ScriptedBroker],
) -> None:
    def close_first_send(endpoint: ScriptedBroker, sock: Any, command: pb.BaseCommand) -> None:
        if len(endpoint.commands(T.SEND)) == 1:  # drop the first attempt, answer the resend
            send(
                sock,
                T(
                    type=T.CLOSE_PRODUCER,
                    close_producer=pb.CommandCloseProducer(
                        producer_id=command.send.producer_id, request_id=999
                    ),
                ),
            )
        else:
            receipt_answer(endpoint, sock, command)

    endpoint = self_serving(scripted, {T.SEND: close_first_send})
    client = Client(endpoint.url, operation_timeout_seconds=WAIT)
    try:
        producer = client.create_producer("t")
        name = producer.producer_name

        message_id = producer.send(b"again")

        first, second = endpoint.commands(T.SEND)
        assert first.send.sequence_id == second.send.sequence_id == 0
        assert first.send.producer_id != second.send.producer_id
        registrations = [c.producer for c in endpoint.commands(T.PRODUCER)]
        assert [r.epoch for r in registrations] == [0, 1]
        assert registrations[1].producer_name == name
        assert not registrations[1].user_provided_producer_name
        assert message_id == MessageId(9, 0)
        assert endpoint.commands(T.LOOKUP)[-1].lookup.topic == "persistent://public/default/t"
    finally:
        client.close()


def test_consumer_resubscribes_after_losing_its_connection(
    scripted: list[ScriptedBroker],
) -> None:
    def subscribe(endpoint: ScriptedBroker, sock: Any, command: pb.BaseCommand) -> None:
        send(
            sock,
            T(type=T.SUCCESS, success=pb.CommandSuccess(request_id=command.subscribe.request_id)),
        )

    def flow(endpoint: ScriptedBroker, sock: Any, command: pb.BaseCommand) -> None:
        if len(endpoint.commands(T.FLOW)) == 1:
            sock.shutdown(gevent.socket.SHUT_RDWR)  # drop the first connection
            return
        push_message(sock, command.flow.consumer_id)

    endpoint = self_serving(scripted, {T.SUBSCRIBE: subscribe, T.FLOW: flow})
    client = Client(endpoint.url, operation_timeout_seconds=WAIT)
    try:
        consumer = client.subscribe("t", "sub", consumer_name="c", receiver_queue_size=7)

        message = consumer.receive(int(WAIT * 1000))

        assert message.data() == b"pushed"
        assert message.message_id() == MessageId(3, 4)
        assert endpoint.connections == 2
        subscribes = [c.subscribe for c in endpoint.commands(T.SUBSCRIBE)]
        assert [(s.subscription, s.consumer_name) for s in subscribes] == [("sub", "c")] * 2
        assert [c.flow.message_permits for c in endpoint.commands(T.FLOW)] == [7, 7]
    finally:
        client.close()


def subscribe_then_push(endpoint: ScriptedBroker, sock: Any, command: pb.BaseCommand) -> None:
    """SUBSCRIBE handler: succeed, then push one message (3:4) to the new consumer."""
    send(
        sock, T(type=T.SUCCESS, success=pb.CommandSuccess(request_id=command.subscribe.request_id))
    )
    push_message(sock, command.subscribe.consumer_id)


def push_message(sock: Any, consumer_id: int) -> None:
    """Send ``consumer_id`` one MESSAGE, b"pushed" at 3:4."""
    entry = build_entry(
        pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1), b"pushed"
    )
    message = T(
        type=T.MESSAGE,
        message=pb.CommandMessage(
            consumer_id=consumer_id, message_id=pb.MessageIdData(ledger_id=3, entry_id=4)
        ),
    )
    sock.sendall(encode_payload_command(message, entry, checksum=crc32c(entry)))


@pytest.mark.parametrize(
    ("consumer_type", "expected_ids"),
    [
        (ConsumerType.Shared, [(3, 4)]),
        (ConsumerType.KeyShared, [(3, 4)]),
        (ConsumerType.Exclusive, []),
        (ConsumerType.Failover, []),
    ],
)
def test_negative_acks_carry_ids_only_for_shared_types(
    scripted: list[ScriptedBroker], consumer_type: ConsumerType, expected_ids: list[Any]
) -> None:
    endpoint = self_serving(scripted, {T.SUBSCRIBE: subscribe_then_push})
    client = Client(endpoint.url, operation_timeout_seconds=WAIT)
    try:
        consumer = client.subscribe(
            "t", "sub", consumer_type=consumer_type, negative_ack_redelivery_delay_ms=10
        )
        consumer.negative_acknowledge(consumer.receive(int(WAIT * 1000)))

        redeliver = endpoint.wait_for_command(T.REDELIVER_UNACKNOWLEDGED_MESSAGES)

        ids = redeliver.redeliver_unacknowledged_messages.message_ids
        assert [(i.ledger_id, i.entry_id) for i in ids] == expected_ids
        if consumer_type is ConsumerType.KeyShared:
            subscribe = endpoint.commands(T.SUBSCRIBE)[0].subscribe
            assert subscribe.key_shared_meta.key_shared_mode == pb.AUTO_SPLIT
    finally:
        client.close()


def test_a_corrupt_message_is_discarded_and_acked_with_the_reason(
    scripted: list[ScriptedBroker],
) -> None:
    def push_corrupt(endpoint: ScriptedBroker, sock: Any, command: pb.BaseCommand) -> None:
        send(
            sock,
            T(type=T.SUCCESS, success=pb.CommandSuccess(request_id=command.subscribe.request_id)),
        )
        entry = build_entry(
            pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1), b"pushed"
        )
        message = T(
            type=T.MESSAGE,
            message=pb.CommandMessage(
                consumer_id=command.subscribe.consumer_id,
                message_id=pb.MessageIdData(ledger_id=3, entry_id=4),
            ),
        )
        sock.sendall(encode_payload_command(message, entry, checksum=crc32c(entry) ^ 1))

    endpoint = self_serving(scripted, {T.SUBSCRIBE: push_corrupt})
    client = Client(endpoint.url, operation_timeout_seconds=WAIT)
    try:
        consumer = client.subscribe("t", "sub", receiver_queue_size=2)

        ack = endpoint.wait_for_command(T.ACK).ack

        assert ack.validation_error == pb.CommandAck.ChecksumMismatch
        assert [(i.ledger_id, i.entry_id) for i in ack.message_id] == [(3, 4)]
        assert nothing_more(consumer, 50)
        # The discarded message's permit is earned back (a refill at half of 2).
        assert endpoint.wait_for_command(T.FLOW, count=2).flow.message_permits == 1
    finally:
        client.close()


@pytest.mark.parametrize("codec", ["zlib", "lz4"])
def test_compressed_messages(scripted: list[ScriptedBroker], codec: str) -> None:
    def push_compressed(endpoint: ScriptedBroker, sock: Any, command: pb.BaseCommand) -> None:
        send(
            sock,
            T(type=T.SUCCESS, success=pb.CommandSuccess(request_id=command.subscribe.request_id)),
        )
        metadata = pb.MessageMetadata(
            producer_name="p", sequence_id=0, publish_time=1, uncompressed_size=9
        )
        if codec == "zlib":
            metadata.compression = pb.ZLIB
            body = zlib.compress(b"zzzzzzzzz")
        else:
            metadata.compression = pb.LZ4
            body = b"not really lz4"
        entry = build_entry(metadata, body)
        message = T(
            type=T.MESSAGE,
            message=pb.CommandMessage(
                consumer_id=command.subscribe.consumer_id,
                message_id=pb.MessageIdData(ledger_id=3, entry_id=4),
            ),
        )
        sock.sendall(encode_payload_command(message, entry, checksum=crc32c(entry)))

    endpoint = self_serving(scripted, {T.SUBSCRIBE: push_compressed})
    client = Client(endpoint.url, operation_timeout_seconds=WAIT)
    try:
        consumer = client.subscribe("t", "sub", receiver_queue_size=2)
        if codec == "zlib":
            assert consumer.receive(int(WAIT * 1000)).data() == b"zzzzzzzzz"
        else:
            # Undecodable here but not corrupt: not delivered, not acked, permit returned.
            assert endpoint.wait_for_command(T.FLOW, count=2).flow.message_permits == 1
            assert nothing_more(consumer, 50)
            assert endpoint.commands(T.ACK) == []
    finally:
        client.close()


def test_batch_messages_the_broker_marks_acked_are_skipped(
    scripted: list[ScriptedBroker],
) -> None:
    def push_partly_acked_batch(
        endpoint: ScriptedBroker, sock: Any, command: pb.BaseCommand
    ) -> None:
        send(
            sock,
            T(type=T.SUCCESS, success=pb.CommandSuccess(request_id=command.subscribe.request_id)),
        )
        batch = encode_batch(
            [(pb.SingleMessageMetadata(payload_size=2), b"m%d" % i) for i in range(3)]
        )
        entry = build_entry(
            pb.MessageMetadata(
                producer_name="p", sequence_id=0, publish_time=1, num_messages_in_batch=3
            ),
            batch,
        )
        message = T(
            type=T.MESSAGE,
            message=pb.CommandMessage(
                consumer_id=command.subscribe.consumer_id,
                message_id=pb.MessageIdData(ledger_id=3, entry_id=4),
                ack_set=[0b101],
            ),
        )  # message 1 was acked already
        sock.sendall(encode_payload_command(message, entry, checksum=crc32c(entry)))

    endpoint = self_serving(scripted, {T.SUBSCRIBE: push_partly_acked_batch})
    client = Client(endpoint.url, operation_timeout_seconds=WAIT)
    try:
        consumer = client.subscribe("t", "sub", receiver_queue_size=2)

        first, second = receive_n(consumer, 2)

        assert [(m.data(), m.message_id().batch_index) for m in (first, second)] == [
            (b"m0", 0),
            (b"m2", 2),
        ]
        assert nothing_more(consumer, 50)
        # Both delivered messages acked: the entry is acked, with no index left out.
        consumer.close()
        ack = endpoint.wait_for_command(T.ACK).ack
        assert [(i.ledger_id, i.entry_id) for i in ack.message_id] == [(3, 4)]
    finally:
        client.close()


# -- keep-alive ------------------------------------------------------------------------------


def test_broker_pings_are_answered(scripted: list[ScriptedBroker]) -> None:
    def ping_then_answer(endpoint: ScriptedBroker, sock: Any, command: pb.BaseCommand) -> None:
        send(sock, T(type=T.PING, ping=pb.CommandPing()))
        metadata_answer(0)(endpoint, sock, command)

    endpoint = self_serving(scripted, {T.PARTITIONED_METADATA: ping_then_answer})
    client = Client(endpoint.url, operation_timeout_seconds=WAIT, keep_alive_interval_seconds=0)
    try:
        client.get_topic_partitions("t")
        endpoint.wait_for_command(T.PONG)
    finally:
        client.close()


def test_an_idle_client_pings_and_drops_a_silent_broker(scripted: list[ScriptedBroker]) -> None:
    endpoint = self_serving(scripted)  # never answers PING
    client = Client(endpoint.url, operation_timeout_seconds=WAIT, keep_alive_interval_seconds=0.1)
    try:
        client.get_topic_partitions("t")
        endpoint.wait_for_command(T.PING)
        endpoint.wait_for(lambda: endpoint.disconnects == 1)
    finally:
        client.close()


def test_an_answered_keep_alive_keeps_the_connection(scripted: list[ScriptedBroker]) -> None:
    def pong(_endpoint: ScriptedBroker, sock: Any, _command: pb.BaseCommand) -> None:
        send(sock, T(type=T.PONG, pong=pb.CommandPong()))

    endpoint = self_serving(scripted, {T.PING: pong})
    client = Client(endpoint.url, operation_timeout_seconds=WAIT, keep_alive_interval_seconds=0.05)
    try:
        client.get_topic_partitions("t")
        endpoint.wait_for_command(T.PING, count=5)
        assert endpoint.disconnects == 0
    finally:
        client.close()


# -- the client's own errors and helpers -----------------------------------------------------


def test_closed_client_refuses_new_work(broker: Broker) -> None:
    client = Client(broker.service_url)
    client.close()

    with pytest.raises(AlreadyClosed):
        client.create_producer("t")


def test_connection_refused_is_a_connect_error() -> None:
    with gevent.socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    client = Client(f"pulsar://127.0.0.1:{port}", connection_timeout_seconds=1)
    try:
        with pytest.raises(ConnectError):
            client.create_producer("t")
    finally:
        client.close()


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("t", "persistent://public/default/t"),
        ("tenant/ns/t", "persistent://tenant/ns/t"),
        ("non-persistent://a/b/c", "non-persistent://a/b/c"),
        ("persistent://a/b/c", "persistent://a/b/c"),
    ],
)
def test_topic_names_are_normalised(given: str, expected: str) -> None:
    assert normalize_topic(given) == expected


@pytest.mark.parametrize("bad", ["a/b", "http://a/b/c", "persistent://a//c", ""])
def test_bad_topic_names_are_refused(bad: str) -> None:
    with pytest.raises(InvalidTopicName):
        normalize_topic(bad)


def test_java_string_hash_matches_java() -> None:
    # Values of String.hashCode() in Java, masked to non-negative as Pulsar does.
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -2147483648 & 0x7FFFFFFF
    assert java_string_hash("\u00e9\U0001f600") == ((0xE9 * 31 + 0xD83D) * 31 + 0xDE00) & 0x7FFFFFFF


def test_service_urls_are_parsed() -> None:
    assert parse_service_url("pulsar://h") == [("h", 6650)]
    assert parse_service_url("pulsar://a:1,b:2/") == [("a", 1), ("b", 2)]
    assert parse_service_url("pulsar://[::1]:7") == [("::1", 7)]
    with pytest.raises(InvalidConfiguration):
        parse_service_url("pulsar+ssl://h:6651")
    with pytest.raises(InvalidConfiguration):
        Client("pulsar://h:notaport")


def test_message_ids_order_by_position() -> None:
    ids = [MessageId(2, 0), MessageId(1, 5, 1), MessageId(1, 5, 0), MessageId(1, 4)]
    assert sorted(ids) == [MessageId(1, 4), MessageId(1, 5, 0), MessageId(1, 5, 1), MessageId(2, 0)]
    assert InitialPosition.Earliest.value == pb.CommandSubscribe.Earliest
    assert ConsumerType.KeyShared.value == pb.CommandSubscribe.Key_Shared
