"""Producer access modes and the topic epoch, with the official client (pulsar-client 3.13
exposes every mode as ``access_mode=``). Behaviour from Pulsar's AbstractTopic
(``incrementTopicEpochIfNeeded``, ``handleProducerRemoved``) and ServerCnx.handleProducer."""

from __future__ import annotations

import struct
import threading
import time
from pathlib import Path

import pulsar
import pytest

from brokerlet import Broker
from brokerlet.testing.rawclient import RawClient
from brokerlet.testing.waiting import wait_until
from brokerlet.transport.protocol import pb
from tests.producer_frames import raw_producer

pytestmark = pytest.mark.official

Mode = pulsar.ProducerAccessMode


def test_exclusive_refuses_a_second_producer_of_any_mode(client: pulsar.Client, topic: str) -> None:
    first = client.create_producer(topic, access_mode=Mode.Exclusive, batching_enabled=False)
    first.send(b"one")
    # Pulsar refuses a second exclusive producer with ProducerFenced, a shared one with
    # ProducerBusy (AbstractTopic.incrementTopicEpochIfNeeded).
    with pytest.raises(pulsar.ProducerFenced):
        client.create_producer(topic, access_mode=Mode.Exclusive)
    with pytest.raises(pulsar.ProducerBusy):
        client.create_producer(topic)
    first.close()
    again = client.create_producer(topic, access_mode=Mode.Exclusive)  # released on close
    again.close()


def test_exclusive_is_refused_while_shared_producers_exist(
    client: pulsar.Client, topic: str
) -> None:
    shared = client.create_producer(topic)
    with pytest.raises(pulsar.ProducerFenced):
        client.create_producer(topic, access_mode=Mode.Exclusive)
    shared.close()


def test_wait_for_exclusive_succeeds_after_the_first_closes_not_before(
    client: pulsar.Client, topic: str
) -> None:
    first = client.create_producer(topic, access_mode=Mode.Exclusive, batching_enabled=False)
    created = threading.Event()
    holder: list[pulsar.Producer] = []

    def wait() -> None:
        holder.append(
            client.create_producer(topic, access_mode=Mode.WaitForExclusive, batching_enabled=False)
        )
        created.set()

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    # Not before: while the first holds the topic the second stays waiting.
    assert not created.wait(1.0), "WaitForExclusive producer was created while the topic was held"
    first.send(b"from the first")
    first.close()
    assert created.wait(10), "WaitForExclusive producer not created after the first closed"
    holder[0].send(b"from the second")
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    got = [consumer.receive(5000).data() for _ in range(2)]
    assert got == [b"from the first", b"from the second"]
    holder[0].close()


def test_exclusive_with_fencing_fences_the_first_whose_next_send_fails(
    client: pulsar.Client, topic: str, broker: Broker
) -> None:
    first = client.create_producer(topic, access_mode=Mode.Exclusive, batching_enabled=False)
    first.send(b"before")
    second = client.create_producer(
        topic, access_mode=Mode.ExclusiveWithFencing, batching_enabled=False
    )
    second.send(b"taker")

    def send_failure() -> Exception | None:
        try:
            first.send(b"after fencing")
        except pulsar.PulsarException as error:
            return error
        return None

    failure = wait_until(send_failure, message="a send of the fenced producer to fail")
    assert isinstance(failure, pulsar.ProducerFenced), failure
    stats = broker.topic_stats(topic)
    assert stats is not None
    assert [p["accessMode"] for p in stats["publishers"]] == ["ExclusiveWithFencing"]
    assert stats["topicEpoch"] == 1  # 0 for the first exclusive producer, 1 for the taker
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    got = [consumer.receive(5000).data() for _ in range(2)]
    assert got == [b"before", b"taker"]
    second.close()


def test_a_dropped_connection_releases_exclusivity_at_once(broker: Broker, topic: str) -> None:
    first_client = pulsar.Client(broker.service_url, operation_timeout_seconds=10)
    first_client.create_producer(topic, access_mode=Mode.Exclusive)
    first_client.close()  # the connection goes; no CLOSE_PRODUCER needed
    other = pulsar.Client(broker.service_url, operation_timeout_seconds=10)
    try:
        start = time.monotonic()
        producer = other.create_producer(topic, access_mode=Mode.Exclusive)
        assert time.monotonic() - start < 5
        producer.close()
    finally:
        other.close()


# Raw frames: what the official client hides.

T = pb.BaseCommand


