"""Topic compaction and compacted reads (issue 14).

Pulsar: AbstractTwoPhaseCompactor / RawBatchConverter (what is kept), CompactedTopicImpl
(reads up to the horizon from the compacted ledger, then the topic), PersistentTopic
#subscribe (readCompacted only on Exclusive/Failover), ServerCnx#handleGetLastMessageId.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gevent
import pulsar
import pytest

from brokerlet import Broker
from brokerlet.compaction.compactor import compact
from brokerlet.compaction.runner import run_compaction
from brokerlet.compaction.view import VIEW_FILE, CompactedView, CorruptViewError, load_view
from brokerlet.storage import DiskStorage, Entry, MemoryLedger, new_entry
from brokerlet.storage._io import FileOps
from brokerlet.testing.process import BrokerletProcess
from brokerlet.testing.rawclient import RawClient
from brokerlet.testing.waiting import wait_until
from brokerlet.transport.protocol import (
    build_entry,
    crc32c,
    encode_batch,
    pb,
    split_batch,
    unpack_entry,
)
from tests.datarules import admin, broker_factory, client_for, drain, stats

make_broker = pytest.fixture(params=["memory", "disk"])(broker_factory)


# Entries made here (the official client's are checked below).


def single(key: str | None, payload: bytes, *, null: bool = False) -> bytes:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
    if key is not None:
        metadata.partition_key = key
    if null:
        metadata.null_value = True
    return build_entry(metadata, payload)


def batch(members: list[tuple[str | None, bytes]]) -> bytes:
    metadata = pb.MessageMetadata(
        producer_name="p", sequence_id=0, publish_time=1, num_messages_in_batch=len(members)
    )
    singles = []
    for key, payload in members:
        header = pb.SingleMessageMetadata(payload_size=len(payload))
        if key is not None:
            header.partition_key = key
        singles.append((header, payload))
    return build_entry(metadata, encode_batch(singles))


def ledger_of(datas: list[bytes]) -> MemoryLedger:
    ledger = MemoryLedger(7)
    count = [1] * len(datas)
    for index, data in enumerate(datas):
        metadata = unpack_entry(data)[0]
        if metadata.HasField("num_messages_in_batch"):
            count[index] = metadata.num_messages_in_batch
    ledger.append(
        [new_entry(d, crc32c(d), n) for d, n in zip(datas, count, strict=True)], lambda _: None
    )
    return ledger


def reader_of(ledger: MemoryLedger) -> Callable[[int, int], Iterator[Entry]]:
    def read(start: int, stop: int) -> Iterator[Entry]:
        got: list[list[Entry]] = []
        ledger.read(start, stop - start + 1, 0, got.append)
        return iter(got[0])

    return read


def values(view: CompactedView) -> dict[str | None, bytes]:
    latest: dict[str | None, bytes] = {}
    for entry in view.entries:
        metadata, members = unpack_entry(entry.data)
        payload = entry.data[4 + len(metadata.SerializeToString()) :]
        if metadata.HasField("num_messages_in_batch"):
            for header, body in split_batch(payload, metadata.num_messages_in_batch):
                latest[header.partition_key if header.HasField("partition_key") else None] = body
        else:
            latest[members[0].key] = payload
    return latest


def test_compaction_keeps_the_latest_per_key_and_drops_tombstones_and_keyless() -> None:
    ledger = ledger_of(
        [
            single("a", b"a1"),
            single("b", b"b1"),
            batch([("a", b"a2"), ("c", b"c1"), (None, b"free"), ("b", b"b2")]),
            single("c", b"", null=True),  # tombstone: c goes
            single(None, b"keyless"),
            single("d", b"d1"),
            single("d", b""),  # empty payload is a tombstone too
        ]
    )
    result = compact(None, reader_of(ledger), 7, ledger.last_entry_id)
    assert values(result.view) == {"a": b"a2", "b": b"b2"}
    assert [e.entry_id for e in result.view.entries] == [2]  # original ids
    assert result.view.horizon == 6
    assert result.removed == 10 - 2
    # topicCompactionRetainNullKey=true keeps keyless messages (not tombstones).
    kept = compact(None, reader_of(ledger), 7, 6, retain_null_key=True)
    assert values(kept.view) == {"a": b"a2", "b": b"b2", None: b"keyless"}


def test_a_second_compaction_builds_on_the_previous_view() -> None:
    ledger = ledger_of([single("a", b"a1"), single("b", b"b1")])
    first = compact(None, reader_of(ledger), 7, 1).view
    ledger.append(
        [new_entry(d, crc32c(d), 1) for d in (single("a", b"a2"), single("b", b""))], print
    )
    ledger.trim(10)  # retention cannot drop the open chunk; pretend nothing of 0..1 is read
    second = compact(first, reader_of(ledger), 7, 3).view
    assert values(second) == {"a": b"a2"}
    assert second.horizon == 3


def test_the_view_file_round_trips_and_detects_damage(tmp_path: Path) -> None:
    ledger = ledger_of([single("a", b"a1"), batch([("b", b"b1"), ("c", b"c1")])])
    view = compact(None, reader_of(ledger), 7, 1).view
    restored = CompactedView.decode(view.encode(), 7)
    assert restored.horizon == 1
    assert restored.entries == view.entries
    damaged = bytearray(view.encode())
    damaged[30] ^= 0xFF
    with pytest.raises(CorruptViewError):
        CompactedView.decode(bytes(damaged), 7)


class CrashingOps(FileOps):
    """Kills the compaction's file step: raises on the sync of the new view file."""

    def __init__(self) -> None:
        self.armed = False

    def sync(self, fd: int) -> None:
        if self.armed:
            raise OSError(5, "killed before the view file was synced")
        super().sync(fd)


