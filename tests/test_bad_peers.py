"""Bad peers must not break topics (issue 10): one regression test per bug found by fuzzing.

Each test reproduces one bug deterministically on raw connections
(:mod:`brokerlet.testing.rawclient`), then shows the topic still serves a well-behaved
client. Waits are bounded; nothing sleeps to synchronise except where a test needs a peer
that is slow on purpose.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gevent.event
import pytest
from google.protobuf import unknown_fields

from brokerlet import Broker
from brokerlet.actors.messages import IsIdle
from brokerlet.actors.supervision import restarts
from brokerlet.actors.topic import TopicActor
from brokerlet.config import Settings
from brokerlet.dispatch.key_shared import NO_KEY_HASH, KeySharedRules
from brokerlet.keyshared import KeySharedMeta
from brokerlet.storage.ledger import Entry
from brokerlet.testing.rawclient import ConnectionClosed, RawClient, make_entry
from brokerlet.testing.waiting import wait_until
from brokerlet.transport.protocol import (
    FrameDecoder,
    crc32c,
    encode_command,
    encode_send,
    pb,
)
from brokerlet.transport.protocol._unsupported import UNSUPPORTED

T = pb.BaseCommand
TOPIC = "persistent://public/default/bad-peers"
WAIT = 2.0


@pytest.fixture
def broker() -> Iterator[Broker]:
    with Broker(port=0) as running:
        yield running


def disk_broker(data_dir: Path, **overrides: Any) -> Broker:
    return Broker(port=0, storage="disk", data_dir=str(data_dir), **overrides).start()


def with_bad_utf8(command: pb.BaseCommand, placeholder: str) -> bytes:
    """The frame of ``command`` with ``placeholder``'s last byte replaced by 0xff."""
    body = command.SerializeToString()
    marker = placeholder.encode()
    assert body.count(marker) == 1
    body = body.replace(marker, marker[:-1] + b"\xff")
    return struct.pack(">II", len(body) + 4, len(body)) + body


def produce_all(client: RawClient, producer_id: int, payloads: list[bytes]) -> list[int]:
    return [client.produce(producer_id, i, p) for i, p in enumerate(payloads)]


def payloads(count: int, tag: str = "m") -> list[bytes]:
    return [f"{tag}-{i}".encode() for i in range(count)]


# Bug 1: a producer that disconnects while its SENDs are written to disk killed the topic.


def test_producer_reset_during_disk_append_leaves_the_topic_usable(tmp_path: Path) -> None:
    before = restarts()
    broker = disk_broker(tmp_path)
    try:
        for attempt in range(3):
            bad = RawClient(broker.address)
            bad.handshake()
            bad.create_producer(TOPIC, 1)
            burst = b"".join(bad.send_frame(1, i, b"x" * 1024) for i in range(50))
            bad.send_raw(burst)
            # RST at once: the appends complete after the connection actor has stopped.
            bad.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            bad.close()

            with RawClient(broker.address) as good:
                good.handshake()
                good.create_producer(TOPIC, 7)  # "internal error" / timeout before the fix
                entry_id = good.produce(7, 0, f"after reset {attempt}".encode())
                good.subscribe(TOPIC, f"check-{attempt}", 1)
                good.flow(1, entry_id + 1)
                received = good.receive(1, entry_id + 1)
                assert received[-1].payload == f"after reset {attempt}".encode()
    finally:
        broker.stop()
    assert restarts()["topic"] == before["topic"], "fixed at the point, not by a restart"


# Bug 2: a valid checksum around garbage MessageMetadata.


def garbage_metadata_send(producer_id: int, sequence_id: int) -> bytes:
    metadata = b"\x0a\xff\xff\xff\xff\x0f"  # field 1, length 2^32-1: undecodable
    entry = struct.pack(">I", len(metadata)) + metadata + b"payload"
    header, body = encode_send(producer_id, sequence_id, 1, entry)
    return header + body


