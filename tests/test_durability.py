"""Durable topics: restarts, crashes, corrupt tails, a full disk and retention, at broker level."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import random
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pulsar
import pytest

from brokerlet import Broker
from brokerlet.storage import FileOps, StorageError
from brokerlet.storage._cursors import load_cursors
from brokerlet.testing.process import BrokerletProcess
from brokerlet.testing.rawclient import ConnectionClosed, RawClient
from brokerlet.testing.waiting import wait_until
from brokerlet.transport.protocol import pb
from tests.datarules import drain

TOPIC = "persistent://public/default/durable"
T = pb.BaseCommand


def disk_broker(data_dir: Path, **settings: object) -> Broker:
    return Broker(port=0, storage="disk", data_dir=str(data_dir), **settings)


def client_for(broker: Broker) -> pulsar.Client:
    quiet = logging.getLogger("tests.pulsar-client")
    quiet.setLevel(logging.WARNING)
    return pulsar.Client(broker.service_url, operation_timeout_seconds=5, logger=quiet)


@pytest.mark.official
def test_restart_redelivers_unacked_keeps_acked_and_continues_ids(tmp_path: Path) -> None:
    with disk_broker(tmp_path) as broker:
        client = client_for(broker)
        producer = client.create_producer(TOPIC, batching_enabled=False)
        consumer = client.subscribe(TOPIC, "sub", consumer_type=pulsar.ConsumerType.Shared)
        ids = [producer.send(f"m{i}".encode()) for i in range(10)]
        for _ in range(4):
            consumer.acknowledge(consumer.receive(5000))
        client.close()

    with disk_broker(tmp_path) as broker:
        client = client_for(broker)
        consumer = client.subscribe(TOPIC, "sub", consumer_type=pulsar.ConsumerType.Shared)
        producer = client.create_producer(TOPIC, batching_enabled=False)
        new = producer.send(b"after restart")
        assert (new.ledger_id(), new.entry_id()) == (ids[0].ledger_id(), 10)
        rest = [m.data() for m in drain(consumer, wait_ms=500)]
        assert rest == [f"m{i}".encode() for i in range(4, 10)] + [b"after restart"]
        client.close()


def produce_until_closed(
    address: tuple[str, int], producer: int, receipted: list[bytes], progress: threading.Event
) -> None:
    """Send messages one after another; record each payload whose SEND_RECEIPT came back."""
    try:
        with RawClient(address, timeout=5) as client:
            client.handshake()
            client.create_producer(TOPIC, 1)
            for sequence in range(100_000):
                payload = f"p{producer}-{sequence}".encode()
                client.produce(1, sequence, payload)
                receipted.append(payload)
                progress.set()
    except (ConnectionClosed, OSError, TimeoutError):
        return


def saved_cursor(data_dir: Path, subscription: str) -> tuple[int, set[int]] | None:
    """``(mark_delete, acked ids)`` of ``subscription`` as the cursors file on disk holds it."""
    for path in data_dir.glob("topics/*/cursors"):
        state = load_cursors(str(path), TOPIC).get(subscription)
        if state is not None:
            return state[0], set(state[1])
    return None


def test_sigkill_loses_no_receipted_message_nor_redoes_a_saved_ack(tmp_path: Path) -> None:
    # The kill comes after a seeded number of receipts, under sustained production.
    seed = int(os.environ.get("BROKERLET_CRASH_SEED", random.randrange(1 << 30)))
    print(f"sigkill seed {seed} (rerun with BROKERLET_CRASH_SEED={seed})")
    kill_after = random.Random(seed).randint(400, 3_000)
    receipted: list[list[bytes]] = [[] for _ in range(4)]
    acked_before: dict[int, bytes] = {}  # entry id -> payload
    with BrokerletProcess(data_dir=tmp_path) as broker:
        broker.start()
        with RawClient(broker.address, timeout=5) as consumer:
            consumer.handshake()
            consumer.subscribe(TOPIC, "sub", 1, sub_type=pb.CommandSubscribe.Shared)
        progress = threading.Event()
        producers = [
            threading.Thread(
                target=produce_until_closed, args=(broker.address, i, receipted[i], progress)
            )
            for i in range(4)
        ]
        for thread in producers:
            thread.start()
        # Consume and ack part of it while production goes on.
        with RawClient(broker.address, timeout=5) as consumer:
            consumer.handshake()
            consumer.subscribe(TOPIC, "sub", 1, sub_type=pb.CommandSubscribe.Shared)
            consumer.flow(1, 200)
            for message in consumer.receive(1, 200):
                consumer.ack(1, [message.entry_id], ledger_id=message.ledger_id)
                acked_before[message.entry_id] = message.payload
            consumer.ping()  # the acks reached the broker before this PONG
        # Wait until the acks are on disk (cursor_flush_ms after them): those must hold.
        deadline = time.monotonic() + 10
        while True:
            saved = saved_cursor(tmp_path, "sub")
            if saved is not None and all(
                entry <= saved[0] or entry in saved[1] for entry in acked_before
            ):
                break
            assert time.monotonic() < deadline, f"acks never reached the cursors file: {saved}"
            progress.clear()
            progress.wait(0.05)  # bounded poll of the file, woken by production
        while sum(map(len, receipted)) < kill_after:
            progress.clear()
            assert progress.wait(10), f"production stalled before {kill_after} receipts"
        broker.kill()
        for thread in producers:
            thread.join(10)
            assert not thread.is_alive(), "a producer did not notice the broker died"
    expected = {payload for per_producer in receipted for payload in per_producer}
    assert len(expected) >= kill_after

    delivered: list[bytes] = []
    with BrokerletProcess(data_dir=tmp_path) as broker:
        broker.start()
        with RawClient(broker.address, timeout=5) as consumer:
            consumer.handshake()
            consumer.subscribe(TOPIC, "sub", 1, sub_type=pb.CommandSubscribe.Shared)
            consumer.flow(1, 1_000_000)
            with contextlib.suppress(TimeoutError):  # one quiet second: the backlog is out
                while True:
                    delivered.extend(m.payload for m in consumer.receive(1, 1, timeout=1.0))
        assert broker.stop() == 0
    acked = set(acked_before.values())
    assert expected <= set(delivered) | acked, f"a receipted message was lost (seed {seed})"
    twice = acked & set(delivered)
    print(
        f"receipted {len(expected)}, acked before the crash {len(acked)}, "
        f"delivered again after restart {len(twice)}"
    )
    # Every one of those acks was in the cursors file before the kill: none may come back.
    assert not twice, f"{len(twice)} saved acks were redone (seed {seed})"
    assert len(delivered) == len(set(delivered)), "no duplicates within one run"


def test_a_corrupt_tail_is_truncated_logged_and_the_rest_served(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with disk_broker(tmp_path) as broker, RawClient(broker.address) as producer:
        producer.handshake()
        producer.create_producer(TOPIC, 1)
        for sequence in range(20):
            producer.produce(1, sequence, f"m{sequence}".encode())
    (segment,) = sorted(tmp_path.glob("topics/*/*.seg"))
    size = segment.stat().st_size
    with open(segment, "r+b") as file:  # tear the last record and scribble after it
        file.truncate(size - 5)
        file.seek(0, os.SEEK_END)
        file.write(b"\xde\xad\xbe\xef" * 8)

    caplog.set_level(logging.WARNING)
    with disk_broker(tmp_path) as broker, RawClient(broker.address) as client:
        client.handshake()
        client.subscribe(TOPIC, "after", 1)
        client.flow(1, 100)
        got = [m.payload for m in client.receive(1, 19)]
        assert got == [f"m{i}".encode() for i in range(19)]
        with pytest.raises(TimeoutError):
            client.recv_frame(0.3)
        client.create_producer(TOPIC, 2)
        assert client.produce(2, 0, b"next") == 19  # ids continue after the cut
    assert any(
        "trunc" in r.getMessage().lower() or "torn" in r.getMessage().lower()
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]


class FullDisk(FileOps):
    """Refuses writes with ENOSPC while ``full`` is set."""

    def __init__(self) -> None:
        self.full = False

    def write(self, fd: int, buffers: Sequence[bytes], offset: int) -> int:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(fd, buffers, offset)


def test_a_full_disk_fails_sends_with_persistence_error_and_keeps_serving(tmp_path: Path) -> None:
    disk = FullDisk()
    with (
        Broker(port=0, storage="disk", data_dir=str(tmp_path), storage_file_ops=disk) as broker,
        RawClient(broker.address) as client,
    ):
        client.handshake()
        client.create_producer(TOPIC, 1)
        for sequence in range(5):
            client.produce(1, sequence, f"kept{sequence}".encode())
        disk.full = True
        client.send_raw(client.send_frame(1, 5, b"refused"))
        error = client.expect(T.SEND_ERROR).send_error
        assert error.error == pb.PersistenceError
        # The broker keeps serving reads on another connection; nothing receipted is lost.
        with RawClient(broker.address) as reader:
            reader.handshake()
            reader.subscribe(TOPIC, "reader", 1)
            reader.flow(1, 100)
            assert [m.payload for m in reader.receive(1, 5)] == [
                f"kept{i}".encode() for i in range(5)
            ]
            disk.full = False
            reader.create_producer(TOPIC, 2)
            reader.produce(2, 0, b"space again")
            assert [m.payload for m in reader.receive(1, 1)] == [b"space again"]


class CursorsRewrites(FileOps):
    """Counts the rewrites of cursors files (the writes of their temporary copies)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0

    def write(self, fd: int, buffers: Sequence[bytes], offset: int) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("/cursors.tmp"):
            with self.lock:
                self.count += 1
        return super().write(fd, buffers, offset)


