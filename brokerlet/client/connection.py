"""One TCP connection from the client to a broker.

A :class:`Connection` owns a gevent socket, a :class:`~brokerlet.transport.channel.Channel`
for everything it writes, a reader greenlet that decodes what arrives, and a keep-alive
greenlet. Every producer and consumer placed on that broker shares it, each under an id the
connection hands out. The reader routes SEND_RECEIPT and MESSAGE frames straight to their
producer or consumer (the hot path), and resolves request/response pairs (lookups, PRODUCER,
SUBSCRIBE, closes) through a table of pending requests keyed by request id.

Everything runs on the hub of the thread that created the connection.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import gevent
import gevent.event
import gevent.socket

from brokerlet import __version__
from brokerlet.client.errors import (
    ConnectError,
    PulsarError,
    Timeout,
    error_for_code,
)
from brokerlet.transport.channel import BytesLike, Channel
from brokerlet.transport.protocol import (
    PING_FRAME,
    PONG_FRAME,
    PROTOCOL_VERSION,
    Frame,
    FrameDecoder,
    ProtocolError,
    command_name,
    encode_command,
    pb,
)
from brokerlet.transport.sockopts import configure_socket

__all__ = [
    "ClientContext",
    "Connection",
    "ConnectionOptions",
    "ConsumerHandler",
    "ProducerHandler",
]

log = logging.getLogger("brokerlet.client")

T = pb.BaseCommand

DEFAULT_MAX_MESSAGE_SIZE = 5 * 1024 * 1024
# The client trusts its broker: accept any frame a broker with a large max_message_size
# could send, rather than learn the limit only after the first frame (CONNECTED) arrived.
_MAX_FRAME_SIZE = 128 * 1024 * 1024
_RECV_SIZE = 256 * 1024

# Responses matched to a pending request, with where their request id lives.
_RESPONSES: dict[int, Callable[[pb.BaseCommand], int]] = {
    T.SUCCESS: lambda c: c.success.request_id,
    T.PRODUCER_SUCCESS: lambda c: c.producer_success.request_id,
    T.LOOKUP_RESPONSE: lambda c: c.lookup_response.request_id,
    T.PARTITIONED_METADATA_RESPONSE: lambda c: c.partitioned_metadata_response.request_id,
    T.GET_LAST_MESSAGE_ID_RESPONSE: lambda c: c.get_last_message_id_response.request_id,
}


class ProducerHandler(Protocol):
    """What a connection calls on a producer registered with it (all on the reader greenlet)."""

    def on_receipt(self, receipt: pb.CommandSendReceipt) -> None: ...

    def on_send_error(self, error: pb.CommandSendError) -> None: ...

    def on_closed_by_broker(self, connection: Connection) -> None: ...

    def on_connection_lost(self, connection: Connection) -> None: ...


class ConsumerHandler(Protocol):
    """What a connection calls on a consumer registered with it (all on the reader greenlet)."""

    def on_message(self, message: pb.CommandMessage, payload: bytes) -> None: ...

    def on_closed_by_broker(self, connection: Connection) -> None: ...

    def on_connection_lost(self, connection: Connection) -> None: ...


class ClientContext(Protocol):
    """What producers and consumers need from their client."""

    @property
    def operation_timeout(self) -> float: ...

    def connection_for(self, topic: str) -> Connection:
        """Look the topic up and return a ready connection to the broker that serves it."""
        ...

    def forget(self, owner: object) -> None:
        """Drop a closed producer or consumer from the client's books."""
        ...


@dataclass(frozen=True, slots=True)
class ConnectionOptions:
    """Settings shared by every connection of a client.

    Attributes:
        connection_timeout: seconds for the TCP connect plus the CONNECT/CONNECTED handshake.
        operation_timeout: default seconds a request waits for its response.
        keep_alive_interval: seconds between PINGs; 0 turns keep-alive off.
        so_rcvbuf: fixed SO_RCVBUF (set before connect); 0 keeps autotuning.
    """

    connection_timeout: float
    operation_timeout: float
    keep_alive_interval: float
    so_rcvbuf: int


