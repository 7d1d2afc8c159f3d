"""A minimal raw-socket Pulsar client for tests that need to control every byte.

It speaks through brokerlet's own codec over a plain blocking stdlib socket, so it works
from the test thread while the broker runs on a thread of its own. It does only what the
tests need: the handshake, one-shot producers and consumers, pings, and sending arbitrary
bytes. Every receive has a timeout; nothing here waits forever.
"""

from __future__ import annotations

import itertools
import socket
import ssl
import time
from dataclasses import dataclass

from brokerlet.transport.protocol import (
    PROTOCOL_VERSION,
    Frame,
    FrameDecoder,
    build_entry,
    command_name,
    decode_payload,
    encode_ack,
    encode_command,
    encode_flow,
    encode_send,
    parse_metadata,
    pb,
)

__all__ = ["ConnectionClosed", "RawClient", "ReceivedMessage", "make_entry"]

T = pb.BaseCommand

DEFAULT_TIMEOUT = 2.0
"""Seconds any single wait may take before the test fails."""

# Large enough for any frame a test broker sends; the client is not under test.
_MAX_FRAME = 64 * 1024 * 1024


class ConnectionClosed(Exception):  # noqa: N818 - a state, like ConnectionError's subclasses
    """The broker closed the connection while the client was waiting for a frame."""


@dataclass(frozen=True)
class ReceivedMessage:
    """One MESSAGE delivered to a consumer.

    Attributes:
        entry_id: Where the broker stored it.
        sequence_id: The producer's sequence id, from the message metadata.
        payload: The message body.
    """

    entry_id: int
    sequence_id: int
    payload: bytes
    ledger_id: int = 0


def make_entry(producer_name: str, sequence_id: int, payload: bytes) -> bytes:
    """Build a stored entry (``[size][MessageMetadata][payload]``) for one message."""
    metadata = pb.MessageMetadata(
        producer_name=producer_name,
        sequence_id=sequence_id,
        publish_time=int(time.time() * 1000),
    )
    return build_entry(metadata, payload)


