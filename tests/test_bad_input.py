"""Bad input gets a clear error and loses nothing.

Each test sends one kind of bad input on a raw connection and checks three things: what
the broker does with that connection (closes it, or answers and keeps it), that it logs why,
naming the peer, and that a well-behaved connection opened *before* the bad input (the
witness) is untouched: it still answers, still produces, and every message stored before and
after is consumable from Earliest.

The broker runs on its own thread; the clients here are plain blocking sockets with
timeouts, so every wait is bounded and nothing sleeps to synchronise.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import pulsar
import pytest

from brokerlet import Broker
from brokerlet.testing.rawclient import RawClient, make_entry
from brokerlet.testing.waiting import wait_until
from brokerlet.transport.protocol import encode_command, encode_send, pb
from brokerlet.transport.server import FRAME_PADDING

T = pb.BaseCommand

TOPIC = "persistent://public/default/bad-input"
WAIT = 2.0
"""Bound, in seconds, of every wait for the broker."""

SMALL_MAX_MESSAGE = 1024
"""The smallest max_message_size settings allow; keeps the frame-limit tests small."""


# Fixtures and helpers.


@pytest.fixture
def broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    """A fresh broker on an ephemeral port; indirect parametrisation passes overrides."""
    overrides: dict[str, Any] = getattr(request, "param", {})
    running = Broker(port=0, host="127.0.0.1", **overrides).start()
    try:
        yield running
    finally:
        running.stop()


class LogWatch:
    """Checks what caplog captured from the broker's thread, waiting for it if need be.

    The broker logs from its own thread, so a record may land in caplog a moment after the
    client saw its effect. Each capture wakes a waiting test; nothing polls.
    """

    def __init__(self, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
        self._caplog = caplog
        self._changed = threading.Condition()
        capture = caplog.handler
        capture_emit = capture.emit

        def emit(record: logging.LogRecord) -> None:
            capture_emit(record)
            with self._changed:
                self._changed.notify_all()

        monkeypatch.setattr(capture, "emit", emit)

    def _matching(self, fragments: tuple[str, ...]) -> list[logging.LogRecord]:
        return [
            record
            for record in list(self._caplog.records)
            if record.name.startswith("brokerlet")
            and all(f in record.getMessage() for f in fragments)
        ]

    def assert_logged(self, level: int, *fragments: str) -> None:
        """Wait until caplog holds a brokerlet record with every fragment, at ``level`` or above."""
        with self._changed:
            found = self._changed.wait_for(
                lambda: any(r.levelno >= level for r in self._matching(fragments)), WAIT
            )
        if not found:
            raise AssertionError(
                f"no brokerlet record at {logging.getLevelName(level)} or above with "
                f"{fragments} within {WAIT} s; captured: {self._caplog.messages}"
            )


@pytest.fixture
def log_watch(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> LogWatch:
    """The broker's INFO and above, as caplog captures them."""
    caplog.set_level(logging.INFO, logger="brokerlet")
    return LogWatch(caplog, monkeypatch)


def assert_disconnected(bad: RawClient, watch: LogWatch, reason: str) -> None:
    """The broker closed ``bad`` without answering and logged a warning naming it and why."""
    assert bad.wait_closed(WAIT) == []
    watch.assert_logged(logging.WARNING, "closing connection from", bad.peer, reason)


def message(index: int) -> bytes:
    return f"message {index}".encode()


class Witness:
    """A well-behaved connection that stores messages before the bad input arrives.

    It has a producer and a consumer on :data:`TOPIC`; its consumer grants no permits until
    :meth:`check_intact`, so everything stored stays with the broker until then.
    """

    PRODUCER_ID = 1
    CONSUMER_ID = 1

    def __init__(self, broker: Broker, count: int) -> None:
        self.broker = broker
        self.client = RawClient(broker.address)
        self.client.handshake()
        self.client.create_producer(TOPIC, self.PRODUCER_ID)
        self.client.subscribe(TOPIC, "witness", self.CONSUMER_ID)
        self.stored: list[bytes] = []
        self._next_sequence = 0
        for _ in range(count):
            self.produce()

    def produce(self) -> None:
        """Store one more message and check it went to the next entry."""
        payload = message(self._next_sequence)
        entry_id = self.client.produce(self.PRODUCER_ID, self._next_sequence, payload)
        assert entry_id == len(self.stored)
        self.stored.append(payload)
        self._next_sequence += 1

    def expect_stored(self, payload: bytes) -> None:
        """Note a message another connection stored on the topic since."""
        self.stored.append(payload)

    def check_intact(self, more: int = 2) -> None:
        """The connection still works and every stored message is still there, in order."""
        self.client.ping()
        for _ in range(more):
            self.produce()
        total = len(self.stored)
        stats = self.broker.topic_stats(TOPIC)
        assert stats is not None
        assert (stats["msgInCounter"], stats["lastEntryId"]) == (total, total - 1)

        self.client.flow(self.CONSUMER_ID, total)
        received = self.client.receive(self.CONSUMER_ID, total)
        assert [m.payload for m in received] == self.stored
        assert [m.entry_id for m in received] == list(range(total))

        with RawClient(self.broker.address) as late:
            late.handshake()
            late.subscribe(TOPIC, "late", 1, initial_position=pb.CommandSubscribe.Earliest)
            late.flow(1, total)
            assert [m.payload for m in late.receive(1, total)] == self.stored

    def close(self) -> None:
        self.client.close()