def test_send_with_undecodable_metadata_is_refused_before_its_receipt(broker: Broker) -> None:
    with RawClient(broker.address) as client:
        client.handshake()
        client.create_producer(TOPIC, 1)
        client.send_raw(garbage_metadata_send(1, 0))
        error = client.expect(T.SEND_ERROR).send_error
        assert (error.sequence_id, error.error) == (0, pb.NotAllowedError)
        assert "metadata" in error.message
        # Nothing was stored, and the connection and producer go on.
        assert client.produce(1, 1, b"good") == 0
        stats = broker.topic_stats(TOPIC)
        assert stats is not None
        assert stats["lastEntryId"] == 0


def test_key_shared_routes_an_unparseable_stored_entry_as_having_no_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="brokerlet")
    rules = KeySharedRules(KeySharedMeta(), Settings(), lambda: None)
    metadata = b"\x0a\xff\xff\xff\xff\x0f"
    data = struct.pack(">I", len(metadata)) + metadata + b"payload"
    bad = [Entry(1, entry_id, data, crc32c(data), 1) for entry_id in (5, 6)]
    assert [rules.key_hash(entry) for entry in bad] == [NO_KEY_HASH, NO_KEY_HASH]
    good = Entry(1, 7, make_entry("p", 0, b"v"), 0, 1)
    assert rules.key_hash(good) not in (0, NO_KEY_HASH)
    assert sum("unparseable metadata" in m for m in caplog.messages) == 1, "logged once"


# Bug 3: a non-UTF-8 subscription name broke cursor persistence for the whole topic.


def subscribe_command(subscription: str, request_id: int = 99) -> pb.BaseCommand:
    return T(
        type=T.SUBSCRIBE,
        subscribe=pb.CommandSubscribe(
            topic=TOPIC,
            subscription=subscription,
            sub_type=pb.CommandSubscribe.Exclusive,
            consumer_id=9,
            request_id=request_id,
        ),
    )


def test_non_utf8_subscription_is_refused_and_cursors_still_persist(tmp_path: Path) -> None:
    stored = payloads(10)
    broker = disk_broker(tmp_path)
    try:
        with RawClient(broker.address) as client:
            client.handshake()
            client.send_raw(with_bad_utf8(subscribe_command("subX"), "subX"))
            error = client.expect(T.ERROR).error
            assert (error.request_id, error.error) == (99, pb.NotAllowedError)
            assert "subscription" in error.message
            client.ping()  # still in sync

            client.subscribe(TOPIC, "durable", 1)
            client.create_producer(TOPIC, 1)
            produce_all(client, 1, stored)
            client.flow(1, 10)
            received = client.receive(1, 10)
            client.ack(1, [m.entry_id for m in received[:5]], received[0].ledger_id)
            client.ping()
    finally:
        broker.stop()  # graceful: the cursor is flushed
    broker = disk_broker(tmp_path)
    try:
        with RawClient(broker.address) as client:
            client.handshake()
            client.subscribe(TOPIC, "durable", 1)
            client.flow(1, 10)
            # Exactly the 5 unacknowledged come back: the cursor was saved.
            assert [m.payload for m in client.receive(1, 5)] == stored[5:]
            with pytest.raises(TimeoutError):
                client.recv_frame(timeout=0.3)
    finally:
        broker.stop()


# Bug 4: non-UTF-8 topic or producer names raised inside the connection actor.


def test_non_utf8_topic_and_producer_names_are_answered(broker: Broker) -> None:
    with RawClient(broker.address) as client:
        client.handshake()
        bad_topic = T(
            type=T.PRODUCER,
            producer=pb.CommandProducer(topic=TOPIC + "X", producer_id=1, request_id=1),
        )
        client.send_raw(with_bad_utf8(bad_topic, TOPIC + "X"))
        error = client.expect(T.ERROR).error
        assert (error.request_id, error.error) == (1, pb.InvalidTopicName)

        bad_name = T(
            type=T.PRODUCER,
            producer=pb.CommandProducer(
                topic=TOPIC, producer_id=2, request_id=2, producer_name="nameX"
            ),
        )
        client.send_raw(with_bad_utf8(bad_name, "nameX"))
        error = client.expect(T.ERROR).error
        assert (error.request_id, error.error) == (2, pb.NotAllowedError)

        lookup = T(type=T.LOOKUP, lookup=pb.CommandLookupTopic(topic=TOPIC + "X", request_id=3))
        client.send_raw(with_bad_utf8(lookup, TOPIC + "X"))
        response = client.expect(T.LOOKUP_RESPONSE).lookup_response
        assert (response.request_id, response.error) == (3, pb.InvalidTopicName)
        assert response.response == pb.CommandLookupTopicResponse.Failed

        # Same connection, good names: served.
        client.create_producer(TOPIC, 3)
        assert client.produce(3, 0, b"fine") == 0