class RawClient:
    """One TCP connection to a broker, driven frame by frame.

    Args:
        address: The broker's (host, port).
        timeout: Default bound, in seconds, of every wait.
        rcvbuf: SO_RCVBUF, set before connecting; 0 keeps the default.
        tls: speak TLS with this client context (the broker's TLS port).
    """

    def __init__(
        self,
        address: tuple[str, int],
        timeout: float = DEFAULT_TIMEOUT,
        rcvbuf: int = 0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.timeout = timeout
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:  # before connect(), or window scaling ignores it
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect(address)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            self.sock = tls.wrap_socket(self.sock, server_hostname=address[0])
        host, port = self.sock.getsockname()[:2]
        self.peer = f"{host}:{port}"
        """This end of the connection, spelled as the broker names it in its logs."""
        self._decoder = FrameDecoder(_MAX_FRAME)
        self._pending: list[Frame] = []
        self._request_ids = itertools.count()
        self._producer_names: dict[int, str] = {}

    # Bytes and frames.

    def send_raw(self, data: bytes) -> None:
        """Write bytes exactly as given."""
        self.sock.sendall(data)

    def send_command(self, command: pb.BaseCommand) -> None:
        """Frame and write a command that carries no payload."""
        self.send_raw(encode_command(command))

    def recv_frame(self, timeout: float | None = None) -> Frame:
        """Return the next frame from the broker.

        Args:
            timeout: Seconds to wait; the client's default if None.

        Raises:
            ConnectionClosed: The broker closed the connection first.
            TimeoutError: Nothing complete arrived in time.
        """
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not self._pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no frame from the broker in time")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError as error:
                raise ConnectionClosed(f"connection reset: {error}") from None
            if not data:
                raise ConnectionClosed("the broker closed the connection")
            self._pending.extend(self._decoder.feed(data))
        return self._pending.pop(0)

    def expect_frame(self, kind: int, timeout: float | None = None) -> Frame:
        """Return the next frame, whose command must be of type ``kind``.

        Failover's ACTIVE_CONSUMER_CHANGE notices, which the broker sends unasked, are
        skipped unless asked for."""
        frame = self.recv_frame(timeout)
        while frame.command.type == T.ACTIVE_CONSUMER_CHANGE != kind:
            frame = self.recv_frame(timeout)
        got = frame.command.type
        if got != kind:
            raise AssertionError(
                f"expected {command_name(kind)}, got {command_name(got)}: {frame.command}"
            )
        return frame

    def expect(self, kind: int, timeout: float | None = None) -> pb.BaseCommand:
        """Return the next command, which must be of type ``kind``."""
        return self.expect_frame(kind, timeout).command

    def wait_closed(self, timeout: float | None = None) -> list[Frame]:
        """Wait until the broker closes the connection.

        Returns:
            The frames that arrived before the close.

        Raises:
            TimeoutError: The connection was still open when the time ran out.
        """
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        frames: list[Frame] = []
        while True:
            try:
                frames.append(self.recv_frame(max(0.0, deadline - time.monotonic())))
            except ConnectionClosed:
                return frames

    def close(self) -> None:
        """Close this end; idempotent."""
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # Protocol steps.

    def _request_id(self) -> int:
        return next(self._request_ids)

    def handshake(self) -> pb.CommandConnected:
        """Send CONNECT and return the broker's CONNECTED."""
        self.send_command(
            T(
                type=T.CONNECT,
                connect=pb.CommandConnect(
                    client_version="brokerlet-tests-rawclient",
                    protocol_version=PROTOCOL_VERSION,
                ),
            )
        )
        return self.expect(T.CONNECTED).connected

    def ping(self) -> None:
        """Send PING and wait for the PONG: proof the connection is alive and in sync."""
        self.send_command(T(type=T.PING, ping=pb.CommandPing()))
        self.expect(T.PONG)

    def create_producer(self, topic: str, producer_id: int) -> str:
        """Register a producer and return the name the broker gave it."""
        self.send_command(
            T(
                type=T.PRODUCER,
                producer=pb.CommandProducer(
                    topic=topic, producer_id=producer_id, request_id=self._request_id()
                ),
            )
        )
        name = self.expect(T.PRODUCER_SUCCESS).producer_success.producer_name
        self._producer_names[producer_id] = name
        return name

    def close_producer(self, producer_id: int) -> None:
        """Close a producer and wait for the broker's SUCCESS."""
        close = pb.CommandCloseProducer(producer_id=producer_id, request_id=self._request_id())
        self.send_command(T(type=T.CLOSE_PRODUCER, close_producer=close))
        self.expect(T.SUCCESS)

    def send_frame(self, producer_id: int, sequence_id: int, payload: bytes) -> bytes:
        """The SEND frame, with a correct checksum, for one message of a producer.

        The producer need not exist, so tests can also build SENDs the broker must refuse.
        """
        name = self._producer_names.get(producer_id, f"unknown-{producer_id}")
        entry = make_entry(name, sequence_id, payload)
        header, body = encode_send(producer_id, sequence_id, 1, entry)
        return header + body

    def produce(self, producer_id: int, sequence_id: int, payload: bytes) -> int:
        """Send one message and wait for its receipt.

        Returns:
            The entry id the broker stored it at.
        """
        self.send_raw(self.send_frame(producer_id, sequence_id, payload))
        receipt = self.expect(T.SEND_RECEIPT).send_receipt
        assert (receipt.producer_id, receipt.sequence_id) == (producer_id, sequence_id)
        return receipt.message_id.entry_id

    def subscribe(
        self,
        topic: str,
        subscription: str,
        consumer_id: int,
        *,
        initial_position: int = pb.CommandSubscribe.Earliest,
        sub_type: int = pb.CommandSubscribe.Exclusive,
        consumer_name: str = "",
        priority_level: int = 0,
    ) -> None:
        """Subscribe and wait for the broker's SUCCESS (`subscribe_command`'s arguments)."""
        command = self.subscribe_command(
            topic,
            subscription,
            consumer_id,
            request_id=self._request_id(),
            initial_position=initial_position,
            sub_type=sub_type,
            consumer_name=consumer_name,
            priority_level=priority_level,
        )
        self.send_command(command)
        self.expect(T.SUCCESS)

    @staticmethod
    def subscribe_command(
        topic: str,
        subscription: str,
        consumer_id: int,
        *,
        request_id: int,
        initial_position: int = pb.CommandSubscribe.Earliest,
        sub_type: int = pb.CommandSubscribe.Exclusive,
        consumer_name: str = "",
        priority_level: int = 0,
    ) -> pb.BaseCommand:
        """The SUBSCRIBE command, for a test that sends it without waiting for the answer.

        ``consumer_name`` and ``priority_level`` go on the wire only when given.
        """
        subscribe = pb.CommandSubscribe(
            topic=topic,
            subscription=subscription,
            sub_type=sub_type,  # type: ignore[arg-type]
            consumer_id=consumer_id,
            request_id=request_id,
            initial_position=initial_position,  # type: ignore[arg-type]
        )
        if consumer_name:
            subscribe.consumer_name = consumer_name
        if priority_level:
            subscribe.priority_level = priority_level
        return T(type=T.SUBSCRIBE, subscribe=subscribe)

    def flow(self, consumer_id: int, permits: int) -> None:
        """Grant a consumer ``permits`` more messages."""
        self.send_raw(encode_flow(consumer_id, permits))

    def ack(self, consumer_id: int, entry_ids: list[int], ledger_id: int) -> None:
        """Acknowledge entries individually (no reply: acks are fire-and-forget)."""
        self.send_raw(encode_ack(consumer_id, [(ledger_id, e) for e in entry_ids]))

    def close_consumer(self, consumer_id: int) -> None:
        """Close a consumer and wait for the broker's SUCCESS."""
        close = pb.CommandCloseConsumer(consumer_id=consumer_id, request_id=self._request_id())
        self.send_command(T(type=T.CLOSE_CONSUMER, close_consumer=close))
        self.expect(T.SUCCESS)

    def receive(
        self, consumer_id: int, count: int, timeout: float | None = None
    ) -> list[ReceivedMessage]:
        """Wait for ``count`` MESSAGEs for one consumer (permits must already be granted)."""
        messages: list[ReceivedMessage] = []
        while len(messages) < count:
            frame = self.expect_frame(T.MESSAGE, timeout)
            message = frame.command.message
            assert message.consumer_id == consumer_id
            assert frame.payload is not None
            section = decode_payload(frame.payload)
            assert section.checksum_ok
            metadata = parse_metadata(section.entry)
            metadata_size = int.from_bytes(section.entry[:4], "big")
            messages.append(
                ReceivedMessage(
                    entry_id=message.message_id.entry_id,
                    sequence_id=metadata.sequence_id,
                    payload=section.entry[4 + metadata_size :],
                    ledger_id=message.message_id.ledger_id,
                )
            )
        return messages