def test_a_new_subscription_and_its_first_acks_share_one_cursors_rewrite(tmp_path: Path) -> None:
    # dispatch/cursor_saver.py: a new durable subscription is saved by the dispatcher's first
    # persist timer, with its first acks; a test's topic costs one rewrite (two syncs), not two.
    rewrites = CursorsRewrites()
    with (
        Broker(
            port=0,
            storage="disk",
            data_dir=str(tmp_path),
            storage_file_ops=rewrites,
            cursor_flush_ms=500,  # the acks below come well inside it
        ) as broker,
        RawClient(broker.address) as client,
    ):
        client.handshake()
        client.subscribe(TOPIC, "sub", 1, sub_type=pb.CommandSubscribe.Shared)
        store_then_ack_all(client, [b"a", b"b", b"c"], tmp_path)
        wait_until(
            lambda: (saved_cursor(tmp_path, "sub") or (-1, set()))[0] == 2,
            message="the acks in the cursors file",
        )
        assert rewrites.count == 1


def topic_bytes(data_dir: Path) -> int:
    total = 0
    for segment in data_dir.glob("topics/*/*.seg"):
        with contextlib.suppress(FileNotFoundError):  # deleted between listing and stat
            total += segment.stat().st_size
    return total


def store_then_ack_all(client: RawClient, payloads: list[bytes], data_dir: Path) -> int:
    """Store ``payloads``, then receive and ack them all on consumer 1.

    Returns:
        The topic's bytes on disk before the acks.
    """
    client.create_producer(TOPIC, 1)
    for sequence, data in enumerate(payloads):
        client.produce(1, sequence, data)
    before = topic_bytes(data_dir)
    client.flow(1, len(payloads))
    received = client.receive(1, len(payloads))
    client.ack(1, [m.entry_id for m in received], ledger_id=received[0].ledger_id)
    client.ping()  # the acks reached the broker before this PONG
    return before


