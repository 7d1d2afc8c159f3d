"""The listening side: accept connections, read and decode, hand frames to connection actors.

Each accepted connection gets a :class:`~brokerlet.transport.channel.Channel` for its outbound
bytes and a connection actor for its protocol state; the greenlet that accepted it becomes its
reader: it receives, decodes, and sends one message per received chunk of frames. The reader
is kept alive by a timer that ticks every ``keep_alive_interval_seconds``: a tick after an
interval without a complete frame sends a PING, and the next such tick closes the connection.
Only whole frames count, so a peer trickling bytes, or holding an unfinished frame, is closed
as a silent one would be; a peer that sends no CONNECT by the first tick is closed too.
``broker_max_connections`` and ``broker_max_connections_per_ip`` bound how many are open.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import socket as stdlib_socket
import ssl
import time
from collections import Counter
from collections.abc import Callable, Mapping

import gevent
import pykka
from gevent import socket
from gevent.server import StreamServer

from brokerlet.actors._conflate import ConflatedTell
from brokerlet.actors._loop import TIME_SLICE, take_turn
from brokerlet.actors.broker import BrokerActor
from brokerlet.actors.connection import ConnectionActor
from brokerlet.actors.eventloop import EventLoopActor
from brokerlet.actors.messages import ConnectionLost, Received, WritabilityChanged
from brokerlet.actors.topic import TopicActor
from brokerlet.config import Settings
from brokerlet.dispatch.consumer import ConnectionHandle
from brokerlet.metadata import MetadataStore
from brokerlet.schema import SchemaRegistry
from brokerlet.security.service import Security
from brokerlet.transport.channel import Channel, is_tls_socket
from brokerlet.transport.protocol import PING_FRAME, FrameDecoder, ProtocolError, pb
from brokerlet.transport.sockopts import configure_socket
from brokerlet.transport.tls import TlsHandshakeFailed, peer_certificate, wrap_server_socket

__all__ = ["FRAME_PADDING", "Server"]

log = logging.getLogger(__name__)

FRAME_PADDING = 10 * 1024
"""Room for the command and metadata on top of ``max_message_size`` in one frame."""

RECV_BYTES = 16384
"""Most bytes handled per read. Decoding a full buffer is one run of the reader greenlet and
its frames one actor message: 16 KiB is some 90 small SENDs, about half a millisecond
(64 KiB took 2-4 ms in the stall probe); the extra receive calls cost well under 0.1 µs a
message."""


class Server:
    """Accepts Pulsar connections on ``settings.host``/``settings.port``.

    With ``tls_context`` it is the ``pulsar+ssl`` listener instead, on
    ``settings.broker_service_port_tls``: each connection's TLS handshake must finish within
    ``tls_handshake_timeout_seconds``, and its lookups answer ``advertised_url_tls`` too.
    ``limits_shared_with`` makes the connection caps count both listeners together.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        broker: pykka.ActorRef[BrokerActor],
        event_loops: list[pykka.ActorRef[EventLoopActor]],
        advertised_url: Callable[[], str],
        metadata: MetadataStore,
        tls_context: ssl.SSLContext | None = None,
        advertised_url_tls: Callable[[], str] | None = None,
        security: Security | None = None,
        limits_shared_with: Server | None = None,
        schemas: SchemaRegistry | None = None,
        open_topics: Mapping[str, pykka.ActorRef[TopicActor]] | None = None,
    ) -> None:
        self.settings = settings
        self.open_topics = open_topics
        self.schemas = schemas
        self.metadata = metadata
        self.broker = broker
        self.event_loops = event_loops
        self._advertised_url = advertised_url
        self._tls_context = tls_context
        self._advertised_url_tls = advertised_url_tls
        self._security = security
        self._next_loop = itertools.cycle(range(len(event_loops)))
        self._connections: set[socket.socket] = set()
        self._per_ip: Counter[str] = Counter()
        if limits_shared_with is not None:
            # One broker, one budget: the TLS listener counts against the same caps.
            self._connections = limits_shared_with._connections
            self._per_ip = limits_shared_with._per_ip
        self._actors: set[pykka.ActorRef[ConnectionActor]] = set()
        self._server: StreamServer | None = None

    @property
    def address(self) -> tuple[str, int]:
        assert self._server is not None
        host, port = self._server.address[:2]
        return host, port

    def start(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Accepted sockets inherit the receive buffer; it must be set before listen().
        if self.settings.so_rcvbuf:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.settings.so_rcvbuf)
        if self.settings.so_sndbuf:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.settings.so_sndbuf)
        port = self.settings.port
        if self._tls_context is not None:
            port = self.settings.broker_service_port_tls
        listener.bind((self.settings.host, port))
        listener.listen(self.settings.connection_backlog)
        self._server = StreamServer(listener, self._handle)
        self._server.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop accepting, close every connection, and wait for their actors to finish."""
        if self._server is not None:
            self._server.close()
        for sock in list(self._connections):
            _shutdown(sock)
        if self._server is not None:
            self._server.stop(timeout)
        for actor in list(self._actors):
            actor.stop(block=True, timeout=timeout)

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    def _refused(self, ip: str) -> str | None:
        """Why a new connection from ``ip`` is refused, or None (Pulsar's connection caps)."""
        settings = self.settings
        limit = settings.broker_max_connections
        if limit and len(self._connections) >= limit:
            return f"brokerMaxConnections ({limit}) reached"
        limit = settings.broker_max_connections_per_ip
        if limit and self._per_ip[ip] >= limit:
            return f"brokerMaxConnectionsPerIp ({limit}) reached for {ip}"
        return None

    def _handle(self, sock: socket.socket, address: tuple[str, int]) -> None:
        ip = address[0]
        refused = self._refused(ip)
        if refused is not None:
            log.warning("refusing connection from %s:%s: %s", ip, address[1], refused)
            sock.close()
            return
        self._per_ip[ip] += 1
        try:
            self._serve(sock, address)
        finally:
            self._per_ip[ip] -= 1
            if not self._per_ip[ip]:
                del self._per_ip[ip]

    def _serve(self, sock: socket.socket, address: tuple[str, int]) -> None:
        peer = f"{address[0]}:{address[1]}"
        gevent.getcurrent().name = f"reader {peer}"  # for stall traces and py-spy
        settings = self.settings
        configure_socket(
            sock,
            nodelay=settings.tcp_nodelay,
            notsent_lowat=settings.tcp_notsent_lowat,
            sndbuf=settings.so_sndbuf,
            rcvbuf=settings.so_rcvbuf,
        )
        peer_cert = None
        advertised_tls = ""
        if self._tls_context is not None:
            try:
                sock = wrap_server_socket(
                    self._tls_context, sock, settings.tls_handshake_timeout_seconds
                )
            except TlsHandshakeFailed as error:
                log.warning("closing connection from %s: TLS handshake failed: %s", peer, error)
                _shutdown(sock)
                return
            peer_cert = peer_certificate(sock)
            advertised_tls = self._advertised_url_tls() if self._advertised_url_tls else ""
        event_loop = self.event_loops[next(self._next_loop)]
        handle = ConnectionHandle(peer=peer, channel=None, event_loop=event_loop)  # type: ignore[arg-type]
        handle.writable_notice = ConflatedTell(event_loop, WritabilityChanged(handle))
        closed_reason: list[str] = []

        def close_socket(reason: str) -> None:
            closed_reason.append(reason)
            _shutdown(sock)

        handle.channel = Channel(
            sock,
            high_watermark=settings.high_watermark,
            low_watermark=settings.low_watermark,
            on_writability_changed=handle.channel_writability_changed,
            on_closed=lambda exc: _shutdown(sock),
            name=peer,
            on_send_blocked=handle.channel_send_blocked,
            on_send_unblocked=handle.channel_send_unblocked,
        )
        actor = ConnectionActor.start(
            handle=handle,
            broker=self.broker,
            settings=settings,
            advertised_url=self._advertised_url(),
            close_socket=close_socket,
            advertised_url_tls=advertised_tls,
            security=self._security,
            peer_cert=peer_cert,
            schemas=self.schemas,
            metadata=self.metadata,
            open_topics=self.open_topics,
        )
        handle.actor = actor
        self._connections.add(sock)
        self._actors.add(actor)
        log.info("connection from %s", peer)
        reason = "closed by peer"
        try:
            reason = self._read_loop(sock, actor, handle.channel, peer) or reason
        finally:
            self._connections.discard(sock)
            if closed_reason:
                reason = closed_reason[0]
            handle.channel.close()
            with contextlib.suppress(pykka.ActorDeadError):  # it failed and closed already
                actor.tell(ConnectionLost(reason))
            self._actors.discard(actor)

    def _read_loop(
        self,
        sock: socket.socket,
        actor: pykka.ActorRef[ConnectionActor],
        channel: Channel,
        peer: str,
    ) -> str | None:
        """Receive until the connection ends; returns why it ended."""
        decoder = FrameDecoder(self.settings.max_message_size + FRAME_PADDING)
        interval = self.settings.keep_alive_interval_seconds
        # No socket timeout: gevent would start and cancel a Timeout around every wait in
        # recv, a tenth of the hub's work for a request that comes alone. A timer checks.
        sock.settimeout(None)
        keep_alive = _KeepAlive(interval, channel, lambda: _shutdown(sock), peer)
        timer = gevent.get_hub().loop.timer(interval, interval) if interval else None
        if timer is not None:
            timer.start(keep_alive.tick)
        try:
            return self._receive(sock, actor, decoder, keep_alive)
        finally:
            if timer is not None:
                timer.stop()
                timer.close()

    def _receive(
        self,
        sock: socket.socket,
        actor: pykka.ActorRef[ConnectionActor],
        decoder: FrameDecoder,
        keep_alive: _KeepAlive,
    ) -> str | None:
        recv = sock.recv
        tell = actor.tell
        loop = gevent.get_hub().loop
        turn = loop.iteration  # the loop pass this run of the reader began after
        slice_ends = time.perf_counter() + TIME_SLICE
        # After a short read the socket is most likely empty: wait until it is readable
        # before the next recv, rather than let recv fail with EAGAIN first (a syscall and
        # an OSError built per request, a tenth of a PING's broker instructions). gevent's
        # own watcher and wait, so a close from another greenlet cancels the wait as it
        # would cancel recv's. Not over TLS: OpenSSL may hold bytes the socket no longer has.
        wait = None if is_tls_socket(sock) else sock._wait
        drained = False
        while True:
            try:
                if drained and wait is not None and sock._read_event is not None:
                    wait(sock._read_event)
                data = recv(RECV_BYTES)
            except OSError as error:
                return keep_alive.expired or f"socket error: {error}"
            drained = len(data) < RECV_BYTES
            if loop.iteration != turn:
                # recv waited and the loop ran: a new run, with a slice of its own. (Measured
                # from the last turn, a request after an idle millisecond took a turn at once.)
                turn = loop.iteration
                slice_ends = time.perf_counter() + TIME_SLICE
            if not data:
                if keep_alive.expired:
                    return keep_alive.expired
                try:
                    decoder.eof()
                except ProtocolError as error:
                    return f"closed by peer mid-frame: {error.reason}"
                return None
            try:
                frames = decoder.feed(data)
            except ProtocolError as error:
                reason = error.reason
                if data.startswith(b"\x16\x03") and self._tls_context is None:
                    reason += " (a TLS handshake on the plain port: use the pulsar+ssl:// port)"
                log.warning("closing connection from %s: %s", keep_alive.peer, reason)
                return f"protocol error: {reason}"
            if frames:
                if not keep_alive.connected:
                    keep_alive.connected = frames[0].command.type == pb.BaseCommand.CONNECT
                keep_alive.heard = True
                try:
                    tell(Received(frames))
                except pykka.ActorDeadError:
                    return "connection actor failed"  # it closes the socket itself
            # recv() returns at once while data is waiting: take turns with the others. A full
            # buffer means more is waiting, and decoding one takes about a slice already.
            if not drained or time.perf_counter() >= slice_ends:
                take_turn()
                turn = loop.iteration
                slice_ends = time.perf_counter() + TIME_SLICE


class _KeepAlive:
    """A connection's keep-alive, ticked by a repeating timer every interval.

    A tick after an interval without a complete frame sends a PING; the next such tick
    closes the connection, as does the first tick before a CONNECT. Only whole frames count
    (``heard``), so a peer trickling bytes is closed as a silent one is. Pulsar's
    ``PulsarHandler`` pings on every tick; this one spares connections that are busy anyway.
    """

    __slots__ = (
        "_channel",
        "_interval",
        "_shutdown",
        "connected",
        "expired",
        "heard",
        "peer",
        "pinged",
    )

    def __init__(
        self, interval: int, channel: Channel, shutdown: Callable[[], None], peer: str
    ) -> None:
        self._interval = interval
        self._channel = channel
        self._shutdown = shutdown
        self.peer = peer
        self.connected = False
        self.heard = False  # a complete frame arrived since the last tick
        self.pinged = False
        self.expired: str | None = None  # why a tick closed the connection

    def tick(self) -> None:
        if self.expired is not None:
            return  # closed already; the reader is on its way out
        if not self.connected:
            log.warning(
                "closing connection from %s: no CONNECT within %d s", self.peer, self._interval
            )
            self._close(f"no CONNECT within {self._interval} s")
        elif self.heard:
            self.heard = False
            self.pinged = False
        elif self.pinged:
            self._close(f"no response to keep-alive within {self._interval} s")
        else:
            self._channel.write(PING_FRAME)
            self.pinged = True

    def _close(self, reason: str) -> None:
        self.expired = reason
        self._shutdown()  # the reader's recv returns at once and reports ``expired``


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(stdlib_socket.SHUT_RDWR)