@pytest.fixture
def witness(broker: Broker) -> Iterator[Witness]:
    """Three messages stored by a good connection before the test's bad input."""
    good = Witness(broker, count=3)
    try:
        yield good
    finally:
        good.close()


def frame(command_bytes: bytes, trailer: bytes = b"") -> bytes:
    """A frame around arbitrary command bytes (valid or not) and anything after them."""
    total = 4 + len(command_bytes) + len(trailer)
    return struct.pack(">II", total, len(command_bytes)) + command_bytes + trailer


def varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def padded_ping(total_size: int) -> bytes:
    """A PING frame whose total_size is exactly ``total_size``.

    The padding is an unknown length-delimited field, which protobuf skips, so the command
    is a valid PING of any size.
    """
    ping = T(type=T.PING, ping=pb.CommandPing()).SerializeToString()
    tag = varint((4000 << 3) | 2)
    # The command is total_size - 4 bytes: ping + tag + varint(n) + n bytes of padding.
    room = total_size - 4 - len(ping) - len(tag)
    n = room - 1
    while n + len(varint(n)) != room:
        n -= 1
    command = ping + tag + varint(n) + b"\0" * n
    result = frame(command)
    assert struct.unpack_from(">I", result)[0] == total_size
    return result


def serialized(command: pb.BaseCommand) -> bytes:
    """Command bytes without protobuf's required-field check, so they can be incomplete."""
    return command.SerializePartialToString()


# 1. Frames over the size limit.

SMALL_LIMIT = SMALL_MAX_MESSAGE + FRAME_PADDING


@pytest.mark.parametrize("broker", [{"max_message_size": SMALL_MAX_MESSAGE}], indirect=True)
def test_frame_at_the_size_limit_is_accepted(broker: Broker) -> None:
    with RawClient(broker.address) as client:
        client.handshake()
        client.send_raw(padded_ping(SMALL_LIMIT))
        client.expect(T.PONG)
        client.ping()


@pytest.mark.parametrize("broker", [{"max_message_size": SMALL_MAX_MESSAGE}], indirect=True)
@pytest.mark.parametrize("size", [SMALL_LIMIT + 1, 2**32 - 1], ids=["limit+1", "4GiB"])
def test_frame_over_the_size_limit_disconnects(
    broker: Broker,
    witness: Witness,
    log_watch: LogWatch,
    size: int,
) -> None:
    with RawClient(broker.address) as bad:
        bad.handshake()
        # Only the size header and a little of the body: the broker must refuse the frame
        # on its header instead of buffering up to 4 GiB first.
        bad.send_raw(struct.pack(">I", size) + b"\0" * 64)
        assert_disconnected(
            bad, log_watch, f"frame of {size} bytes exceeds the limit of {SMALL_LIMIT}"
        )
    witness.check_intact()


def test_the_limit_is_max_message_size_plus_padding(broker: Broker) -> None:
    with RawClient(broker.address) as client:
        connected = client.handshake()
        assert connected.max_message_size == broker.settings.max_message_size
        client.send_raw(padded_ping(broker.settings.max_message_size + FRAME_PADDING))
        client.expect(T.PONG)


# 2. A truncated frame, then the peer goes away.


def _truncated_send(client: RawClient) -> bytes:
    client.create_producer(TOPIC, 7)
    return client.send_frame(7, 0, b"never stored")[:-1]