class Connection:
    """A connection to one broker, shared by the producers and consumers placed there.

    The constructor starts connecting in a greenlet of its own; :meth:`wait_ready` waits for
    the handshake. Once closed (by either side, a socket error or a protocol error) a
    connection stays closed: pending requests fail, and each registered producer and
    consumer is told through ``on_connection_lost`` so it can reconnect elsewhere.

    Args:
        logical_url: the broker URL the lookup named; the client's pool key.
        address: the (host, port) actually dialled (the service URL's when proxying).
        proxy_to_broker_url: sent in CONNECT when ``address`` is a proxy for
            ``logical_url``; None for a direct connection.
        options: timeouts, keep-alive and socket sizes.
        paused: start with reading paused (see :meth:`pause_reading`).
        on_closed: called once, after the connection closed.
    """

    def __init__(
        self,
        *,
        logical_url: str,
        address: tuple[str, int],
        proxy_to_broker_url: str | None,
        options: ConnectionOptions,
        paused: bool = False,
        on_closed: Callable[[Connection], None] | None = None,
    ) -> None:
        self.logical_url = logical_url
        self.address = address
        self.proxy_to_broker_url = proxy_to_broker_url
        self.options = options
        self.producers: dict[int, ProducerHandler] = {}
        self.consumers: dict[int, ConsumerHandler] = {}
        self.protocol_version = 0
        self.max_message_size = DEFAULT_MAX_MESSAGE_SIZE
        self._on_closed = on_closed
        self._request_ids = itertools.count()
        self._producer_ids = itertools.count()
        self._consumer_ids = itertools.count()
        self._requests: dict[int, gevent.event.AsyncResult] = {}
        self._ready = gevent.event.AsyncResult()
        self._handshake_done = False
        self._closed = False
        self._close_error: PulsarError | None = None
        self._closed_event = gevent.event.Event()
        self._resume = gevent.event.Event()
        if not paused:
            self._resume.set()
        self._alive = True  # something arrived since the last keep-alive tick
        self._sock: gevent.socket.socket | None = None
        self._channel: Channel | None = None
        self._greenlet = gevent.spawn(self._run)
        self._greenlet.name = f"brokerlet-client {logical_url}"

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("ready" if self._handshake_done else "connecting")
        return f"<Connection {self.logical_url} {state}>"

    # -- state ---------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether the connection is closed (it never reopens)."""
        return self._closed

    @property
    def paused(self) -> bool:
        """Whether reading is paused."""
        return not self._resume.is_set()

    @property
    def channel(self) -> Channel | None:
        """The outbound channel, once the socket is connected."""
        return self._channel

    def wait_ready(self, timeout: float) -> None:
        """Wait for the handshake to complete.

        Args:
            timeout: seconds to wait; on expiry the connection is closed.

        Raises:
            ConnectError: the connection failed, or the handshake took longer than
                ``timeout`` (the broker's own error, such as AuthenticationError, if it
                refused the CONNECT).
        """
        ready = self._ready
        ready.wait(timeout)
        if not ready.ready():
            error = ConnectError(f"no CONNECTED from {self.logical_url} within {timeout} s")
            self.close(error)
            raise error
        ready.get(block=False)

    # -- ids and requests ----------------------------------------------------------------

    def new_request_id(self) -> int:
        return next(self._request_ids)

    def new_producer_id(self) -> int:
        return next(self._producer_ids)

    def new_consumer_id(self) -> int:
        return next(self._consumer_ids)

    def request(
        self, command: pb.BaseCommand, request_id: int, timeout: float | None = None
    ) -> pb.BaseCommand:
        """Send a command and wait for the response that carries the same request id.

        Args:
            command: the request, with ``request_id`` already set in its body.
            request_id: that request id.
            timeout: seconds to wait; defaults to the operation timeout.

        Returns:
            The response command (SUCCESS, PRODUCER_SUCCESS, LOOKUP_RESPONSE, ...). Errors
            inside lookup responses are left to the caller to interpret.

        Raises:
            PulsarError: the broker answered ERROR (the matching subclass).
            Timeout: no response in time.
            ConnectError: the connection closed first.
        """
        if self._closed:
            raise self._close_error or ConnectError("connection closed")
        if timeout is None:
            timeout = self.options.operation_timeout
        result = gevent.event.AsyncResult()
        self._requests[request_id] = result
        try:
            self.write(encode_command(command))
            # wait() and ready() rather than get(timeout): an outer gevent.Timeout stays
            # the caller's and is not turned into ours.
            result.wait(timeout)
            if not result.ready():
                raise Timeout(
                    f"no answer to {command_name(command.type)} from {self.logical_url} "
                    f"within {timeout} s"
                )
            response: pb.BaseCommand = result.get(block=False)
            return response
        finally:
            self._requests.pop(request_id, None)

    def write(self, data: BytesLike | Sequence[BytesLike]) -> None:
        """Queue bytes for the broker; never blocks. Dropped once the connection closed."""
        channel = self._channel
        if channel is not None:
            channel.write(data)

    # -- reading -------------------------------------------------------------------------

    def pause_reading(self) -> None:
        """Stop taking bytes from the socket, so the kernel buffers fill and the broker
        sees real TCP backpressure.

        A chunk already on its way is held back undecoded until :meth:`resume_reading`.
        PINGs still go out, so the broker keeps the connection open, but its PINGs are not
        answered until reading resumes.
        """
        self._resume.clear()

    def resume_reading(self) -> None:
        """Take bytes from the socket again."""
        # Nothing could be read while paused: do not count the pause as a dead broker.
        self._alive = True
        self._resume.set()

    # -- closing -------------------------------------------------------------------------

    def close(self, error: PulsarError | None = None) -> None:
        """Close the connection; idempotent, never blocks.

        Pending requests fail with ``error``; every registered producer and consumer gets
        ``on_connection_lost``.

        Args:
            error: why; defaults to a ConnectError saying the connection was closed.
        """
        if self._closed:
            return
        self._closed = True
        if error is None:
            error = ConnectError(f"connection to {self.logical_url} closed")
        self._close_error = error
        self._closed_event.set()
        self._resume.set()  # lets a paused reader see the close
        sock = self._sock
        if sock is not None:
            # Wakes the reader with EOF before the channel closes the socket under it.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if self._channel is not None:
            self._channel.close(error)
        elif sock is not None:
            sock.close()
        if not self._ready.ready():
            self._ready.set_exception(error)
        requests = list(self._requests.values())
        self._requests.clear()
        for result in requests:
            result.set_exception(error)
        handlers: list[ProducerHandler | ConsumerHandler] = [
            *self.producers.values(),
            *self.consumers.values(),
        ]
        self.producers.clear()
        self.consumers.clear()
        for handler in handlers:
            try:
                handler.on_connection_lost(self)
            except Exception:
                log.exception("%r: on_connection_lost of %r failed", self, handler)
        if self._on_closed is not None:
            self._on_closed(self)

    # -- the connection greenlet ---------------------------------------------------------

    def _run(self) -> None:
        try:
            sock = self._open_socket()
        except OSError as exc:
            self.close(ConnectError(f"cannot connect to {self.logical_url}: {exc}"))
            return
        if self._closed:  # gave up waiting while the connect was in progress
            sock.close()
            return
        self._sock = sock
        self._channel = Channel(
            sock,
            on_closed=self._channel_closed,
            name=self.logical_url,
        )
        self._channel.write(encode_command(self._connect_command()))
        reason = self._read_loop(sock)
        self.close(ConnectError(f"connection to {self.logical_url} lost: {reason}"))

    def _open_socket(self) -> gevent.socket.socket:
        host, port = self.address
        last_error: OSError = OSError(f"no address for {host}")
        for family, kind, proto, _name, sockaddr in gevent.socket.getaddrinfo(
            host, port, 0, socket.SOCK_STREAM
        ):
            sock = gevent.socket.socket(family, kind, proto)
            try:
                # Before connect: SO_RCVBUF decides the window scale in the handshake.
                configure_socket(sock, rcvbuf=self.options.so_rcvbuf)
                sock.settimeout(self.options.connection_timeout)
                sock.connect(sockaddr)
                sock.settimeout(None)
            except OSError as exc:
                sock.close()
                last_error = exc
                continue
            return sock
        raise last_error

    def _connect_command(self) -> pb.BaseCommand:
        connect = pb.CommandConnect(
            client_version=f"brokerlet-client-{__version__}",
            protocol_version=PROTOCOL_VERSION,
            auth_method_name="none",
        )
        connect.feature_flags.supports_broker_entry_metadata = True
        if self.proxy_to_broker_url is not None:
            connect.proxy_to_broker_url = self.proxy_to_broker_url
        return T(type=T.CONNECT, connect=connect)

    def _channel_closed(self, cause: BaseException | None) -> None:
        if isinstance(cause, PulsarError):
            self.close(cause)
        else:
            self.close(ConnectError(f"connection to {self.logical_url} broke: {cause!r}"))

    def _read_loop(self, sock: gevent.socket.socket) -> str:
        """Receive and dispatch until the connection ends; return why it ended."""
        decoder = FrameDecoder(_MAX_FRAME_SIZE)
        recv = sock.recv
        resume = self._resume
        handle = self._handle_frames
        while not self._closed:
            if not resume.is_set():
                resume.wait()
                continue
            try:
                data = recv(_RECV_SIZE)
            except OSError as exc:
                return f"socket error: {exc}"
            if not data:
                return "closed by the broker"
            self._alive = True
            if not resume.is_set():
                # Paused while this chunk was on its way: hold it until reading resumes.
                resume.wait()
                if self.closed:  # the property: mypy would narrow the attribute
                    break
            try:
                frames = decoder.feed(data)
            except ProtocolError as exc:
                log.warning("%r: %s", self, exc.reason)
                return f"protocol error: {exc.reason}"
            if frames:
                handle(frames)
        return "closed"

    def _keep_alive(self) -> None:
        interval = self.options.keep_alive_interval
        while not self._closed_event.wait(interval):
            # While paused nothing is read, so silence proves nothing; the PINGs still
            # tell the broker we are alive.
            if not self._alive and not self.paused:
                self.close(ConnectError(f"{self.logical_url} did not answer keep-alive"))
                return
            self._alive = False
            self.write(PING_FRAME)

    # -- dispatch (reader greenlet) ------------------------------------------------------

    def _handle_frames(self, frames: list[Frame]) -> None:
        producers = self.producers
        consumers = self.consumers
        for frame in frames:
            command = frame.command
            kind = command.type
            try:
                if kind == T.MESSAGE:
                    message = command.message
                    consumer = consumers.get(message.consumer_id)
                    if consumer is not None and frame.payload is not None:
                        consumer.on_message(message, frame.payload)
                elif kind == T.SEND_RECEIPT:
                    receipt = command.send_receipt
                    producer = producers.get(receipt.producer_id)
                    if producer is not None:
                        producer.on_receipt(receipt)
                else:
                    self._handle_control(command)
            except Exception:
                log.exception("%r: handling %s failed", self, command_name(kind))
            if self._closed:
                return

    def _handle_control(self, command: pb.BaseCommand) -> None:
        kind = command.type
        if not self._handshake_done:
            self._handle_handshake(command)
            return
        request_id_of = _RESPONSES.get(kind)
        if request_id_of is not None:
            if kind == T.PRODUCER_SUCCESS and not command.producer_success.producer_ready:
                return  # queued behind an exclusive producer: a second answer follows
            result = self._requests.get(request_id_of(command))
            if result is not None:
                result.set(command)
        elif kind == T.ERROR:
            error = command.error
            result = self._requests.get(error.request_id)
            if result is not None:
                result.set_exception(error_for_code(error.error, error.message))
        elif kind == T.PING:
            self.write(PONG_FRAME)
        elif kind == T.PONG:
            pass
        elif kind == T.SEND_ERROR:
            producer = self.producers.get(command.send_error.producer_id)
            if producer is not None:
                producer.on_send_error(command.send_error)
        elif kind == T.CLOSE_PRODUCER:
            producer = self.producers.pop(command.close_producer.producer_id, None)
            if producer is not None:
                producer.on_closed_by_broker(self)
        elif kind == T.CLOSE_CONSUMER:
            consumer = self.consumers.pop(command.close_consumer.consumer_id, None)
            if consumer is not None:
                consumer.on_closed_by_broker(self)
        elif kind == T.ACTIVE_CONSUMER_CHANGE:
            log.debug(
                "%r: consumer %d active: %s",
                self,
                command.active_consumer_change.consumer_id,
                command.active_consumer_change.is_active,
            )
        else:
            log.info("%r: ignoring %s from the broker", self, command_name(kind))

    def _handle_handshake(self, command: pb.BaseCommand) -> None:
        kind = command.type
        if kind == T.CONNECTED:
            connected = command.connected
            self.protocol_version = connected.protocol_version
            if connected.HasField("max_message_size"):
                self.max_message_size = connected.max_message_size
            self._handshake_done = True
            log.debug(
                "%r: connected to %s, protocol %d",
                self,
                connected.server_version,
                self.protocol_version,
            )
            if self.options.keep_alive_interval > 0:
                gevent.spawn(self._keep_alive).name = f"keep-alive {self.logical_url}"
            self._ready.set(None)
        elif kind == T.ERROR:
            self.close(error_for_code(command.error.error, command.error.message))
        else:
            self.close(
                ConnectError(f"{command_name(kind)} from {self.logical_url} before CONNECTED")
            )
