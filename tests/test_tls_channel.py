"""The Channel over TLS: no sendmsg on SSL sockets, so the joined-buffer path (issue 17).

Real gevent SSL sockets on loopback with small kernel buffers: watermarks, writability
flips and in-order completions must behave as over plain TCP, and a send that times out
(gevent raises SSLError "timed out", not TimeoutError) is retried rather than fatal.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from typing import Any

import gevent
import gevent.event
import gevent.socket
import gevent.ssl
import pytest

from brokerlet.config import Settings
from brokerlet.transport.channel import Channel, is_tls_socket
from brokerlet.transport.tls import TlsHandshakeFailed, server_context, wrap_server_socket
from tests.tlscerts import Pki

WAIT = 5.0
SMALL = 16 * 1024


@pytest.fixture
def tls_pair(pki: Pki) -> Iterator[tuple[Any, Any]]:
    """(server SSL socket, client SSL socket), both gevent, with small kernel buffers."""
    context = server_context(
        Settings(tls_certificate_file_path=pki.broker.cert, tls_key_file_path=pki.broker.key)
    )
    listener = gevent.socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client_raw = gevent.socket.socket()
    client_raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL)
    client_raw.connect(listener.getsockname())
    accepted, _ = listener.accept()
    # gevent.ssl.create_default_context would give a blocking stdlib context here.
    client_context = gevent.ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_context.load_verify_locations(pki.ca)
    client = client_context.wrap_socket(
        client_raw, server_hostname="127.0.0.1", do_handshake_on_connect=False
    )
    handshake = gevent.spawn(client.do_handshake)
    server = wrap_server_socket(context, accepted, WAIT)
    handshake.get(timeout=WAIT)
    yield server, client
    for sock in (server, client, listener):
        sock.close()


def read_exactly(sock: Any, count: int) -> bytes:
    data = bytearray()
    while len(data) < count:
        chunk = sock.recv(65536)
        assert chunk, "peer closed early"
        data += chunk
    return bytes(data)


def test_watermarks_flips_and_completions_match_plain_tcp(tls_pair: tuple[Any, Any]) -> None:
    server, client = tls_pair
    flips: list[bool] = []
    writable_again = gevent.event.Event()

    def flipped(writable: bool) -> None:
        flips.append(writable)
        if writable:
            writable_again.set()

    kernel_full = gevent.event.Event()
    channel = Channel(
        server,
        high_watermark=64 * 1024,
        low_watermark=32 * 1024,
        on_writability_changed=flipped,
        on_send_blocked=kernel_full.set,
    )
    assert not channel._vectored, "an SSL socket takes the joined-buffer path"
    done: list[int] = []
    chunks = [bytes([i % 251]) * 4096 for i in range(256)]  # 1 MiB, far above the buffers
    for index in range(0, len(chunks), 4):
        channel.write(chunks[index : index + 4], lambda _e, i=index: done.append(i))
    assert flips == [False], "unwritable at once: the peer is not reading"
    assert kernel_full.wait(WAIT), "the writer never filled the kernel's buffer"
    assert not channel.writable
    assert channel.pending_bytes > 0
    received = gevent.spawn(read_exactly, client, sum(map(len, chunks)))
    assert writable_again.wait(WAIT)
    assert received.get(timeout=WAIT) == b"".join(chunks)
    assert flips == [False, True]
    assert done == list(range(0, len(chunks), 4)), "completions in write order"
    assert channel.pending_bytes == 0
    channel.close()


def test_gevents_ssl_sockets_count_as_tls(tls_pair: tuple[Any, Any]) -> None:
    # gevent's SSLSocket is not a subclass of the standard library's: a check for ssl.SSLSocket
    # alone sent the server's TLS readers down the plain-socket readiness wait.
    server, client = tls_pair
    assert not isinstance(server, ssl.SSLSocket)
    assert is_tls_socket(server)
    assert is_tls_socket(client)
    with gevent.socket.socket() as plain:
        assert not is_tls_socket(plain)


def test_a_timed_out_ssl_send_is_retried_not_fatal(tls_pair: tuple[Any, Any]) -> None:
    server, client = tls_pair
    server.settimeout(0.05)  # a socket's timeout applies to its sends too
    timeouts: list[BaseException] = []
    several_timed_out = gevent.event.Event()
    send = server.send

    def counting_send(data: Any) -> int:
        try:
            sent: int = send(data)
        except (TimeoutError, ssl.SSLError) as error:
            timeouts.append(error)
            if len(timeouts) >= 3:
                several_timed_out.set()
            raise
        return sent

    server.send = counting_send
    closed: list[BaseException | None] = []
    channel = Channel(server, on_closed=closed.append)
    payload = b"x" * (512 * 1024)
    finished = gevent.event.Event()
    channel.write(payload, lambda error: finished.set() if error is None else None)
    # Several send timeouts while the peer does not read.
    assert several_timed_out.wait(WAIT), f"only {len(timeouts)} send timeouts"
    assert not closed, "a send timeout must not close the channel"
    assert read_exactly(client, len(payload)) == payload
    assert finished.wait(WAIT)
    channel.close()


def test_a_plain_peer_fails_the_handshake_cleanly(pki: Pki) -> None:
    context = server_context(
        Settings(tls_certificate_file_path=pki.broker.cert, tls_key_file_path=pki.broker.key)
    )
    a, b = gevent.socket.socketpair()
    b.sendall(b"\x00\x00\x00\x10not a ClientHello")
    with pytest.raises(TlsHandshakeFailed):
        wrap_server_socket(context, a, WAIT)
    b.close()