def test_retention_frees_disk_once_every_subscription_acked(tmp_path: Path) -> None:
    with (
        disk_broker(tmp_path, segment_bytes=16384) as broker,
        RawClient(broker.address) as client,
    ):
        client.handshake()
        client.subscribe(TOPIC, "only", 1)
        before = store_then_ack_all(client, [b"x" * 1024] * 200, tmp_path)
        # Segments are deleted on the storage thread.
        after = wait_until(
            lambda: topic_bytes(tmp_path),
            predicate=lambda size: size < before // 4,
            message="the acknowledged segments deleted",
            timeout=5,
        )
    assert before > 150_000
    assert after < before // 4, (before, after)


def test_an_incompatible_data_directory_stops_start_up_clearly(tmp_path: Path) -> None:
    (tmp_path / "FORMAT").write_text("someone else's format 99\n")
    broker = disk_broker(tmp_path)
    with pytest.raises(StorageError, match=r"(?i)format|version"):
        broker.start()


def test_a_lagging_subscription_keeps_its_segments(tmp_path: Path) -> None:
    # Retention trims only below the slowest durable cursor: "fast" acking everything must
    # not free what "slow" has not read.
    with (
        disk_broker(tmp_path, segment_bytes=16384) as broker,
        RawClient(broker.address) as client,
    ):
        client.handshake()
        client.subscribe(TOPIC, "fast", 1)
        client.subscribe(TOPIC, "slow", 2)
        payloads = [f"{i:04}".encode() * 256 for i in range(200)]
        before = store_then_ack_all(client, payloads, tmp_path)
        # The fast cursor reaching disk is when retention would run for it.
        deadline = time.monotonic() + 5
        while (saved_cursor(tmp_path, "fast") or (-1, set()))[0] < len(payloads) - 1:
            assert time.monotonic() < deadline, "the fast subscription's acks never saved"
            client.ping()  # a round trip per poll, not a sleep
        assert topic_bytes(tmp_path) >= before, "segments the slow subscription needs went"
        client.flow(2, 200)
        assert [m.payload for m in client.receive(2, 200)] == payloads
