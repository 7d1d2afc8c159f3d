"""Socket options for brokerlet's TCP connections, with the reasons for each default.

Two kernel behaviours decide whether a broker's flow control works at all:

* **Nagle's algorithm plus delayed ACK.** A frame written as two sends (say a header and
  a body) followed by a read waits for the peer's delayed ACK before the second send leaves
  the host. On loopback that stalled a write-write-read exchange for about 44 ms instead of
  about 0.04 ms. ``TCP_NODELAY`` turns Nagle off.
* **Autotuned send buffers.** By default Linux grows a socket's send buffer up to
  ``net.ipv4.tcp_wmem[2]``; on loopback the kernel accepted about 4 MB for a peer that never
  read. All of that sits in the kernel, so the application's outbound buffer (and its
  watermarks) never sees any backpressure. ``TCP_NOTSENT_LOWAT`` bounds the *unsent* part of
  the queue while keeping autotuning (about 146 KB accepted with 16 KiB); a fixed
  ``SO_SNDBUF`` bounds the whole queue but switches autotuning off for that socket.

Linux doubles the values given to ``SO_SNDBUF``/``SO_RCVBUF`` (for its bookkeeping) and caps
them at ``net.core.wmem_max``/``rmem_max``. ``SO_RCVBUF`` also decides the TCP window scale,
which is fixed during the handshake: set it before ``connect()`` on a client, and on the
listening socket on a server (accepted sockets inherit it).
"""

from __future__ import annotations

import logging
import socket
import sys

__all__ = ["configure_socket", "set_listen_buffers"]

logger = logging.getLogger(__name__)

# The option number from linux/tcp.h; some Python builds do not export the constant.
_LINUX_TCP_NOTSENT_LOWAT = 25


def _notsent_lowat_option() -> int | None:
    # Looked up dynamically: the constant exists only on some platforms and builds.
    option: int | None = vars(socket).get("TCP_NOTSENT_LOWAT")
    if option is None and sys.platform.startswith("linux"):
        option = _LINUX_TCP_NOTSENT_LOWAT
    return option


def _is_tcp(sock: socket.socket) -> bool:
    return sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM


def configure_socket(
    sock: socket.socket,
    *,
    nodelay: bool = True,
    notsent_lowat: int = 16384,
    sndbuf: int = 0,
    rcvbuf: int = 0,
) -> None:
    """Apply brokerlet's transport options to a connected or connecting socket.

    TCP-only options are skipped for other socket families (a Unix socketpair in a test,
    say), so the same call works for both.

    Args:
        sock: a stdlib or gevent socket.
        nodelay: set ``TCP_NODELAY`` to this value. On by default, because Nagle's
            algorithm with delayed ACK stalls a write-write-read exchange by about 44 ms.
        notsent_lowat: ``TCP_NOTSENT_LOWAT`` in bytes; 0 leaves it unset. It keeps the
            kernel from absorbing megabytes of unsent data, so backpressure reaches the
            channel's watermarks. Linux-only; elsewhere, or where the kernel refuses it, it
            is skipped with a debug log.
        sndbuf: a fixed ``SO_SNDBUF`` in bytes (Linux doubles it); 0 keeps the kernel's
            autotuning. Use it where backpressure must be deterministic, as in tests.
        rcvbuf: a fixed ``SO_RCVBUF`` in bytes; 0 keeps autotuning. It only shapes the
            window scale if set before ``connect()``.

    Raises:
        OSError: the kernel rejected ``TCP_NODELAY``, ``SO_SNDBUF`` or ``SO_RCVBUF``.
    """
    if _is_tcp(sock):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, int(nodelay))
        if notsent_lowat > 0:
            _set_notsent_lowat(sock, notsent_lowat)
    if sndbuf > 0:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    if rcvbuf > 0:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)


def _set_notsent_lowat(sock: socket.socket, value: int) -> None:
    option = _notsent_lowat_option()
    if option is None:
        logger.debug("TCP_NOTSENT_LOWAT is not available on %s", sys.platform)
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, option, value)
    except OSError as exc:
        # Pre-3.12 Linux kernels lack it; the socket still works, just with more buffering.
        logger.debug("TCP_NOTSENT_LOWAT=%d refused: %s", value, exc)


def set_listen_buffers(listen_sock: socket.socket, rcvbuf: int = 0, sndbuf: int = 0) -> None:
    """Size the kernel buffers of a listening socket, for every socket it accepts.

    Call it before ``listen()``: accepted sockets inherit both sizes, and ``SO_RCVBUF`` must
    be in place before the handshake to take part in choosing the TCP window scale.

    Args:
        listen_sock: the server socket, bound but not yet listening.
        rcvbuf: ``SO_RCVBUF`` in bytes (Linux doubles it); 0 leaves the kernel default.
        sndbuf: ``SO_SNDBUF`` in bytes (Linux doubles it); 0 leaves the kernel default.

    Raises:
        OSError: the kernel rejected a value.
    """
    if rcvbuf > 0:
        listen_sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    if sndbuf > 0:
        listen_sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