def test_an_interrupted_compaction_leaves_the_previous_view_intact(tmp_path: Path) -> None:
    ops = CrashingOps()
    ledger = ledger_of([single("a", b"a1"), single("b", b"b1")])
    run_compaction(ledger, None, retain_null_key=False, directory=str(tmp_path), file_ops=ops)
    before = (tmp_path / VIEW_FILE).read_bytes()
    previous = load_view(str(tmp_path), 7)
    assert previous is not None
    ledger.append([new_entry(single("a", b"a2"), 0, 1)], lambda _: None)

    # Killed in phase one / two (a read fails): nothing is written. A wrapper, not a
    # subclass: MemoryLedger is compiled (brokerlet/_compiled.py).
    class Failing:
        def __init__(self, ledger: MemoryLedger) -> None:
            self._ledger = ledger

        def __getattr__(self, name: str) -> Any:
            return getattr(self._ledger, name)

        def read(self, *args: object, **kwargs: object) -> None:
            raise RuntimeError("storage step killed")

    broken = Failing(ledger_of([single("a", b"a1"), single("b", b"b1"), single("a", b"a3")]))
    with pytest.raises(RuntimeError):
        run_compaction(broken, previous, retain_null_key=False, directory=str(tmp_path))  # type: ignore[arg-type]
    assert (tmp_path / VIEW_FILE).read_bytes() == before
    # Killed between writing the new file and renaming it over the old one.
    ops.armed = True
    with pytest.raises(OSError, match="killed"):
        run_compaction(
            ledger, previous, retain_null_key=False, directory=str(tmp_path), file_ops=ops
        )
    assert (tmp_path / VIEW_FILE).read_bytes() == before
    reloaded = load_view(str(tmp_path), 7)
    assert reloaded is not None
    assert values(reloaded) == {"a": b"a1", "b": b"b1"}
    ops.armed = False
    run_compaction(ledger, previous, retain_null_key=False, directory=str(tmp_path), file_ops=ops)
    after = load_view(str(tmp_path), 7)
    assert after is not None
    assert values(after) == {"a": b"a2", "b": b"b1"}


# The official client's batches, read by the codec.


def test_the_codec_reads_the_official_clients_batches(tmp_path: Path) -> None:
    topic = "persistent://public/default/client-batches"
    broker = Broker(port=0, storage="disk", data_dir=str(tmp_path / "data"))
    broker.start()
    client = client_for(broker)
    try:
        producer = client.create_producer(
            topic, batching_enabled=True, batching_max_messages=5, batching_max_publish_delay_ms=50
        )
        for index in range(10):
            producer.send_async(f"v{index}".encode(), None, partition_key=f"k{index % 3}")
        producer.send_async(b"", None, partition_key="gone")
        producer.flush()
    finally:
        client.close()
        broker.stop()
    storage = DiskStorage(tmp_path / "data", min_free_bytes=0)
    try:
        ledger, _ = storage.open_topic(topic)
        result: gevent.event.AsyncResult = gevent.event.AsyncResult()
        ledger.read(0, 100, 0, result.set)
        entries = result.get(timeout=10)
    finally:
        storage.close()
    members = [m for e in entries for m in unpack_entry(e.data)[1]]
    assert [m.key for m in members] == [f"k{i % 3}" for i in range(10)] + ["gone"]
    assert [m.index for m in members][:5] == [0, 1, 2, 3, 4]
    assert [m.tombstone for m in members] == [False] * 10 + [True]


