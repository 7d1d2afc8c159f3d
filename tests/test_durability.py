"""Durable topics: restarts, crashes, corrupt tails, a full disk and retention, at broker level."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pulsar
import pytest

from brokerlet import Broker
from brokerlet.storage import FileOps, StorageError
from brokerlet.testing.rawclient import ConnectionClosed, RawClient
from brokerlet.transport.protocol import pb

TOPIC = "persistent://public/default/durable"
T = pb.BaseCommand


def disk_broker(data_dir: Path, **settings: object) -> Broker:
    return Broker(port=0, storage="disk", data_dir=str(data_dir), **settings)


def client_for(broker: Broker) -> pulsar.Client:
    quiet = logging.getLogger("tests.pulsar-client")
    quiet.setLevel(logging.WARNING)
    return pulsar.Client(broker.service_url, operation_timeout_seconds=5, logger=quiet)


def drain(consumer: pulsar.Consumer, wait_ms: int = 500) -> list[pulsar.Message]:
    got = []
    while True:
        try:
            message = consumer.receive(wait_ms)
        except pulsar.Timeout:
            return got
        got.append(message)
        consumer.acknowledge(message)


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
        rest = [m.data() for m in drain(consumer)]
        assert rest == [f"m{i}".encode() for i in range(4, 10)] + [b"after restart"]
        client.close()


def start_broker_process(data_dir: Path) -> tuple[subprocess.Popen[str], tuple[str, int]]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "brokerlet",
            "serve",
            "--port",
            "0",
            "--data-dir",
            str(data_dir),
            "--web-service-enabled",
            "false",
            "--log-level",
            "WARNING",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()  # "brokerlet ready on pulsar://127.0.0.1:<port>"
    assert "ready on pulsar://" in line, line
    host, port = line.rsplit("//", 1)[1].strip().split(":")
    return process, (host, int(port))


def produce_until_closed(address: tuple[str, int], producer: int, receipted: list[bytes]) -> None:
    """Send messages one after another; record each payload whose SEND_RECEIPT came back."""
    try:
        with RawClient(address, timeout=5) as client:
            client.handshake()
            client.create_producer(TOPIC, 1)
            for sequence in range(100_000):
                payload = f"p{producer}-{sequence}".encode()
                client.produce(1, sequence, payload)
                receipted.append(payload)
    except (ConnectionClosed, OSError, TimeoutError):
        return


def test_sigkill_loses_no_receipted_message(tmp_path: Path) -> None:
    process, address = start_broker_process(tmp_path)
    try:
        with RawClient(address, timeout=5) as consumer:
            consumer.handshake()
            consumer.subscribe(TOPIC, "sub", 1, sub_type=pb.CommandSubscribe.Shared)
        receipted: list[list[bytes]] = [[] for _ in range(4)]
        producers = [
            threading.Thread(target=produce_until_closed, args=(address, i, receipted[i]))
            for i in range(4)
        ]
        for thread in producers:
            thread.start()
        # Consume and ack part of it while production goes on.
        acked_before: set[bytes] = set()
        with RawClient(address, timeout=5) as consumer:
            consumer.handshake()
            consumer.subscribe(TOPIC, "sub", 1, sub_type=pb.CommandSubscribe.Shared)
            consumer.flow(1, 200)
            for message in consumer.receive(1, 200):
                consumer.ack(1, [message.entry_id], ledger_id=message.ledger_id)
                acked_before.add(message.payload)
            consumer.ping()  # the acks reached the broker before this PONG
        time.sleep(random.uniform(0.05, 0.3))  # a random moment under sustained production
        process.send_signal(signal.SIGKILL)
        process.wait(5)
        for thread in producers:
            thread.join(10)
    finally:
        if process.poll() is None:
            process.kill()
    expected = {payload for per_producer in receipted for payload in per_producer}
    assert len(expected) > 200

    process, address = start_broker_process(tmp_path)
    try:
        delivered: list[bytes] = []
        with RawClient(address, timeout=5) as consumer:
            consumer.handshake()
            consumer.subscribe(TOPIC, "sub", 1, sub_type=pb.CommandSubscribe.Shared)
            consumer.flow(1, 1_000_000)
            try:
                while True:
                    for message in consumer.receive(1, 1, timeout=1.0):
                        delivered.append(message.payload)
            except TimeoutError:
                pass
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(10)
    assert expected <= set(delivered) | acked_before, "a receipted message was lost"
    twice = acked_before & set(delivered)
    print(
        f"receipted {len(expected)}, acked before the crash {len(acked_before)}, "
        f"delivered again after restart {len(twice)}"
    )
    # The cursor is saved every cursor_flush_ms: only acks newer than that may be redone.
    assert len(twice) <= len(acked_before)
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


def topic_bytes(data_dir: Path) -> int:
    total = 0
    for segment in data_dir.glob("topics/*/*.seg"):
        with contextlib.suppress(FileNotFoundError):  # deleted between listing and stat
            total += segment.stat().st_size
    return total


def test_retention_frees_disk_once_every_subscription_acked(tmp_path: Path) -> None:
    with (
        disk_broker(tmp_path, segment_bytes=16384) as broker,
        RawClient(broker.address) as client,
    ):
        client.handshake()
        client.subscribe(TOPIC, "only", 1)
        client.create_producer(TOPIC, 1)
        for sequence in range(200):
            client.produce(1, sequence, b"x" * 1024)
        before = topic_bytes(tmp_path)
        client.flow(1, 200)
        received = client.receive(1, 200)
        client.ack(1, [m.entry_id for m in received], ledger_id=received[0].ledger_id)
        client.ping()
        deadline = time.monotonic() + 5
        while topic_bytes(tmp_path) > before // 4 and time.monotonic() < deadline:
            time.sleep(0.02)  # segments are deleted on the storage thread
        after = topic_bytes(tmp_path)
    assert before > 150_000
    assert after < before // 4, (before, after)


def test_an_incompatible_data_directory_stops_start_up_clearly(tmp_path: Path) -> None:
    (tmp_path / "FORMAT").write_text("someone else's format 99\n")
    broker = disk_broker(tmp_path)
    with pytest.raises(StorageError, match=r"(?i)format|version"):
        broker.start()