@pytest.mark.parametrize(
    "cut",
    ["inside the size", "inside the command", "inside the payload"],
)
def test_truncated_frame_then_close_is_logged(
    broker: Broker,
    witness: Witness,
    log_watch: LogWatch,
    cut: str,
) -> None:
    with RawClient(broker.address) as bad:
        bad.handshake()
        if cut == "inside the size":
            partial = b"\0\0"
        elif cut == "inside the command":
            partial = encode_command(T(type=T.PING, ping=pb.CommandPing()))[:-1]
        else:
            partial = _truncated_send(bad)
        bad.send_raw(partial)
        bad.sock.shutdown(socket.SHUT_WR)
        # The broker closes its side too once it has seen the half frame and the end.
        assert bad.wait_closed(WAIT) == []
    log_watch.assert_logged(
        logging.INFO,
        f"connection from {bad.peer} closed",
        "mid-frame",
        f"({len(partial)} bytes buffered)",
    )
    witness.check_intact()


# 3. Garbage that is not the Pulsar protocol at all.

GARBAGE = {
    "http request": (
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: curl/8.5.0\r\n\r\n",
        f"frame of {int.from_bytes(b'GET ', 'big')} bytes exceeds the limit",
    ),
    "tls client hello": (
        bytes.fromhex("160301020001000001fc0303") + b"\x5a" * 32,
        f"frame of {int.from_bytes(bytes.fromhex('16030102'), 'big')} bytes exceeds the limit",
    ),
    "frame too small": (b"\0\0\0\x02\xab\xcd", "frame size 2 is too small"),
    "command larger than frame": (
        struct.pack(">II", 8, 100) + b"\x08\x12\x92\x01",
        "command of 100 bytes does not fit in a frame of 8 bytes",
    ),
}


@pytest.mark.parametrize("garbage", GARBAGE.keys())
def test_garbage_disconnects(
    broker: Broker,
    witness: Witness,
    log_watch: LogWatch,
    garbage: str,
) -> None:
    data, reason = GARBAGE[garbage]
    with RawClient(broker.address) as bad:
        bad.send_raw(data)
        assert_disconnected(bad, log_watch, reason)
    witness.check_intact()


# 4. Commands protobuf cannot decode, or decodes into something incomplete.

UNDECODABLE = {
    "not protobuf": (b"\xff\xff\xff\xff\xff", "undecodable"),
    "varint cut short": (b"\x08\x92", "undecodable"),
    "garbage inside the body": (b"\x08\x12\x92\x01\x03\xff\xff\xff", "undecodable PING command"),
    # protobuf skips a field whose wire type does not match, so the body is simply absent.
    "body of the wrong wire type": (b"\x08\x12\x90\x01\x05", "PING without its body"),
    "no type": (serialized(T(ping=pb.CommandPing())), "command has no type"),
    "no body": (serialized(T(type=T.PRODUCER)), "PRODUCER without its body"),
    "body missing required fields": (
        serialized(T(type=T.PRODUCER, producer=pb.CommandProducer(producer_id=1))),
        "PRODUCER command is missing required fields",
    ),
}


@pytest.mark.parametrize("command", UNDECODABLE.keys())
def test_undecodable_command_disconnects(
    broker: Broker,
    witness: Witness,
    log_watch: LogWatch,
    command: str,
) -> None:
    command_bytes, reason = UNDECODABLE[command]
    with RawClient(broker.address) as bad:
        bad.handshake()
        bad.send_raw(frame(command_bytes))
        assert_disconnected(bad, log_watch, reason)
    witness.check_intact()


def test_bytes_after_a_command_without_payload_disconnect(
    broker: Broker, witness: Witness, log_watch: LogWatch
) -> None:
    ping = T(type=T.PING, ping=pb.CommandPing()).SerializeToString()
    with RawClient(broker.address) as bad:
        bad.handshake()
        bad.send_raw(frame(ping, trailer=b"extra"))
        assert_disconnected(bad, log_watch, "5 unexpected bytes after a PING command")
    witness.check_intact()


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"", "entry of 0 bytes is too short"),
        (struct.pack(">I", 1000) + b"short", "metadata size 1000 runs past the end"),
    ],
    ids=["empty", "metadata size past the end"],
)
def test_malformed_send_payload_disconnects(
    broker: Broker,
    witness: Witness,
    log_watch: LogWatch,
    payload: bytes,
    reason: str,
) -> None:
    with RawClient(broker.address) as bad:
        bad.handshake()
        bad.create_producer(TOPIC, 7)
        send = T(type=T.SEND, send=pb.CommandSend(producer_id=7, sequence_id=0))
        bad.send_raw(frame(send.SerializeToString(), trailer=payload))
        assert_disconnected(bad, log_watch, f"malformed SEND payload: {reason}")
    witness.check_intact()


