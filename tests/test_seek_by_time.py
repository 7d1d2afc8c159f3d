"""Seek and reset by publish time, and where a reader's seek by id lands (issue 13).

Pulsar: ``PersistentSubscription.resetCursor(timestamp)`` positions at the first entry
published at or after the time (``PersistentMessageFinder``, a search of the ledger), the
consumers are disconnected and resubscribe; ``start_message_rollback_duration_sec`` on a
reader's SUBSCRIBE does the same from ``now - duration``. A seek by id resets the broker to
the entry; the client (C++ ``ConsumerImpl``, its start-message-id filter) drops messages
before the seek id, and the seek id itself unless the reader is inclusive.
"""

from __future__ import annotations

import time
from pathlib import Path

import pulsar
import pytest

from brokerlet import Broker
from brokerlet.storage.ledger import Entry, MemoryLedger, new_entry
from brokerlet.storage.time_search import PublishTimeSearch
from brokerlet.testing.rawclient import RawClient
from brokerlet.transport.protocol import build_entry, pb, publish_time

T = pb.BaseCommand


def _ledger(times: list[int]) -> MemoryLedger:
    ledger = MemoryLedger(7)
    entries = []
    for i, at in enumerate(times):
        data = build_entry(
            pb.MessageMetadata(producer_name="p", sequence_id=i, publish_time=at), b""
        )
        entries.append(new_entry(data, 0, 1))
    ledger.append(entries, lambda _first: None)
    return ledger


def _search(ledger: MemoryLedger, target: int) -> tuple[int, int]:
    search = PublishTimeSearch(ledger.first_entry_id, ledger.last_entry_id, target, publish_time)
    while (probe := search.probe()) is not None:
        got: list[Entry] = []
        ledger.read_ids([probe], got.extend)  # type: ignore[arg-type]
        search.observe(probe, got)
    return search.result, search.probes


def test_search_finds_first_at_or_after_and_clamps_to_start_and_end() -> None:
    ledger = _ledger([10, 20, 20, 20, 30, 40])
    assert _search(ledger, 20)[0] == 1  # the first of equal times
    assert _search(ledger, 21)[0] == 4
    assert _search(ledger, 5)[0] == 0  # before the range: the start
    assert _search(ledger, 41)[0] == 6  # after it: the end
    assert _search(_ledger([]), 5)[0] == 0


def test_search_of_a_million_entries_reads_about_twenty() -> None:
    ledger = _ledger(list(range(1_000_000)))
    entry_id, probes = _search(ledger, 654_321)
    assert entry_id == 654_321
    assert probes <= 21


def _send_spread(producer: pulsar.Producer, count: int) -> list[pulsar.MessageId]:
    """Send ``count`` messages, each in a later millisecond than the one before."""
    ids = []
    last = 0
    for i in range(count):
        deadline = time.monotonic() + 1
        while int(time.time() * 1000) <= last + 1 and time.monotonic() < deadline:
            pass  # a bounded spin to the next millisecond, so publish times differ
        last = int(time.time() * 1000)
        ids.append(producer.send(f"m{i}".encode()))
    return ids


def _keep_backlog(client: pulsar.Client, topic: str) -> None:
    """A subscription that never acknowledges, so seeking back finds the entries: brokerlet
    deletes what every subscription has acknowledged at once (a seek moves the mark-delete
    too), where Pulsar keeps it until its ledger rolls over (retention is issue 14's part)."""
    client.subscribe(topic, "keeper", initial_position=pulsar.InitialPosition.Earliest).close()


def _next_data(consumer: pulsar.Consumer | pulsar.Reader, timeout_ms: int = 5_000) -> bytes:
    if isinstance(consumer, pulsar.Reader):
        return consumer.read_next(timeout_ms).data()
    message = consumer.receive(timeout_ms)
    consumer.acknowledge(message)
    return message.data()


@pytest.mark.official
def test_consumer_seek_by_time_lands_on_the_first_message_at_or_after(
    client: pulsar.Client, topic: str
) -> None:
    _keep_backlog(client, topic)
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    _send_spread(producer, 8)
    times = []
    for _ in range(8):
        message = consumer.receive(5_000)
        times.append(message.publish_timestamp())
        consumer.acknowledge(message)
    consumer.seek(times[5])
    assert _next_data(consumer) == b"m5"
    consumer.seek(times[2] + 1)  # between m2 and m3
    assert _next_data(consumer) == b"m3"
    consumer.seek(times[0] - 60_000)  # before the first: the start
    assert _next_data(consumer) == b"m0"
    consumer.seek(times[-1] + 60_000)  # after the last: the end
    producer.send(b"new")
    assert _next_data(consumer) == b"new"


