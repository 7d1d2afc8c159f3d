"""Batch-index acknowledgement (issue 13): acks of single members of a batch entry.

Pulsar: ``acknowledgmentAtBatchIndexLevelEnabled`` (true in 4.2 and 5.0's broker.conf); the
cursor keeps the ack set (set bit = not acked yet), a redelivery sends the remaining set in
CommandMessage.ack_set and the C++ client skips the members whose bit is clear
(``ConsumerImpl::receiveIndividualMessagesFromBatch``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pulsar
import pytest

from brokerlet import Broker
from brokerlet.dispatch.batch_acks import BatchAckFilter, BatchAcks
from brokerlet.storage.ledger import Entry
from brokerlet.testing.waiting import wait_until
from tests.datarules import drain


def test_ack_sets_and_until_every_member_is_acked() -> None:
    acks = BatchAcks()
    assert acks.apply(7, [0b11100], 5) == 3  # members 0 and 1 acked
    assert acks.words(7) == [0b11100]
    assert acks.apply(7, [0b01111], 5) == 2  # AND: member 4 acked too, 0 and 1 stay acked
    assert acks.remaining(7) == 2
    assert acks.apply(7, [0], 5) == 0
    assert 7 not in acks


@pytest.mark.parametrize(
    ("words", "size"),
    [([0b1, 0b1], 5), ([0b100000], 5), ([-1], 5), ([0b1], 1)],
    ids=["longer than the batch", "bit past the batch", "negative word", "unbatched entry"],
)
def test_bad_ack_sets_are_ignored_and_change_nothing(words: list[int], size: int) -> None:
    acks = BatchAcks()
    acks.apply(3, [0b11110], 5) if size == 5 else None
    before = acks.state()
    assert acks.apply(3, words, size) is None
    assert acks.state() == before


def test_words_round_trip_past_64_members() -> None:
    acks = BatchAcks()
    bits = (1 << 100) - 1 - 0b1  # member 0 acked of 100
    words = [bits & ((1 << 64) - 1), bits >> 64]
    words = [w - (1 << 64) if w >> 63 else w for w in words]
    assert acks.apply(1, words, 100) == 99
    assert acks.words(1) == words


def test_filter_charges_only_unacked_members() -> None:
    acks = BatchAcks()
    acks.apply(2, [0b11000], 5)
    entries = [Entry(0, 1, b"", 0, 5), Entry(0, 2, b"", 0, 5)]
    admitted = BatchAckFilter(acks).admit(entries, replay=True)
    assert [e.num_messages for e in admitted] == [5, 2]


def _wait_unacked(broker: Broker, topic: str, count: int, what: str) -> dict[str, Any]:
    """Wait until the broker counts ``count`` unacked messages on ``sub``: the client groups
    its acks, so they arrive a while after acknowledge() returns."""
    sub: dict[str, Any] = wait_until(
        lambda: broker.topic_stats(topic)["subscriptions"]["sub"],  # type: ignore[index]
        predicate=lambda sub: sub["unackedMessages"] == count,
        message=f"{what} (unackedMessages {count})",
        timeout=5,
    )
    return sub


def _batch(client: pulsar.Client, topic: str, count: int) -> None:
    producer = client.create_producer(
        topic, batching_enabled=True, batching_max_messages=count, batching_max_publish_delay_ms=500
    )
    for i in range(count):
        producer.send_async(f"m{i}".encode(), None)
    producer.flush()
    producer.close()


@pytest.mark.official
@pytest.mark.parametrize("sub_type", [pulsar.ConsumerType.Shared, pulsar.ConsumerType.Exclusive])
def test_a_batch_of_five_with_two_acked_comes_back_as_three(
    broker: Broker, client: pulsar.Client, topic: str, sub_type: pulsar.ConsumerType
) -> None:
    def subscribe() -> pulsar.Consumer:
        return client.subscribe(
            topic,
            "sub",
            consumer_type=sub_type,
            batch_index_ack_enabled=True,
            initial_position=pulsar.InitialPosition.Earliest,
        )

    consumer = subscribe()
    _batch(client, topic, 5)
    got = [consumer.receive(5_000) for _ in range(5)]
    assert [m.data() for m in got] == [f"m{i}".encode() for i in range(5)]
    consumer.acknowledge(got[1])
    consumer.acknowledge(got[3])
    # The acks are grouped by the client: wait until the broker counts them.
    _wait_unacked(broker, topic, 3, "the partial acks")
    consumer.close()
    consumer = subscribe()
    again = [m.data() for m in drain(consumer, wait_ms=1_000, ack=False)]
    assert again == [b"m0", b"m2", b"m4"]
    sub = broker.topic_stats(topic)["subscriptions"]["sub"]  # type: ignore[index]
    assert sub["unackedMessages"] == 3  # the batch counts its three unacked members
    for message_data in again:
        del message_data
    consumer.close()


@pytest.mark.official
def test_cumulative_ack_inside_a_batch_moves_to_the_entry_before_and_keeps_the_rest(
    broker: Broker, client: pulsar.Client, topic: str
) -> None:
    def subscribe() -> pulsar.Consumer:
        return client.subscribe(
            topic,
            "sub",
            batch_index_ack_enabled=True,
            initial_position=pulsar.InitialPosition.Earliest,
        )

    consumer = subscribe()
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"single")
    _batch(client, topic, 5)
    got = [consumer.receive(5_000) for _ in range(6)]
    consumer.acknowledge_cumulative(got[3])  # single, m0, m1, m2
    sub = _wait_unacked(broker, topic, 2, "the cumulative ack")
    assert sub["markDeletePosition"].endswith(":0")  # the entry before the batch
    consumer.close()
    consumer = subscribe()
    again = [m.data() for m in drain(consumer, wait_ms=1_000, ack=False)]
    assert again == [b"m3", b"m4"]


@pytest.mark.official
def test_partial_acks_survive_a_restart_with_the_cursor(tmp_path: Path) -> None:
    topic = "persistent://public/default/batch-acks-restart"

    def subscribe(client: pulsar.Client) -> pulsar.Consumer:
        return client.subscribe(
            topic,
            "sub",
            consumer_type=pulsar.ConsumerType.Shared,
            batch_index_ack_enabled=True,
            initial_position=pulsar.InitialPosition.Earliest,
        )

    with Broker(port=0, storage="disk", data_dir=str(tmp_path)) as running:
        client = pulsar.Client(running.service_url, operation_timeout_seconds=5)
        consumer = subscribe(client)
        _batch(client, topic, 5)
        got = [consumer.receive(5_000) for _ in range(5)]
        consumer.acknowledge(got[0])
        consumer.acknowledge(got[4])
        _wait_unacked(running, topic, 3, "the partial acks")
        client.close()
    with Broker(port=0, storage="disk", data_dir=str(tmp_path)) as running:
        client = pulsar.Client(running.service_url, operation_timeout_seconds=5)
        consumer = subscribe(client)
        again = [m.data() for m in drain(consumer, wait_ms=1_000, ack=False)]
        assert again == [b"m1", b"m2", b"m3"]
        client.close()