# 5. Command types the protocol does not define.


@pytest.mark.parametrize("type_value", [1, 99, 100_000])
def test_unknown_command_type_disconnects_naming_it(
    broker: Broker,
    witness: Witness,
    log_watch: LogWatch,
    type_value: int,
) -> None:
    with RawClient(broker.address) as bad:
        bad.handshake()
        bad.send_raw(frame(b"\x08" + varint(type_value)))
        assert_disconnected(bad, log_watch, f"unknown command type {type_value}")
    witness.check_intact()


# 6. Commands before CONNECT.

BEFORE_CONNECT = {
    "PRODUCER": T(
        type=T.PRODUCER,
        producer=pb.CommandProducer(topic=TOPIC, producer_id=1, request_id=1),
    ),
    "SUBSCRIBE": T(
        type=T.SUBSCRIBE,
        subscribe=pb.CommandSubscribe(
            topic=TOPIC,
            subscription="early",
            sub_type=pb.CommandSubscribe.Exclusive,
            consumer_id=1,
            request_id=1,
        ),
    ),
    "LOOKUP": T(type=T.LOOKUP, lookup=pb.CommandLookupTopic(topic=TOPIC, request_id=1)),
    "FLOW": T(type=T.FLOW, flow=pb.CommandFlow(consumer_id=1, message_permits=10)),
}


@pytest.mark.parametrize("name", BEFORE_CONNECT.keys())
def test_command_before_connect_disconnects(
    broker: Broker,
    witness: Witness,
    log_watch: LogWatch,
    name: str,
) -> None:
    with RawClient(broker.address) as bad:
        bad.send_command(BEFORE_CONNECT[name])
        # No PRODUCER_SUCCESS, no LOOKUP_RESPONSE, nothing: just the close.
        assert_disconnected(bad, log_watch, f"{name} before CONNECT")
    witness.check_intact()


def test_send_before_connect_disconnects(
    broker: Broker, witness: Witness, log_watch: LogWatch
) -> None:
    with RawClient(broker.address) as bad:
        bad.send_raw(bad.send_frame(1, 0, b"too early"))
        # The reason names SEND; no producer can exist before CONNECT.
        assert_disconnected(bad, log_watch, "SEND")
    witness.check_intact()


def test_second_connect_disconnects(broker: Broker, witness: Witness, log_watch: LogWatch) -> None:
    with RawClient(broker.address) as bad:
        bad.handshake()
        again = pb.CommandConnect(client_version="again", protocol_version=20)
        bad.send_command(T(type=T.CONNECT, connect=again))
        assert_disconnected(bad, log_watch, "a second CONNECT")
    witness.check_intact()


# 7. SEND for a producer the connection does not have.


@pytest.mark.parametrize("history", ["never created", "closed before"])
def test_send_for_unknown_producer_disconnects(
    broker: Broker,
    witness: Witness,
    log_watch: LogWatch,
    history: str,
) -> None:
    with RawClient(broker.address) as bad:
        bad.handshake()
        bad.create_producer(TOPIC, 3)
        if history == "closed before":
            bad.close_producer(3)
            producer_id = 3
        else:
            producer_id = 9
        bad.send_raw(bad.send_frame(producer_id, 0, b"must not be stored"))
        assert_disconnected(bad, log_watch, f"SEND for unknown producer {producer_id}")
    # check_intact compares the whole topic, so a stored stray message would show.
    witness.check_intact()


# 8. FLOW for a consumer the connection does not have: warned about, not fatal.


@pytest.mark.parametrize(
    "history", ["never subscribed", "closed before", "another connection's id"]
)
def test_flow_for_unknown_consumer_is_ignored_with_a_warning(
    broker: Broker,
    witness: Witness,
    log_watch: LogWatch,
    history: str,
) -> None:
    with RawClient(broker.address) as client:
        client.handshake()
        if history == "closed before":
            client.subscribe(TOPIC, "closed", 5)
            client.close_consumer(5)
            consumer_id = 5
        elif history == "another connection's id":
            # Consumer ids are per connection: this must not reach the witness's consumer.
            consumer_id = Witness.CONSUMER_ID
        else:
            consumer_id = 42
        client.flow(consumer_id, 100)
        client.ping()
        log_watch.assert_logged(
            logging.WARNING,
            client.peer,
            f"FLOW for unknown consumer {consumer_id}",
        )
        client.ping()
    witness.check_intact()