@pytest.mark.official
def test_reader_seek_by_time(client: pulsar.Client, topic: str) -> None:
    _keep_backlog(client, topic)
    producer = client.create_producer(topic, batching_enabled=False)
    _send_spread(producer, 6)
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    times = [reader.read_next(5_000).publish_timestamp() for _ in range(6)]
    reader.seek(times[4])
    assert _next_data(reader) == b"m4"
    reader.seek(times[1])
    assert _next_data(reader) == b"m1"


def test_rollback_duration_starts_a_reader_that_far_back(broker: Broker, topic: str) -> None:
    with RawClient(broker.address, timeout=5) as raw:
        raw.handshake()
        raw.create_producer(topic, 1)
        raw.produce(1, 0, b"old")
        raw.send_command(
            T(
                type=T.SUBSCRIBE,
                subscribe=pb.CommandSubscribe(
                    topic=topic,
                    subscription="reader-1",
                    sub_type=pb.CommandSubscribe.Exclusive,
                    consumer_id=1,
                    request_id=100,
                    durable=False,
                    start_message_id=pb.MessageIdData(ledger_id=2**63 - 1, entry_id=2**63 - 1),
                    start_message_rollback_duration_sec=3_600,
                ),
            )
        )
        raw.expect(T.SUCCESS)
        raw.flow(1, 10)
        (message,) = raw.receive(1, 1)
        assert message.payload == b"old"  # without the rollback, latest would skip it


def _batched_ids(client: pulsar.Client, topic: str, count: int) -> list[pulsar.MessageId]:
    producer = client.create_producer(
        topic,
        batching_enabled=True,
        batching_max_messages=count,
        batching_max_publish_delay_ms=1_000,
    )
    ids: list[pulsar.MessageId | None] = [None] * count

    def sent(index: int):
        def callback(result: pulsar.Result, message_id: pulsar.MessageId) -> None:
            ids[index] = message_id

        return callback

    for i in range(count):
        producer.send_async(f"m{i}".encode(), sent(i))
    producer.flush()
    assert all(i is not None for i in ids)
    assert len({(i.entry_id()) for i in ids if i is not None}) == 1, "one batch"
    return [i for i in ids if i is not None]


@pytest.mark.official
@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
@pytest.mark.parametrize("inclusive", [True, False], ids=["inclusive", "exclusive"])
def test_reader_seek_by_id_lands_inclusive_or_after(
    client: pulsar.Client, topic: str, batched: bool, inclusive: bool
) -> None:
    if batched:
        ids = _batched_ids(client, topic, 6)
    else:
        producer = client.create_producer(topic, batching_enabled=False)
        ids = [producer.send(f"m{i}".encode()) for i in range(6)]
    reader = client.create_reader(
        topic, pulsar.MessageId.earliest, start_message_id_inclusive=inclusive
    )
    assert [reader.read_next(5_000).data() for _ in range(6)] == [
        f"m{i}".encode() for i in range(6)
    ]
    reader.seek(ids[3])
    expected = b"m3" if inclusive else b"m4"
    assert reader.read_next(5_000).data() == expected


@pytest.mark.official
def test_reader_seek_back_to_an_entry_another_reader_consumed(
    client: pulsar.Client, topic: str
) -> None:
    """Entries go only with whole consumed segments, never the open one
    (ManagedLedgerImpl#internalTrimLedgers, storage/retention.py), so an entry a reader
    already read is still there for another reader's seek back to it."""
    producer = client.create_producer(topic, batching_enabled=False)
    ids = [producer.send(f"m{i}".encode()) for i in range(6)]
    first = client.create_reader(topic, ids[3], start_message_id_inclusive=True)
    assert first.read_next(5_000).data() == b"m3"
    second = client.create_reader(topic, pulsar.MessageId.latest, start_message_id_inclusive=True)
    second.seek(ids[3])
    assert second.read_next(5_000).data() == b"m3"


@pytest.mark.official
def test_seek_by_time_on_a_disk_ledger_after_a_restart(tmp_path: Path) -> None:
    topic = "persistent://public/default/seek-disk"
    with Broker(port=0, storage="disk", data_dir=str(tmp_path)) as running:
        client = pulsar.Client(running.service_url, operation_timeout_seconds=5)
        _keep_backlog(client, topic)
        _send_spread(client.create_producer(topic, batching_enabled=False), 30)
        client.close()
    with Broker(port=0, storage="disk", data_dir=str(tmp_path)) as running:  # cold: no tail cache
        client = pulsar.Client(running.service_url, operation_timeout_seconds=5)
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        times = [reader.read_next(5_000).publish_timestamp() for _ in range(30)]
        reader.seek(times[17])
        assert _next_data(reader) == b"m17"
        reader.seek(times[0] - 1)
        assert _next_data(reader) == b"m0"
        client.close()