def test_wait_for_exclusive_answers_not_ready_then_ready_in_arrival_order(
    broker: Broker, topic: str
) -> None:
    with RawClient(broker.address) as holder, RawClient(broker.address) as waiting:
        holder.handshake()
        waiting.handshake()
        first = raw_producer(holder, topic, 1, "holder", mode=pb.Exclusive)
        epoch = first.producer_success.topic_epoch
        a = raw_producer(waiting, topic, 1, "wait-a", mode=pb.WaitForExclusive)
        b = raw_producer(waiting, topic, 2, "wait-b", mode=pb.WaitForExclusive)
        for answer in (a, b):
            assert answer.type == T.PRODUCER_SUCCESS
            assert answer.producer_success.producer_ready is False
            assert not answer.producer_success.HasField("topic_epoch")
        # A Shared producer may not jump the queue.
        assert raw_producer(holder, topic, 2, "shared").error.error == pb.ProducerBusy
        holder.close_producer(1)
        ready = waiting.expect(T.PRODUCER_SUCCESS).producer_success
        assert (ready.request_id, ready.producer_ready) == (a.producer_success.request_id, True)
        assert ready.topic_epoch == epoch + 1
        waiting.close_producer(1)
        ready = waiting.expect(T.PRODUCER_SUCCESS).producer_success
        assert (ready.request_id, ready.topic_epoch) == (b.producer_success.request_id, epoch + 2)


def test_a_fenced_producers_sends_in_flight_are_answered_with_errors(
    broker: Broker, topic: str
) -> None:
    with RawClient(broker.address) as old, RawClient(broker.address) as new:
        old.handshake()
        new.handshake()
        raw_producer(old, topic, 1, "old", mode=pb.Exclusive)
        assert old.produce(1, 0, b"kept") == 0
        raw_producer(new, topic, 1, "new", mode=pb.ExclusiveWithFencing)
        for sequence in range(1, 6):
            old.send_raw(old.send_frame(1, sequence, b"late"))
        frames = [old.recv_frame() for _ in range(6)]
        kinds = [f.command.type for f in frames]
        assert kinds[0] == T.CLOSE_PRODUCER
        errors = [f.command.send_error for f in frames[1:]]
        assert [e.sequence_id for e in errors] == [1, 2, 3, 4, 5]
        assert {e.error for e in errors} == {pb.ProducerFenced}
        old.ping()  # the connection itself is fine
        # Its client reconnects with the old epoch: refused, fenced.
        again = raw_producer(old, topic, 1, "old", mode=pb.Exclusive, epoch=0)
        assert again.error.error == pb.ProducerFenced
    stats = broker.topic_stats(topic)
    assert stats is not None
    assert stats["msgInCounter"] == 1