# Through the broker with the official client.


def compact_now(broker: Broker, topic: str) -> None:
    path = f"persistent/{topic.removeprefix('persistent://')}/compaction"
    assert admin(broker, "PUT", path).status_code == 204
    wait_until(
        lambda: admin(broker, "GET", path).json()["status"],
        predicate=lambda value: value != "RUNNING",
        message="compaction",
    )
    assert admin(broker, "GET", path).json() == {"status": "SUCCESS", "lastError": ""}


def produce_keyed(client: pulsar.Client, topic: str) -> dict[str, bytes]:
    """Batched and unbatched keyed messages with tombstones; the expected latest values."""
    plain = client.create_producer(topic, batching_enabled=False)
    batched = client.create_producer(
        topic, batching_enabled=True, batching_max_messages=8, batching_max_publish_delay_ms=20
    )
    expected: dict[str, bytes] = {}
    for index in range(40):
        key, value = f"k{index % 6}", f"plain-{index}".encode().ljust(200, b".")
        plain.send(value, partition_key=key)
        expected[key] = value
    for index in range(40):
        key, value = f"k{index % 9}", f"batched-{index}".encode().ljust(200, b".")
        batched.send_async(value, None, partition_key=key)
        expected[key] = value
    batched.flush()
    plain.send(b"", partition_key="k1")  # tombstones
    expected.pop("k1")
    batched.send_async(b"", None, partition_key="k7")
    batched.flush()
    expected.pop("k7")
    plain.send(b"no key at all")  # dropped by compaction, as Pulsar does by default
    return expected


def read_compacted(client: pulsar.Client, topic: str) -> dict[str, bytes]:
    reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
    latest: dict[str, bytes] = {}
    try:
        while reader.has_message_available():
            message = reader.read_next(5000)
            if message.data():
                latest[message.partition_key()] = message.data()
            else:
                latest.pop(message.partition_key(), None)
    finally:
        reader.close()
    return latest


def table_view(client: pulsar.Client, topic: str) -> dict[str, bytes]:
    view = client.create_table_view(topic)
    try:
        seen: dict[str, bytes] = {}
        view.for_each(seen.__setitem__)
        return seen
    finally:
        view.close()


def test_compacted_reader_and_table_view_see_the_latest_value_per_key(
    make_broker: Callable[..., Broker],
) -> None:
    broker = make_broker(segment_bytes=4096)
    topic = "persistent://public/default/compacted-reads"
    client = client_for(broker)
    try:
        sub = client.subscribe(topic, "all", initial_position=pulsar.InitialPosition.Earliest)
        expected = produce_keyed(client, topic)
        compact_now(broker, topic)
        reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        got = []
        while reader.has_message_available():
            got.append(reader.read_next(5000))
        reader.close()
        assert {m.partition_key(): m.data() for m in got} == expected
        assert len(got) == len(expected)  # one message per key, nothing else
        assert table_view(client, topic) == expected
        # Messages after the horizon are read from the topic itself.
        after = client.create_producer(topic, batching_enabled=False)
        after.send(b"newest", partition_key="k0")
        after.send(b"", partition_key="k2")
        expected["k0"] = b"newest"
        expected.pop("k2")
        assert read_compacted(client, topic) == expected
        assert table_view(client, topic) == expected
        # Retention trims the raw topic once consumed; the compacted view stays.
        assert len(drain(sub)) == 83 + 2
        wait_until(
            lambda: stats(broker, topic)["firstEntryId"],
            predicate=lambda value: value > 20,
            message="retention of the raw topic",
        )
        compact_now(broker, topic)
        assert table_view(client, topic) == expected
        assert stats(broker, topic)["compaction"]["lastCompactionSucceedTimestamp"] > 0
    finally:
        client.close()


def test_read_compacted_is_refused_on_shared_subscriptions(
    make_broker: Callable[..., Broker],
) -> None:
    # The official client refuses the combination itself (InvalidConfiguration); a client
    # that sends it gets Pulsar's NotAllowedError.
    broker = make_broker()
    with RawClient(broker.address) as raw:
        raw.handshake()
        raw.send_command(
            pb.BaseCommand(
                type=pb.BaseCommand.SUBSCRIBE,
                subscribe=pb.CommandSubscribe(
                    topic="persistent://public/default/no-shared-compacted",
                    subscription="s",
                    sub_type=pb.CommandSubscribe.Shared,
                    consumer_id=1,
                    request_id=77,
                    read_compacted=True,
                ),
            )
        )
        error = raw.expect(pb.BaseCommand.ERROR).error
        assert error.error == pb.NotAllowedError
        assert "readCompacted only allowed on failover or exclusive" in error.message