def _lookup_command(topic: str, request_id: int) -> pb.BaseCommand:
    return T(type=T.LOOKUP, lookup=pb.CommandLookupTopic(topic=topic, request_id=request_id))


@pytest.mark.parametrize("request_id", [7, 300], ids=["ascii ids", "multi-byte ids"])
@pytest.mark.parametrize(
    ("command", "path"),
    [
        (subscribe_command, "subscribe.subscription"),
        # A body numbered 16 or more: its tag byte is above 0x7F whatever the names.
        (lambda name, rid: _lookup_command(TOPIC + name, rid), "lookup.topic"),
    ],
    ids=["SUBSCRIBE", "LOOKUP"],
)
def test_a_name_that_is_not_utf8_is_found_whatever_the_ids(
    request_id: int, command: Callable[[str, int], pb.BaseCommand], path: str
) -> None:
    # The decoder skips the walk for a command whose body's bytes are all ASCII; ids of 128
    # or more make varint bytes above 0x7F, and a bad name must still be found among them.
    frame = with_bad_utf8(command("nameX", request_id), "nameX")
    (decoded,) = FrameDecoder(1 << 20).feed(frame)
    assert decoded.invalid_text == path
    good = encode_command(command("namé", request_id))  # valid UTF-8, not ASCII: walked
    assert FrameDecoder(1 << 20).feed(good)[0].invalid_text is None
    plain = encode_command(command("", request_id))
    assert FrameDecoder(1 << 20).feed(plain)[0].invalid_text is None


def test_the_closes_assigned_broker_urls_are_not_checked() -> None:
    # Only a broker sends them (Pulsar's topic transfer); brokerlet never reads them.
    close = T(
        type=T.CLOSE_PRODUCER,
        close_producer=pb.CommandCloseProducer(
            producer_id=1, request_id=2, assigned_broker_service_url="urlX"
        ),
    )
    (decoded,) = FrameDecoder(1 << 20).feed(with_bad_utf8(close, "urlX"))
    assert decoded.invalid_text is None
    assert decoded.command.close_producer.producer_id == 1


# Bug 5: acks for entries that did not exist yet were kept.


def cumulative_ack(consumer_id: int, ledger_id: int, entry_id: int) -> bytes:
    ack = pb.CommandAck(consumer_id=consumer_id, ack_type=pb.CommandAck.Cumulative)
    ack.message_id.add(ledger_id=ledger_id, entry_id=entry_id)
    return encode_command(T(type=T.ACK, ack=ack))


@pytest.mark.parametrize("how", ["individual on Shared", "cumulative on Exclusive"])
def test_acks_beyond_the_last_entry_are_ignored(broker: Broker, how: str) -> None:
    stored = payloads(10)
    with RawClient(broker.address) as client:
        client.handshake()
        sub_type = (
            pb.CommandSubscribe.Shared if how.endswith("Shared") else pb.CommandSubscribe.Exclusive
        )
        client.subscribe(TOPIC, "early-acks", 1, sub_type=sub_type)
        stats = broker.topic_stats(TOPIC)
        assert stats is not None
        ledger_id = stats["ledgerId"]
        if how.startswith("individual"):
            client.ack(1, [1, 2, 3, 4, 5], ledger_id)
        else:
            client.send_raw(cumulative_ack(1, ledger_id, 5))
        client.ping()  # the acks were handled before anything is stored
        client.create_producer(TOPIC, 1)
        produce_all(client, 1, stored)
        client.flow(1, 10)
        assert [m.payload for m in client.receive(1, 10)] == stored


# Bug 6: slow senders, missing handshakes and connection counts.

KEEP_ALIVE = {"keep_alive_interval_seconds": 1}


def test_no_connect_within_the_first_interval_closes_the_connection() -> None:
    with Broker(port=0, **KEEP_ALIVE) as broker, RawClient(broker.address, timeout=3) as idle:
        began = time.monotonic()
        assert idle.wait_closed(timeout=3) == []
        assert 0.9 <= time.monotonic() - began < 2.5