# 9. A SEND whose checksum does not match: that message fails, nothing else does.


def _corrupt(send_frame: bytes, how: str) -> bytes:
    """Damage a SEND frame so its CRC-32C no longer matches its entry."""
    damaged = bytearray(send_frame)
    if how == "payload bit flipped":
        damaged[-1] ^= 0x01
    else:
        # The checksum is the 4 bytes after the 0x0e01 magic, which follows the command.
        command_size = struct.unpack_from(">I", damaged, 4)[0]
        checksum_at = 8 + command_size + 2
        damaged[checksum_at : checksum_at + 4] = bytes(
            b ^ 0xFF for b in damaged[checksum_at : checksum_at + 4]
        )
    return bytes(damaged)


@pytest.mark.parametrize("how", ["payload bit flipped", "wrong checksum"])
@pytest.mark.parametrize("writes", ["separate writes", "one write"])
def test_bad_checksum_fails_only_that_send(
    broker: Broker,
    witness: Witness,
    log_watch: LogWatch,
    how: str,
    writes: str,
) -> None:
    next_entry = len(witness.stored)
    with RawClient(broker.address) as client:
        client.handshake()
        client.create_producer(TOPIC, 3)
        bad = _corrupt(client.send_frame(3, 10, b"corrupted on the way"), how)
        good = client.send_frame(3, 11, b"arrived intact")
        if writes == "one write":
            client.send_raw(bad + good)
        else:
            client.send_raw(bad)

        error = client.expect(T.SEND_ERROR).send_error
        assert (error.producer_id, error.sequence_id, error.error) == (3, 10, pb.ChecksumError)

        if writes == "separate writes":
            client.send_raw(good)
        receipt = client.expect(T.SEND_RECEIPT).send_receipt
        assert (receipt.producer_id, receipt.sequence_id) == (3, 11)
        assert receipt.message_id.entry_id == next_entry
        client.ping()
    log_watch.assert_logged(logging.WARNING, client.peer, "checksum mismatch on SEND 10")
    witness.expect_stored(b"arrived intact")
    witness.check_intact()


# 10. Keep-alive.


def test_ping_is_answered_with_pong(broker: Broker) -> None:
    with RawClient(broker.address) as client:
        client.handshake()
        for _ in range(3):
            client.ping()


def test_a_socket_closed_while_its_reader_waits_ends_the_connection(broker: Broker) -> None:
    # After a short read the reader waits for readability before its next recv
    # (server.Server._receive). A close from another greenlet, as the channel's on a failed
    # send, must cancel that wait as it cancels gevent's recv, not leave the reader parked.
    with RawClient(broker.address) as client:
        client.handshake()
        client.ping()  # the reader has read a short chunk and waits again
        server = broker._server
        assert server is not None
        assert broker._call(lambda _ref: server.connection_count) == 1
        broker._call(lambda _ref: [sock.close() for sock in list(server._connections)])
        assert client.wait_closed(timeout=WAIT) == []
        wait_until(
            lambda: broker._call(lambda _ref: server.connection_count) == 0,
            message="the reader of the closed socket is still running",
            timeout=WAIT,
        )
    with RawClient(broker.address) as later:  # the listener is untouched
        later.handshake()
        later.ping()


KEEP_ALIVE = {"keep_alive_interval_seconds": 1}


@pytest.mark.parametrize("broker", [KEEP_ALIVE], indirect=True)
def test_idle_client_that_answers_pings_stays_connected(broker: Broker) -> None:
    with RawClient(broker.address) as client:
        client.handshake()
        for _ in range(2):
            idle_since = time.monotonic()
            client.expect(T.PING, timeout=2.5)
            # Pinged for being idle an interval, not at once.
            assert time.monotonic() - idle_since >= 0.9
            client.send_command(T(type=T.PONG, pong=pb.CommandPong()))
        client.ping()


@pytest.mark.parametrize("broker", [KEEP_ALIVE], indirect=True)
def test_a_busy_connection_is_not_pinged(broker: Broker) -> None:
    # The keep-alive timer ticks every interval; a tick that heard a frame since the last
    # one sends nothing (server._KeepAlive). Two and a half intervals of frames 0.3 s apart.
    with RawClient(broker.address) as client:
        client.handshake()
        busy_until = time.monotonic() + 2.5
        while time.monotonic() < busy_until:
            client.ping()  # a PING from the broker here would fail expect(PONG)
            with pytest.raises(TimeoutError):
                client.recv_frame(timeout=0.3)