def test_many_racing_for_exclusive_exactly_one_wins(broker: Broker, topic: str) -> None:
    answers: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(12)

    def race(index: int) -> None:
        with RawClient(broker.address) as client:
            client.handshake()
            start.wait(10)
            answer = raw_producer(client, topic, 1, f"racer-{index}", mode=pb.Exclusive)
            if answer.type == T.PRODUCER_SUCCESS:
                client.produce(1, 0, b"winner")
                answer_kind = -1
            else:
                answer_kind = answer.error.error
                # The loser's SENDs have no producer to go to: nothing stored.
            with lock:
                answers.append(answer_kind)
            start_done.wait(10)

    start_done = threading.Barrier(12)
    threads = [threading.Thread(target=race, args=(i,), daemon=True) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(answers) == [-1] + [pb.ProducerFenced] * 11
    stats = broker.topic_stats(topic)
    assert stats is not None
    assert stats["msgInCounter"] == 1


def test_the_topic_epoch_survives_a_restart(tmp_path: Path) -> None:
    topic = "persistent://public/default/epoch-restart"
    settings = {"storage": "disk", "data_dir": str(tmp_path)}
    with Broker(port=0, **settings) as first:
        client = pulsar.Client(first.service_url, operation_timeout_seconds=10)
        for _ in range(3):  # epochs 0, 1, 2
            client.create_producer(topic, access_mode=Mode.Exclusive).close()
        stats = first.topic_stats(topic)
        assert stats is not None
        assert stats["topicEpoch"] == 2
        client.close()
    with Broker(port=0, **settings) as second, RawClient(second.address) as raw:
        raw.handshake()
        stale = raw_producer(raw, topic, 1, "stale", mode=pb.Exclusive, epoch=1)
        assert stale.error.error == pb.ProducerFenced
        fresh = raw_producer(raw, topic, 2, "fresh", mode=pb.Exclusive)
        assert fresh.producer_success.topic_epoch == 3


# Limits (maxProducersPerTopic, maxConsumersPerSubscription, maxConsumersPerTopic).


def test_limits_refuse_the_next_producer_and_consumer() -> None:
    with Broker(
        port=0,
        max_producers_per_topic=2,
        max_consumers_per_subscription=1,
        max_consumers_per_topic=2,
    ) as broker:
        client = pulsar.Client(broker.service_url, operation_timeout_seconds=10)
        topic = "persistent://public/default/limits"
        producers = [client.create_producer(topic) for _ in range(2)]
        with pytest.raises(pulsar.ProducerBusy):
            client.create_producer(topic)
        producers[0].close()
        client.create_producer(topic)  # room again
        shared = pulsar.ConsumerType.Shared
        client.subscribe(topic, "a", consumer_type=shared)
        with pytest.raises(pulsar.ConsumerBusy):
            client.subscribe(topic, "a", consumer_type=shared)
        client.subscribe(topic, "b", consumer_type=shared)
        with pytest.raises(pulsar.ConsumerBusy):
            client.subscribe(topic, "c", consumer_type=shared)
        client.close()


# Strict creation.


def test_missing_topics_are_not_created_when_asked_not_to(broker: Broker) -> None:
    topic = "persistent://public/default/never-created"
    with RawClient(broker.address) as raw:
        raw.handshake()
        raw.send_command(
            T(
                type=T.SUBSCRIBE,
                subscribe=pb.CommandSubscribe(
                    topic=topic,
                    subscription="s",
                    sub_type=pb.CommandSubscribe.Shared,
                    consumer_id=1,
                    request_id=5,
                    force_topic_creation=False,
                ),
            )
        )
        error = raw.expect(T.ERROR).error
        assert (error.request_id, error.error) == (5, pb.TopicNotFound)
    with Broker(port=0, allow_auto_topic_creation=False) as strict:
        client = pulsar.Client(strict.service_url, operation_timeout_seconds=5)
        with pytest.raises(pulsar.TopicNotFound):
            client.create_producer(topic)
        client.close()


def test_an_unknown_schema_type_is_refused_clearly_not_dropped(broker: Broker) -> None:
    # With issue 18's tolerant Schema.type: AutoConsume (21) is refused, the connection kept.
    request = pb.CommandProducer(
        topic="persistent://public/default/schema-kind", producer_id=1, request_id=7
    )
    request.schema.name = "x"
    request.schema.schema_data = b""
    request.schema.type = pb.Schema.String
    blob = T(type=T.PRODUCER, producer=request).SerializeToString()
    at = blob.index(bytes([0x20, pb.Schema.String]))  # Schema.type = 1 -> 21 (AutoConsume)
    blob = blob[:at] + bytes([0x20, 21]) + blob[at + 2 :]
    with RawClient(broker.address) as raw:
        raw.handshake()
        raw.send_raw(struct.pack(">II", len(blob) + 4, len(blob)) + blob)
        answer = raw.recv_frame(5).command
        assert answer.type == T.ERROR, answer
        assert (answer.error.request_id, answer.error.error) == (7, pb.IncompatibleSchema)
        raw.ping()  # the connection stays up


# With the topic operations (issue 12b): what they mean for producers.


def test_terminate_refuses_sends_and_new_producers(
    broker: Broker, client: pulsar.Client, topic: str
) -> None:
    producer = client.create_producer(topic, access_mode=Mode.Exclusive, batching_enabled=False)
    producer.send(b"before")
    broker.terminate_topic(topic)
    with pytest.raises(pulsar.PulsarException):
        producer.send(b"after")  # its reconnect is refused: TopicTerminatedError
    with pytest.raises(pulsar.TopicTerminated):
        client.create_producer(topic)
    stats = broker.topic_stats(topic)
    assert stats is not None
    assert stats["msgInCounter"] == 1
    assert stats["publishers"] == []  # the exclusive holder is gone, not left holding


def test_unload_keeps_the_epoch_and_the_exclusive_producer_reconnects(
    broker: Broker, client: pulsar.Client, topic: str
) -> None:
    producer = client.create_producer(topic, access_mode=Mode.Exclusive, batching_enabled=False)
    producer.send(b"one")
    broker.unload_topic(topic)
    producer.send(b"two")  # reconnected, presenting its epoch: admitted again
    stats = broker.topic_stats(topic)
    assert stats is not None
    assert stats["topicEpoch"] == 0
    assert [p["accessMode"] for p in stats["publishers"]] == ["Exclusive"]
    producer.close()