def test_a_trickling_sender_is_closed_as_a_silent_one() -> None:
    with Broker(port=0, **KEEP_ALIVE) as broker, RawClient(broker.address, timeout=4) as slow:
        slow.handshake()
        frame = slow.send_frame(1, 0, b"x" * 100)
        began = time.monotonic()
        closed = False
        for byte in frame[:-1]:  # one byte every 100 ms never completes a frame in time
            try:
                slow.send_raw(bytes([byte]))
                slow.sock.settimeout(0.1)
                data = slow.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                closed = True
                break
            if not data:
                closed = True
                break
            # Only the keep-alive PING may arrive; it cannot be answered mid-frame.
            assert FrameDecoder(1 << 20).feed(data)[0].command.type == T.PING
        assert closed, "still open after trickling a whole frame"
        # Two intervals: the PING after the first, the close after the second.
        assert 1.8 <= time.monotonic() - began < 4


@pytest.mark.parametrize("key", ["brokerMaxConnections", "brokerMaxConnectionsPerIp"])
def test_connections_over_the_cap_are_closed(key: str) -> None:
    with Broker(port=0, **{key: 2}) as broker:
        first, second = RawClient(broker.address), RawClient(broker.address)
        first.handshake()
        second.handshake()
        with RawClient(broker.address) as third, pytest.raises((ConnectionClosed, OSError)):
            third.handshake()
        second.close()
        wait_until(
            lambda: broker._server is not None and broker._server.connection_count == 1,
            message="the closed connection to be dropped",
            timeout=WAIT,
        )
        with RawClient(broker.address) as again:
            again.handshake()  # room again
        first.close()


# Also: per-message size, repeated warnings, unsupported requests, idle topics.


def sized_send(client: RawClient, producer_id: int, sequence_id: int, entry_size: int) -> bytes:
    base = len(make_entry("p", sequence_id, b""))
    entry = make_entry("p", sequence_id, b"x" * (entry_size - base))
    assert len(entry) == entry_size
    header, body = encode_send(producer_id, sequence_id, 1, entry)
    return header + body


def test_a_message_over_max_message_size_is_refused_with_send_error() -> None:
    # Pulsar's PersistentTopic.isExceedMaximumMessageSize: NotAllowedException -> SEND_ERROR.
    with Broker(port=0, max_message_size=1024) as broker, RawClient(broker.address) as client:
        client.handshake()
        client.create_producer(TOPIC, 1)
        client.send_raw(sized_send(client, 1, 0, 1024))
        assert client.expect(T.SEND_RECEIPT).send_receipt.message_id.entry_id == 0
        client.send_raw(sized_send(client, 1, 1, 1025))
        error = client.expect(T.SEND_ERROR).send_error
        assert (error.sequence_id, error.error) == (1, pb.NotAllowedError)
        assert "maximum message size" in error.message
        client.ping()


def test_commands_for_unknown_consumers_are_logged_once_then_counted(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="brokerlet")
    with RawClient(broker.address) as client:
        client.handshake()
        for _ in range(50):
            client.flow(77, 10)
        client.ack(77, [1], 1)
        client.ping()
    wait_until(
        lambda: any("more commands" in m for m in caplog.messages),
        message="the summary at close",
        timeout=WAIT,
    )
    about = [m for m in caplog.messages if "unknown consumer" in m]
    assert len(about) == 2, about  # the first occurrence, then one line at close
    assert "50 more commands for unknown consumers" in about[1]


def unsupported(type_value: int, body: bytes) -> bytes:
    """A frame of a command whose body brokerlet's schema does not declare."""
    key = (type_value << 3) | 2
    tag = bytes([(key & 0x7F) | 0x80, key >> 7])
    command = bytes([0x08, type_value]) + tag + bytes([len(body)]) + body
    return struct.pack(">II", len(command) + 4, len(command)) + command


def unknown_body(frame: Any) -> bytes:
    fields = list(unknown_fields.UnknownFieldSet(frame.command))
    assert len(fields) == 1
    data: bytes = fields[0].data
    return data


