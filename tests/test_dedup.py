"""Message deduplication: the state machine (Pulsar's MessageDeduplication), on the wire with
raw frames, and with the official client across reconnects, restarts and a SIGKILL."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any
from unittest import mock

import pulsar
import pytest
import requests
from hypothesis import example, given, settings
from hypothesis import strategies as st

from brokerlet import Broker
from brokerlet.actors.connection import SEND_SLICE
from brokerlet.actors.messages import AddProducer, AppendItem, Receipt
from brokerlet.config import load_settings
from brokerlet.producers import hooks
from brokerlet.producers.dedup import Deduplication, Verdict
from brokerlet.producers.state import may_be_chunked
from brokerlet.storage import MemoryLedger, new_entry
from brokerlet.testing.process import BrokerletProcess
from brokerlet.testing.rawclient import ConnectionClosed, RawClient
from brokerlet.testing.waiting import wait_until
from brokerlet.transport.protocol import build_entry, pb
from tests.datarules import drain
from tests.producer_frames import raw_producer, send_frame

T = pb.BaseCommand
NO_ID = 2**64 - 1


# The state machine.


def test_repeats_are_duplicates_once_stored_and_unknown_while_in_flight() -> None:
    dedup = Deduplication()
    assert dedup.check("p", 0, 0) is Verdict.NEW
    assert dedup.check("p", 0, 0) is Verdict.UNKNOWN  # pushed, not yet stored
    dedup.stored("p", 0)
    assert dedup.check("p", 0, 0) is Verdict.DUPLICATE
    assert dedup.check("p", 1_000_000, 1_000_000) is Verdict.NEW  # a gap is fine
    assert dedup.last_sequence_id("p") == 1_000_000
    assert dedup.check("other", 0, 0) is Verdict.NEW  # per producer name


def test_a_batch_counts_by_its_highest_sequence_id() -> None:
    dedup = Deduplication()
    assert dedup.check("p", 0, 9) is Verdict.NEW
    dedup.stored("p", 9)
    assert dedup.check("p", 5, 5) is Verdict.DUPLICATE
    assert dedup.check("p", 10, 19) is Verdict.NEW


def test_a_failed_write_lets_the_resend_in() -> None:
    dedup = Deduplication()
    dedup.check("p", 0, 0)
    dedup.stored("p", 0)
    assert dedup.check("p", 1, 1) is Verdict.NEW
    dedup.failed("p")
    assert dedup.check("p", 1, 1) is Verdict.NEW


def test_only_the_last_chunk_completes_a_chunked_message() -> None:
    dedup = Deduplication()
    assert dedup.check("p", 7, 7, last_chunk=False) is Verdict.NEW
    assert dedup.check("p", 7, 7, last_chunk=False) is Verdict.NEW  # not complete yet
    assert dedup.check("p", 7, 7) is Verdict.NEW
    dedup.stored("p", 7)
    assert dedup.check("p", 7, 7, last_chunk=False) is Verdict.DUPLICATE


def test_sequence_ids_above_2_63_are_negative_as_java_longs() -> None:
    # Pulsar reads the uint64 as a long: a wrapped id is below any stored one.
    dedup = Deduplication()
    dedup.check("p", 5, 5)
    dedup.stored("p", 5)
    assert dedup.check("p", 2**64 - 1, 2**64 - 1) is Verdict.DUPLICATE
    fresh = Deduplication()
    assert fresh.check("q", 2**64 - 3, 2**64 - 3) is Verdict.NEW  # no state yet: accepted
    fresh.stored("q", 2**64 - 3)
    assert fresh.last_sequence_id("q") == -3


def test_the_chunk_scan_finds_chunks_in_the_metadata_only() -> None:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1)
    assert not may_be_chunked(build_entry(metadata, b"\xd8\x01"))  # the tag in a payload
    metadata.num_chunks_from_msg = 3
    metadata.chunk_id = 1
    assert may_be_chunked(build_entry(metadata, b"x"))


_ITEMS = st.lists(
    st.tuples(
        st.integers(0, 8) | st.just(2**64 - 2),  # sequence_id; a wrapped one now and then
        st.integers(0, 3),  # highest_sequence_id above it by this (0: not set)
        st.integers(1, 3),  # messages in the entry
        st.sampled_from(["whole"] * 6 + ["refused", "first chunk", "last chunk"]),
    ),
    min_size=1,
    max_size=6,
)


def _item(sequence_id: int, above: int, messages: int, kind: str) -> AppendItem:
    if kind == "refused":
        return (sequence_id, sequence_id, None, (pb.NotAllowedError, "refused"))
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=sequence_id, publish_time=1)
    if kind.endswith("chunk"):
        metadata.num_chunks_from_msg = 2
        metadata.chunk_id = 1 if kind == "last chunk" else 0
    highest = sequence_id + above if above else 0
    return (sequence_id, highest, new_entry(build_entry(metadata, b"x"), 0, messages), None)


def _screen_all(appends: list[tuple[list[Any], bool]], *, runs: bool) -> list[Any]:
    producers = hooks.TopicProducers(
        "t", MemoryLedger(1), load_settings(env={}), None, True, receipt=Receipt
    )
    producers.start()
    producers.add(AddProducer("p", "peer", None, 1))
    seen: list[Any] = []
    last_entry = -1
    for specs, stored in appends:
        items = [_item(*spec) for spec in specs]
        if runs:
            decided, screened = producers.screen(None, 1, items)
        else:
            with mock.patch.object(hooks, "_ascending_run", return_value=None):
                decided, screened = producers.screen(None, 1, items)
        seen.append(sorted((i, r.entry_id, r.error) for i, r in decided.items()))
        assert screened is not None
        last_entry += len(items)
        result = last_entry if stored else OSError("disk full")
        producers.appended(screened, items, decided, result, last_entry)
        dedup = producers.dedup
        assert dedup is not None
        seen.append((dict(dedup.pushed), dict(dedup.persisted)))
    return seen


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_ITEMS, st.booleans()), max_size=6))
@example([([(0, 0, 1, "whole")], True), ([(0, 0, 1, "whole")], True)])  # a stored one again
@example([([(3, 0, 1, "whole")], False), ([(3, 1, 1, "whole")], True)])  # after a failed write
@example([([(5, 2, 1, "whole"), (6, 0, 1, "whole")], True)])  # inside the batch before
def test_a_run_of_new_sends_is_screened_as_one_with_the_same_verdicts(
    appends: list[tuple[list[Any], bool]],
) -> None:
    # TopicProducers.screen takes an Append whose SENDs are whole and ascending in one
    # Deduplication.check_run; every verdict and the state after must be what checking
    # them one by one gives (MessageDeduplication.isDuplicate per message in Pulsar).
    assert _screen_all(appends, runs=True) == _screen_all(appends, runs=False)


def test_state_is_bounded_and_inactive_producers_are_dropped() -> None:
    now = [0.0]
    dedup = Deduplication(max_producers=2, inactivity_seconds=60, clock=lambda: now[0])
    for name in ("a", "b", "c"):
        dedup.connect(name)
        dedup.check(name, 1, 1)
        dedup.stored(name, 1)
        if name != "c":
            dedup.disconnect(name)
    assert sorted(dedup.persisted) == ["b", "c"]  # a: least recently active, disconnected
    now[0] = 59
    assert dedup.purge_inactive() == []
    now[0] = 61
    assert dedup.purge_inactive() == ["b"]
    assert dedup.last_sequence_id("b") == -1
    assert dedup.last_sequence_id("c") == 1  # connected: kept


def test_snapshot_and_restore_round_trip() -> None:
    dedup = Deduplication()
    dedup.check("p", 3, 3)
    dedup.stored("p", 3)
    snapshot = dedup.snapshot(41)
    again = Deduplication()
    assert again.restore(snapshot) == 41
    assert again.check("p", 3, 3) is Verdict.DUPLICATE
    assert again.last_sequence_id("p") == 3


# On the wire.


@pytest.fixture(scope="module")
def broker() -> object:
    with Broker(port=0, broker_deduplication_enabled=True) as running:
        yield running


def test_receipts_keep_the_send_order_across_stored_and_answered_runs(
    broker: Broker, topic: str
) -> None:
    # One chunk of SENDs, split by the connection into slices of SEND_SLICE, each an Append:
    # the middle one holds a repeat, so the topic answers it receipt by receipt (Appended),
    # between two runs it answers as stored (AppendedAll). The client must get the receipts
    # in SEND order whichever way each run was answered.
    with RawClient(broker.address) as client:
        client.handshake()
        raw_producer(client, topic, 1, "order")
        sequences = [*range(SEND_SLICE), 10, *range(SEND_SLICE, 2 * SEND_SLICE + 20)]
        client.send_raw(b"".join(client.send_frame(1, s, b"m") for s in sequences))
        receipts = [client.expect(T.SEND_RECEIPT).send_receipt for _ in sequences]
    assert [r.sequence_id for r in receipts] == sequences
    entry_ids = [r.message_id.entry_id for r in receipts]
    assert entry_ids[SEND_SLICE] == NO_ID  # the repeat: answered, not stored
    stored = entry_ids[:SEND_SLICE] + entry_ids[SEND_SLICE + 1 :]
    assert stored == list(range(len(sequences) - 1))


def test_a_repeated_send_gets_the_minus_one_receipt_and_is_not_stored(
    broker: Broker, topic: str
) -> None:
    with RawClient(broker.address) as client:
        client.handshake()
        answer = raw_producer(client, topic, 1, "dup-wire")
        assert answer.producer_success.last_sequence_id == -1
        assert client.produce(1, 0, b"a") == 0
        assert client.produce(1, 1, b"b") == 1
        client.send_raw(client.send_frame(1, 1, b"b again"))
        receipt = client.expect(T.SEND_RECEIPT).send_receipt
        assert receipt.sequence_id == 1
        assert (receipt.message_id.ledger_id, receipt.message_id.entry_id) == (NO_ID, NO_ID)
        assert client.produce(1, 50, b"gap") == 2  # far above the last: accepted
        client.close_producer(1)
        again = raw_producer(client, topic, 2, "dup-wire")
        assert again.producer_success.last_sequence_id == 50
    stats = broker.topic_stats(topic)
    assert stats is not None
    assert stats["msgInCounter"] == 3
    assert stats["deduplicationStatus"] == "Enabled"


def test_chunks_of_a_stored_message_are_duplicates(broker: Broker, topic: str) -> None:
    with RawClient(broker.address) as client:
        client.handshake()
        raw_producer(client, topic, 1, "chunky")
        for chunk in range(3):
            client.send_raw(
                send_frame(1, "chunky", 4, b"c%d" % chunk, num_chunks_from_msg=3, chunk_id=chunk)
            )
            assert client.expect(T.SEND_RECEIPT).send_receipt.message_id.entry_id == chunk
        client.send_raw(send_frame(1, "chunky", 4, b"c0", num_chunks_from_msg=3, chunk_id=0))
        assert client.expect(T.SEND_RECEIPT).send_receipt.message_id.entry_id == NO_ID


# With the official client.


def test_resending_stores_nothing_new_and_last_sequence_id_follows(
    broker: Broker, client: pulsar.Client, topic: str
) -> None:
    producer = client.create_producer(topic, producer_name="resender", batching_enabled=False)
    assert producer.last_sequence_id() == -1
    for sequence in range(10):
        producer.send(b"m%d" % sequence, sequence_id=sequence)
    producer.close()
    producer = client.create_producer(topic, producer_name="resender", batching_enabled=False)
    assert producer.last_sequence_id() == 9
    for sequence in range(5, 10):
        producer.send(b"m%d" % sequence, sequence_id=sequence)  # answered, not stored
    producer.send(b"m10", sequence_id=10)
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    got = [m.data() for m in drain(consumer, wait_ms=500, ack=False)]
    assert got == [b"m%d" % i for i in range(11)]
    producer.close()


def test_last_sequence_id_and_dedup_survive_a_restart(tmp_path: Path) -> None:
    topic = "persistent://public/default/dedup-restart"
    settings = {"storage": "disk", "data_dir": str(tmp_path), "broker_deduplication_enabled": True}
    with Broker(port=0, **settings) as first:
        client = pulsar.Client(first.service_url, operation_timeout_seconds=10)
        producer = client.create_producer(topic, producer_name="keeper", batching_enabled=True)
        for sequence in range(20):
            producer.send_async(b"m%d" % sequence, None)
        producer.flush()
        client.close()
    with Broker(port=0, **settings) as second:
        client = pulsar.Client(second.service_url, operation_timeout_seconds=10)
        producer = client.create_producer(topic, producer_name="keeper", batching_enabled=False)
        assert producer.last_sequence_id() == 19
        for sequence in range(15, 20):
            producer.send(b"m%d" % sequence, sequence_id=sequence)
        consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        got = [m.data() for m in drain(consumer, wait_ms=500, ack=False)]
        assert got == [b"m%d" % i for i in range(20)]
        client.close()


# A SIGKILL under load, producers resending after it.


DEDUP = ("--broker-deduplication-enabled", "true")
KILL_TOPIC = "persistent://public/default/dedup-kill"


def produce_until_killed(address: tuple[str, int], name: str, receipted: list[int]) -> None:
    try:
        with RawClient(address, timeout=5) as client:
            client.handshake()
            raw_producer(client, KILL_TOPIC, 1, name)
            for sequence in range(100_000):
                client.produce(1, sequence, f"{name}-{sequence}".encode())
                receipted.append(sequence)
    except (ConnectionClosed, OSError, TimeoutError):
        return


def test_sigkill_with_dedup_loses_nothing_receipted_and_stores_no_resend(tmp_path: Path) -> None:
    names = ["k0", "k1", "k2"]
    receipted: dict[str, list[int]] = {name: [] for name in names}
    with BrokerletProcess(DEDUP, data_dir=tmp_path) as broker:
        broker.start()
        threads = [
            threading.Thread(target=produce_until_killed, args=(broker.address, n, receipted[n]))
            for n in names
        ]
        for thread in threads:
            thread.start()
        try:
            wait_until(
                lambda: [len(receipts) for receipts in receipted.values()],
                predicate=lambda counts: min(counts) >= 300,
                message="300 receipts for every producer",
                timeout=20,
                interval=0.01,
            )
        finally:
            broker.kill()  # SIGKILL
            for thread in threads:
                thread.join(10)

    with BrokerletProcess(DEDUP, data_dir=tmp_path) as broker:
        broker.start()
        with RawClient(broker.address, timeout=10) as client:
            client.handshake()
            for index, name in enumerate(names, start=1):
                answer = raw_producer(client, KILL_TOPIC, index, name)
                last = answer.producer_success.last_sequence_id
                assert last >= receipted[name][-1], (name, last, receipted[name][-1])
                # Resend everything, as a client whose receipts were lost would.
                upto = receipted[name][-1] + 1
                for sequence in range(upto + 1):
                    client.send_raw(
                        client.send_frame(index, sequence, f"{name}-{sequence}".encode())
                    )
                for _ in range(upto + 1):
                    client.expect(T.SEND_RECEIPT)
            client.subscribe(KILL_TOPIC, "check", 99, initial_position=pb.CommandSubscribe.Earliest)
            stats_total = sum(len(receipted[n]) for n in names)
            client.flow(99, 100_000)
            payloads: list[bytes] = []
            while True:
                try:
                    payloads.extend(m.payload for m in client.receive(99, 1, timeout=1.0))
                except TimeoutError:
                    break
        broker.kill()
    assert len(payloads) == len(set(payloads)), "a resent message was stored twice"
    for name in names:
        stored = {p for p in payloads if p.startswith(f"{name}-".encode())}
        missing = [s for s in receipted[name] if f"{name}-{s}".encode() not in stored]
        assert not missing, f"{name}: receipted but lost: {missing[:5]}"
        expected = {f"{name}-{s}".encode() for s in range(receipted[name][-1] + 2)}
        assert stored == expected, f"{name}: stored {len(stored)} of {len(expected)}"
    assert len(payloads) >= stats_total


def test_the_namespace_policy_turns_dedup_on_and_off_for_a_broker_without_it() -> None:
    with Broker(port=0) as plain:  # brokerDeduplicationEnabled=false
        assert plain.web_service_url is not None
        base = plain.web_service_url + "/admin/v2"
        put = requests.put(base + "/tenants/t15", json={"allowedClusters": ["standalone"]})
        assert put.status_code == 204
        assert requests.put(base + "/namespaces/t15/ns").status_code == 204
        topic = "persistent://t15/ns/policy"
        with RawClient(plain.address) as client:
            client.handshake()
            raw_producer(client, topic, 1, "p")
            client.produce(1, 0, b"a")
            assert client.produce(1, 0, b"a twice, kept: dedup is off") == 1
            on = requests.post(base + "/namespaces/t15/ns/deduplication", json=True)
            assert on.status_code == 204
            # The topic learns the policy as the next producer arrives (as a lookup would).
            raw_producer(client, topic, 2, "q")
            client.send_raw(client.send_frame(1, 0, b"a thrice"))
            receipt = client.expect(T.SEND_RECEIPT).send_receipt
            assert receipt.message_id.entry_id == NO_ID
            off = requests.post(base + "/namespaces/t15/ns/deduplication", json=False)
            assert off.status_code == 204
            raw_producer(client, topic, 3, "r")
            assert client.produce(1, 0, b"a again, kept") == 2
        stats = plain.topic_stats(topic)
        assert stats is not None
        assert stats["deduplicationStatus"] == "Disabled"