@pytest.mark.parametrize("broker", [KEEP_ALIVE], indirect=True)
def test_client_that_never_answers_a_ping_is_disconnected(
    broker: Broker, log_watch: LogWatch
) -> None:
    with RawClient(broker.address) as silent:
        silent.handshake()
        silent.create_producer(TOPIC, 1)
        stored = [message(i) for i in range(3)]
        for sequence_id, payload in enumerate(stored):
            silent.produce(1, sequence_id, payload)

        silent.expect(T.PING, timeout=2.5)
        pinged_at = time.monotonic()
        assert silent.wait_closed(timeout=2.5) == []
        # Closed for the missing answer, one interval after the ping, not before.
        assert time.monotonic() - pinged_at >= 0.9
    log_watch.assert_logged(
        logging.INFO,
        f"connection from {silent.peer} closed",
        "no response to keep-alive",
    )
    # What the silent connection stored outlives it.
    with RawClient(broker.address) as later:
        later.handshake()
        later.subscribe(TOPIC, "after", 1, initial_position=pb.CommandSubscribe.Earliest)
        later.flow(1, 10)
        assert [m.payload for m in later.receive(1, 3)] == stored
        later.create_producer(TOPIC, 2)
        assert later.produce(2, 0, b"after the disconnect") == 3


# Bad numbers inside well-formed commands.


def test_send_with_a_negative_message_count_cannot_credit_permits(
    broker: Broker, log_watch: LogWatch
) -> None:
    with RawClient(broker.address) as producer:
        producer.handshake()
        producer.create_producer(TOPIC, 1)
        bad_header, bad_entry = encode_send(1, 0, -5, make_entry("p", 0, b"claims -5 messages"))
        producer.send_raw(bad_header + bad_entry)
        # A malformed SEND: nothing stored, the connection closed with the reason logged.
        assert_disconnected(producer, log_watch, "malformed SEND: num_messages -5")
    with RawClient(broker.address) as producer:
        producer.handshake()
        producer.create_producer(TOPIC, 1)
        for sequence_id in range(1, 4):
            producer.produce(1, sequence_id, message(sequence_id))

    with RawClient(broker.address) as consumer:
        consumer.handshake()
        consumer.subscribe(TOPIC, "one-permit", 1)
        consumer.flow(1, 1)
        consumer.receive(1, 1)
        # The MESSAGE left after its permit was charged, so the balance is final for now.
        stats = broker.topic_stats(TOPIC)
        assert stats is not None
        (consumer_stats,) = stats["subscriptions"]["one-permit"]["consumers"]
        assert consumer_stats["availablePermits"] == 0
        # One message per stored entry, whatever the broker did with the bad one.
        assert stats["msgInCounter"] == stats["lastEntryId"] + 1


# The same guarantees seen from the official client.


@pytest.mark.official
@pytest.mark.parametrize(
    "bad_input",
    [
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        struct.pack(">I", 2**32 - 1),
        frame(b"\x08\x63"),
    ],
    ids=["http request", "oversized frame", "unknown command type"],
)
def test_official_client_is_untouched_by_a_bad_connection(
    broker: Broker, log_watch: LogWatch, bad_input: bytes
) -> None:
    quiet = logging.getLogger("tests.pulsar-client")
    quiet.setLevel(logging.WARNING)
    client = pulsar.Client(broker.service_url, operation_timeout_seconds=5, logger=quiet)
    try:
        producer = client.create_producer(TOPIC)
        consumer = client.subscribe(
            TOPIC, "official", initial_position=pulsar.InitialPosition.Earliest
        )
        for index in range(3):
            producer.send(message(index))

        with RawClient(broker.address) as bad:
            if bad_input.startswith(b"GET"):
                bad.send_raw(bad_input)
            else:
                bad.handshake()
                bad.send_raw(bad_input)
            assert bad.wait_closed(WAIT) == []
        log_watch.assert_logged(logging.WARNING, "closing connection from", bad.peer)

        for index in range(3, 5):
            producer.send(message(index))
        received = [consumer.receive(timeout_millis=int(WAIT * 1000)) for _ in range(5)]
        assert [m.data() for m in received] == [message(i) for i in range(5)]
    finally:
        client.close()