@pytest.mark.parametrize(
    ("request_type", "body", "reply_type", "reply_body"),
    [
        # request_id = 7; the reply: request_id, error code, message (field numbers per type).
        (T.NEW_TXN, b"\x08\x07", T.NEW_TXN_RESPONSE, b"\x08\x07\x20\x16\x2a"),
        (T.WATCH_TOPIC_LIST, b"\x08\x01\x10\x07", T.ERROR, b""),
    ],
)
def test_unsupported_requests_are_answered_at_once(
    broker: Broker, request_type: int, body: bytes, reply_type: int, reply_body: bytes
) -> None:
    with RawClient(broker.address) as client:
        client.handshake()
        client.send_raw(unsupported(request_type, body))
        reply = client.expect_frame(reply_type, timeout=1)
        if reply_type == T.ERROR:
            error = reply.command.error
            assert (error.request_id, error.error) == (7, pb.NotAllowedError)
        else:
            assert unknown_body(reply).startswith(reply_body)
        client.ping()


def test_idle_disk_topics_are_closed_not_deleted(tmp_path: Path) -> None:
    broker = disk_broker(tmp_path, inactive_topic_close_interval_seconds=1)
    try:
        with RawClient(broker.address) as client:
            client.handshake()
            client.create_producer(TOPIC, 1)
            client.produce(1, 0, b"kept")
            client.close_producer(1)
            wait_until(
                lambda: TOPIC not in broker.stats(), message="the idle topic closed", timeout=4
            )
            client.subscribe(TOPIC, "later", 1)  # reopened on use, with its data
            client.flow(1, 1)
            assert client.receive(1, 1)[0].payload == b"kept"
            # A topic with a subscription is not idle: a check now leaves it open.
            closed = broker.close_idle_topics()
            assert closed == []
            assert TOPIC in broker.stats()
    finally:
        broker.stop()


def test_the_inactive_topic_check_does_not_hold_topic_creation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The check asks each open topic whether it is idle. Asked from the broker actor, a slow
    # answer held every topic creation behind it (100-150 ms a pass with 8,000 open topics);
    # now only the topics that answer idle are asked again there (close_idle_topics).
    entered = threading.Event()
    answer = TopicActor.HANDLERS[IsIdle]
    held: list[gevent.event.Event] = []

    def slow_answer(topic: TopicActor, message: IsIdle) -> bool:
        if topic.name == TOPIC:
            held.append(gevent.event.Event())
            entered.set()
            held[-1].wait(WAIT)
        return bool(answer(topic, message))

    monkeypatch.setitem(TopicActor.HANDLERS, IsIdle, slow_answer)
    broker = disk_broker(tmp_path, inactive_topic_close_interval_seconds=0)
    try:
        with RawClient(broker.address) as client:
            client.handshake()
            client.subscribe(TOPIC, "kept", 1)  # a durable subscription: never idle
            client.close_consumer(1)
            closed: list[list[str]] = []
            check = threading.Thread(target=lambda: closed.append(broker.close_idle_topics()))
            check.start()
            assert entered.wait(WAIT), "the check asked the topic"
            client.create_producer(f"{TOPIC}-new", 1)  # a new topic while the answer waits
            assert check.is_alive(), "the check was still waiting for its answer"
            broker._call(lambda _ref: held[0].set())
            check.join(WAIT)
            assert closed == [[]]
    finally:
        broker.stop()


@pytest.mark.parametrize("request_type", sorted(UNSUPPORTED))
def test_every_unsupported_request_gets_its_answer(broker: Broker, request_type: int) -> None:
    request_id_field = UNSUPPORTED[request_type].request_id_field
    body = bytes([request_id_field << 3, 42])  # request_id = 42, nothing else
    with RawClient(broker.address) as client:
        client.handshake()
        client.send_raw(unsupported(request_type, body))
        reply = client.recv_frame(timeout=1)
        expected = UNSUPPORTED[request_type].response_type or T.ERROR
        assert reply.command.type == expected
        if expected == T.ERROR:
            assert (reply.command.error.request_id, reply.command.error.error) == (
                42,
                pb.NotAllowedError,
            )
        else:
            assert unknown_body(reply).startswith(b"\x08\x2a")  # our request id first
        client.ping()