def test_compaction_status_and_errors_over_rest(make_broker: Callable[..., Broker]) -> None:
    broker = make_broker()
    assert (
        admin(broker, "GET", "persistent/public/default/never-made/compaction").status_code == 404
    )
    client = client_for(broker)
    try:
        topic = "persistent://public/default/status"
        client.create_producer(topic).send(b"x", partition_key="k")
        path = "persistent/public/default/status/compaction"
        assert admin(broker, "GET", path).json() == {"status": "NOT_RUN", "lastError": ""}
        compact_now(broker, topic)
    finally:
        client.close()


def test_the_threshold_triggers_compaction(make_broker: Callable[..., Broker]) -> None:
    broker = make_broker(broker_service_compaction_monitor_interval_in_seconds=0.05)
    assert (
        admin(broker, "PUT", "namespaces/public/default/compactionThreshold", 1000).status_code
        == 204
    )
    assert admin(broker, "GET", "namespaces/public/default/compactionThreshold").json() == 1000
    topic = "persistent://public/default/threshold"
    client = client_for(broker)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        for index in range(50):
            producer.send(b"x" * 100, partition_key=f"k{index % 4}")
        path = "persistent/public/default/threshold/compaction"
        wait_until(
            lambda: admin(broker, "GET", path).json()["status"],
            predicate=lambda value: value == "SUCCESS",
            message="auto compaction",
        )
        assert len(read_compacted(client, topic)) == 4
    finally:
        client.close()


# A real crash of `brokerlet serve` while compactions run.


def test_compaction_survives_sigkill_mid_way(tmp_path: Path) -> None:
    topic = "persistent://public/default/killed"
    latest: dict[str, bytes] = {}
    compacting = (
        "--broker-service-compaction-threshold-in-bytes",
        "1",
        "--broker-service-compaction-monitor-interval-in-seconds",
        "0.02",
    )
    with BrokerletProcess(compacting, data_dir=tmp_path) as broker:
        broker.start()
        client = pulsar.Client(broker.service_url, operation_timeout_seconds=5)
        producer = client.create_producer(topic, batching_enabled=False)
        end = time.monotonic() + 1.5
        index = 0
        while time.monotonic() < end:  # compactions keep starting while this runs
            key, value = f"k{index % 50}", f"v{index}".encode()
            producer.send(value, partition_key=key)
            latest[key] = value
            index += 1
        broker.kill()  # SIGKILL
        # The client may already be reconnecting to the dead broker: closing then fails.
        with contextlib.suppress(pulsar.NotConnected):
            client.close()
    assert (tmp_path / "topics").exists()
    with BrokerletProcess(data_dir=tmp_path) as broker:
        broker.start()
        client = pulsar.Client(broker.service_url, operation_timeout_seconds=5)
        assert read_compacted(client, topic) == latest
        client.close()


def test_a_running_compaction_keeps_its_topic_open(tmp_path: Path) -> None:
    # The idle-topic check closes disk topics without clients; a compaction in progress
    # must hold its topic open, or its status (and outcome) would be lost on the way.
    broker = Broker(
        port=0,
        storage="disk",
        data_dir=str(tmp_path / "data"),
        inactive_topic_close_interval_seconds=1,
        compaction_cpu_share=0.02,  # slow enough to span several idle checks
    )
    broker.start()
    topic = "persistent://public/default/idle-while-compacting"
    client = client_for(broker)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        for index in range(3000):
            producer.send_async(f"v{index}".encode(), None, partition_key=f"k{index % 10}")
        producer.flush()
        producer.close()
        path = "persistent/public/default/idle-while-compacting/compaction"
        assert admin(broker, "PUT", path).status_code == 204
        assert admin(broker, "GET", path).json()["status"] == "RUNNING"
        wait_until(
            lambda: admin(broker, "GET", path).json()["status"],
            predicate=lambda value: value != "RUNNING",
            message="end",
            timeout=30,
        )
        assert admin(broker, "GET", path).json() == {"status": "SUCCESS", "lastError": ""}
        assert len(read_compacted(client, topic)) == 10
    finally:
        client.close()
        broker.stop()
