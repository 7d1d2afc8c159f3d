"""Tests for the outbound Channel and the socket options.

Two kinds of socket are used:

* real loopback TCP with 16 KiB kernel buffers and a peer that reads only when told to, so
  backpressure is real (the kernel takes tens of KiB, not megabytes);
* a ``ScriptedSocket`` whose ``sendmsg`` takes exactly the bytes the test grants, for the
  exact boundaries (watermarks to the byte, partial sends mid-buffer) a kernel cannot be
  made to produce on demand.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import random
import socket
import struct
import sys
import termios
from collections.abc import Callable, Iterator
from typing import Any

import gevent
import gevent.event
import gevent.queue
import gevent.socket
import greenlet
import pytest

from brokerlet.transport.channel import (
    MAX_IOVECS,
    MAX_SEND_BYTES,
    Channel,
    ChannelClosed,
    ChannelStatistics,
)
from brokerlet.transport.sockopts import configure_socket, set_listen_buffers

WAIT = 5.0  # upper bound for any single wait; passing runs take milliseconds
SMALL_BUFFER = 16 * 1024

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux ioctls")


# -- helpers ----------------------------------------------------------------------------


class Outcomes:
    """Collects write-callback results by write index, with an event per expected count."""

    def __init__(self) -> None:
        self.results: list[tuple[int, BaseException | None]] = []
        self._target = 0
        self.reached = gevent.event.Event()

    def callback(self, index: int) -> Callable[[BaseException | None], None]:
        def done(error: BaseException | None) -> None:
            self.results.append((index, error))
            if len(self.results) >= self._target:
                self.reached.set()

        return done

    def wait_for(self, count: int, timeout: float = WAIT) -> None:
        self._target = count
        if len(self.results) < count:
            self.reached.clear()
            assert self.reached.wait(timeout), f"{len(self.results)} of {count} callbacks"

    @property
    def indices(self) -> list[int]:
        return [index for index, _ in self.results]


class Flips:
    """Records writability notifications, with the pending bytes seen at each."""

    def __init__(self) -> None:
        self.channel: Channel | None = None
        self.values: list[bool] = []
        self.pending_at_flip: list[int] = []
        self.became_writable = gevent.event.Event()

    def __call__(self, writable: bool) -> None:
        assert self.channel is not None
        self.values.append(writable)
        self.pending_at_flip.append(self.channel.pending_bytes)
        if writable:
            self.became_writable.set()
        else:
            self.became_writable.clear()


class ScriptedSocket:
    """A socket stand-in: each ``sendmsg`` offers its buffers and takes what the test grants."""

    def __init__(self) -> None:
        self.offers: gevent.queue.SimpleQueue[list[memoryview]] = gevent.queue.SimpleQueue()
        self._grants: gevent.queue.SimpleQueue[int | BaseException] = gevent.queue.SimpleQueue()
        self.sent = bytearray()
        self.closed = False
        self.nonblocking_tries = 0

    def gettimeout(self) -> float | None:
        return None

    def sendmsg(self, buffers: list[memoryview], ancdata: object = (), flags: int = 0) -> int:
        if flags & socket.MSG_DONTWAIT:
            # The loop's non-blocking try: this kernel never takes bytes without a grant, so
            # every write reaches the writer greenlet, whose sends the test scripts.
            self.nonblocking_tries += 1
            raise BlockingIOError(errno.EAGAIN, "would block")
        self.offers.put(list(buffers))
        grant = self._grants.get()
        if isinstance(grant, BaseException):
            raise grant
        data = b"".join(bytes(buffer) for buffer in buffers)[:grant]
        self.sent += data
        return len(data)

    def next_offer(self) -> list[bytes]:
        """Wait until the writer calls ``sendmsg`` again; return what it offered."""
        return [bytes(buffer) for buffer in self.next_raw_offer()]

    def next_raw_offer(self) -> list[memoryview]:
        offer: list[memoryview] = self.offers.get(timeout=WAIT)
        return offer

    def grant(self, nbytes: int) -> None:
        self._grants.put(nbytes)

    def fail(self, exc: BaseException) -> None:
        self._grants.put(exc)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._grants.put(OSError(errno.EBADF, "closed"))  # like gevent's cancel_wait


def _connected_pair(
    buffer_size: int,
    server_class: type[gevent.socket.socket] = gevent.socket.socket,
    *,
    configure_server: bool = True,
) -> tuple[gevent.socket.socket, gevent.socket.socket]:
    """Return (server side, client side) of a loopback TCP connection.

    A buffer_size of 0 keeps the kernel's autotuned buffers.
    """
    listener = gevent.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        set_listen_buffers(listener, rcvbuf=buffer_size, sndbuf=buffer_size)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        client = gevent.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        configure_socket(client, sndbuf=buffer_size, rcvbuf=buffer_size)
        client.connect(listener.getsockname())
        accepted, _ = listener.accept()
    finally:
        listener.close()
    server = server_class(fileno=accepted.detach())
    if configure_server:
        configure_socket(server, sndbuf=buffer_size, rcvbuf=buffer_size)
    return server, client


@pytest.fixture
def tcp_pair() -> Iterator[tuple[gevent.socket.socket, gevent.socket.socket]]:
    """A loopback connection with 16 KiB buffers: (channel side, peer)."""
    server, client = _connected_pair(SMALL_BUFFER)
    yield server, client
    server.close()
    client.close()


@pytest.fixture
def channels() -> Iterator[Callable[..., Channel]]:
    """Makes channels and closes whatever the test left open."""
    made: list[Channel] = []

    def make(sock: Any, **kwargs: Any) -> Channel:
        channel = Channel(sock, **kwargs)
        made.append(channel)
        return channel

    yield make
    for channel in made:
        channel.close()


def _read_exactly(sock: gevent.socket.socket, nbytes: int) -> bytes:
    received = bytearray()
    while len(received) < nbytes:
        chunk = sock.recv(min(65536, nbytes - len(received)))
        if not chunk:
            break
        received += chunk
    return bytes(received)


def _read_to_eof(sock: gevent.socket.socket) -> bytes:
    received = bytearray()
    while chunk := sock.recv(65536):
        received += chunk
    return bytes(received)


def _unsent_and_unread(sender: gevent.socket.socket, receiver: gevent.socket.socket) -> int:
    """Bytes in the kernel: the sender's send queue plus the receiver's receive queue."""
    buf = bytearray(4)
    fcntl.ioctl(sender.fileno(), termios.TIOCOUTQ, buf)
    (outq,) = struct.unpack("i", buf)
    fcntl.ioctl(receiver.fileno(), termios.FIONREAD, buf)
    (inq,) = struct.unpack("i", buf)
    return int(outq + inq)


# -- watermarks ---------------------------------------------------------------------------


def test_watermarks_flip_at_exact_boundaries(channels: Callable[..., Channel]) -> None:
    sock = ScriptedSocket()
    flips = Flips()
    channel = channels(sock, high_watermark=100, low_watermark=50, on_writability_changed=flips)
    flips.channel = channel

    channel.write(b"a" * 60)
    channel.write(b"b" * 40)
    assert channel.pending_bytes == 100
    assert channel.writable, "at the high watermark, not over it"
    channel.write(b"c")
    # Reported synchronously, inside the write that crossed the mark.
    assert not channel.writable
    assert flips.values == [False]

    assert sum(map(len, sock.next_offer())) == 101
    sock.grant(30)
    sock.next_offer()
    assert (channel.pending_bytes, channel.writable) == (71, False), "below high is not enough"
    sock.grant(21)
    sock.next_offer()
    assert (channel.pending_bytes, channel.writable) == (50, False), "at low is not enough"
    sock.grant(1)
    sock.next_offer()
    assert (channel.pending_bytes, channel.writable) == (49, True)
    assert flips.values == [False, True]
    assert flips.pending_at_flip == [101, 49]

    channel.write(b"d" * 51)  # 100 pending: writable again means high applies again
    assert channel.writable
    channel.write(b"e")
    assert flips.values == [False, True, False]
    stats = channel.statistics()
    assert stats.writability_changes == 3
    assert not stats.writable
    assert stats.pending_bytes == 101


def test_watermarks_with_real_backpressure(
    tcp_pair: tuple[gevent.socket.socket, gevent.socket.socket],
    channels: Callable[..., Channel],
) -> None:
    server, peer = tcp_pair
    flips = Flips()
    channel = channels(server, on_writability_changed=flips)  # 64 KiB / 32 KiB
    flips.channel = channel
    outcomes = Outcomes()
    snapshots: list[tuple[int, bool]] = []
    chunk = b"x" * 1024
    count = 400  # far more than the kernel's ~45 KB plus the high watermark

    def completed(index: int) -> Callable[[BaseException | None], None]:
        record = outcomes.callback(index)

        def done(error: BaseException | None) -> None:
            snapshots.append((channel.pending_bytes, channel.writable))
            record(error)

        return done

    flipped_at = None
    for index in range(count):
        channel.write(chunk, completed(index))
        if flipped_at is None and not channel.writable:
            flipped_at = index
    assert flipped_at == 64, "unwritable once 65 KiB (> 64 KiB) are pending"
    assert flips.values == [False]

    outcomes.wait_for(1)
    # The peer reads nothing, so the kernel cannot have taken enough to drain below low.
    assert not channel.writable
    assert channel.pending_bytes > 65536
    assert flips.values == [False]

    reader = gevent.spawn(_read_exactly, peer, count * len(chunk))
    assert flips.became_writable.wait(WAIT)
    outcomes.wait_for(count)
    assert reader.get(timeout=WAIT) == chunk * count

    assert flips.values == [False, True]
    assert flips.pending_at_flip[0] > 65536
    assert flips.pending_at_flip[1] < 32768
    # Pending only falls after the burst, so writability must track "below low" exactly.
    assert all(writable == (pending < 32768) for pending, writable in snapshots)
    assert channel.statistics() == ChannelStatistics(
        writable=True,
        pending_bytes=0,
        writability_changes=2,
        bytes_written=count * len(chunk),
        writes=count,
        closed=False,
    )


def test_invalid_configuration_is_rejected() -> None:
    sock = ScriptedSocket()
    with pytest.raises(ValueError, match="low"):
        Channel(sock, high_watermark=10, low_watermark=20)
    with pytest.raises(ValueError, match="low"):
        Channel(sock, high_watermark=10, low_watermark=0)
    a, b = gevent.socket.socketpair()
    try:
        a.settimeout(0.0)
        with pytest.raises(ValueError, match="blocking"):
            Channel(a)
    finally:
        a.close()
        b.close()


# -- completions ----------------------------------------------------------------------------


@linux_only
def test_callbacks_fire_in_order_once_bytes_are_in_the_kernel(
    tcp_pair: tuple[gevent.socket.socket, gevent.socket.socket],
    channels: Callable[..., Channel],
) -> None:
    server, peer = tcp_pair
    channel = channels(server)
    size, count = 1000, 1000
    outcomes = Outcomes()
    reading = gevent.event.Event()
    in_kernel_at_callback: list[int] = []
    payloads = [bytes([index % 251]) * size for index in range(count)]

    def completed(index: int) -> Callable[[BaseException | None], None]:
        record = outcomes.callback(index)

        def done(error: BaseException | None) -> None:
            # Only measurable while the peer has read nothing.
            if not reading.is_set():
                in_kernel_at_callback.append(_unsent_and_unread(server, peer))
            record(error)

        return done

    for index, payload in enumerate(payloads):
        channel.write(payload, completed(index))
    assert outcomes.results == [], "no completion before the writer has sent anything"

    outcomes.wait_for(1)
    assert len(outcomes.results) < count, "a 1 MB burst cannot all be in 16 KiB buffers"
    for position, in_kernel in enumerate(in_kernel_at_callback):
        assert in_kernel >= (position + 1) * size

    reading.set()
    reader = gevent.spawn(_read_exactly, peer, size * count)
    outcomes.wait_for(count)
    assert reader.get(timeout=WAIT) == b"".join(payloads)
    assert outcomes.indices == list(range(count))
    assert all(error is None for _, error in outcomes.results)


def test_sequence_write_is_one_logical_write(
    tcp_pair: tuple[gevent.socket.socket, gevent.socket.socket],
    channels: Callable[..., Channel],
) -> None:
    server, peer = tcp_pair
    channel = channels(server)
    outcomes = Outcomes()
    parts: list[bytes | bytearray | memoryview] = [
        b"a" * 30000,
        bytearray(b"b" * 40000),
        memoryview(b"c" * 50000),
    ]
    channel.write(parts, outcomes.callback(0))
    channel.write(b"tail", outcomes.callback(1))

    reader = gevent.spawn(_read_exactly, peer, 120004)
    outcomes.wait_for(2)
    assert reader.get(timeout=WAIT) == b"a" * 30000 + b"b" * 40000 + b"c" * 50000 + b"tail"
    assert outcomes.results == [(0, None), (1, None)]
    assert channel.statistics().writes == 2


def test_partial_sends_resume_mid_buffer_without_copying(
    channels: Callable[..., Channel],
) -> None:
    sock = ScriptedSocket()
    channel = channels(sock)
    outcomes = Outcomes()
    first, second, third, fourth = b"ab", b"cde", b"f", b"ghij"
    channel.write([first, second, third], outcomes.callback(0))
    channel.write(fourth, outcomes.callback(1))

    assert sock.next_offer() == [b"ab", b"cde", b"f", b"ghij"]
    sock.grant(3)
    offer = sock.next_raw_offer()
    assert [bytes(buffer) for buffer in offer] == [b"de", b"f", b"ghij"]
    assert offer[0].obj is second, "the unsent tail is a view of the caller's bytes"
    assert outcomes.results == [], "part of a sequence is not the whole write"
    sock.grant(3)
    assert sock.next_offer() == [b"ghij"]
    assert outcomes.results == [(0, None)]
    sock.grant(2)
    assert sock.next_offer() == [b"ij"]
    sock.grant(2)
    outcomes.wait_for(2)
    assert outcomes.results == [(0, None), (1, None)]
    assert bytes(sock.sent) == b"abcdefghij"
    assert channel.pending_bytes == 0


def test_empty_writes_complete_in_order(channels: Callable[..., Channel]) -> None:
    sock = ScriptedSocket()
    channel = channels(sock)
    outcomes = Outcomes()
    channel.write(b"", outcomes.callback(0))
    outcomes.wait_for(1)  # completes without any sendmsg at all
    assert sock.offers.empty()

    channel.write(b"a", outcomes.callback(1))
    channel.write(b"", outcomes.callback(2))
    channel.write([], outcomes.callback(3))
    channel.write(b"b", outcomes.callback(4))
    assert sock.next_offer() == [b"a", b"b"]
    sock.grant(1)
    assert sock.next_offer() == [b"b"]
    assert outcomes.indices == [0, 1, 2, 3]
    sock.grant(1)
    outcomes.wait_for(5)
    assert outcomes.indices == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_writes_arrive_exactly_and_in_order(seed: int) -> None:
    rng = random.Random(seed)
    server, peer = _connected_pair(SMALL_BUFFER)
    writable = gevent.event.Event()
    writable.set()

    def on_flip(value: bool) -> None:
        if value:
            writable.set()
        else:
            writable.clear()

    channel = Channel(
        server, high_watermark=48 * 1024, low_watermark=16 * 1024, on_writability_changed=on_flip
    )
    outcomes = Outcomes()
    expected = bytearray()
    count = 3000

    def produce() -> None:
        for index in range(count):
            if not writable.is_set():  # behave like a dispatcher: wait for writability
                assert writable.wait(WAIT)
            roll = rng.random()
            if roll < 0.1:
                data: Any = [rng.randbytes(rng.randint(0, 3000)) for _ in range(rng.randint(0, 5))]
                expected.extend(b"".join(data))
            else:
                size = rng.randint(0, 64) if roll < 0.5 else rng.randint(0, 20000)
                data = rng.randbytes(size)
                expected.extend(data)
            channel.write(data, outcomes.callback(index))
            if rng.random() < 0.05:
                gevent.sleep(0)  # let the writer interleave with the producer

    def consume() -> bytes:
        received = bytearray()
        while chunk := peer.recv(rng.randint(1, 70000)):
            received += chunk
        return bytes(received)

    try:
        reader = gevent.spawn(consume)
        producer = gevent.spawn(produce)
        producer.get(timeout=WAIT)
        outcomes.wait_for(count, timeout=10)
        channel.close()  # sends FIN after what the kernel holds, ending the reader
        received = reader.get(timeout=WAIT)
    finally:
        channel.close()
        peer.close()
    assert received == bytes(expected)
    assert outcomes.indices == list(range(count))
    assert all(error is None for _, error in outcomes.results)
    assert channel.statistics().bytes_written == len(expected)


# -- closing ----------------------------------------------------------------------------


def test_close_fails_pending_and_later_writes(
    tcp_pair: tuple[gevent.socket.socket, gevent.socket.socket],
) -> None:
    server, peer = tcp_pair
    closed_with: list[BaseException | None] = []
    channel = Channel(server, on_closed=closed_with.append)
    outcomes = Outcomes()
    count = 500
    for index in range(count):
        channel.write(b"z" * 2048, outcomes.callback(index))
    outcomes.wait_for(1)
    assert len(outcomes.results) < count

    reason = RuntimeError("shutting down")
    channel.close(reason)
    written = channel.statistics().bytes_written
    assert len(outcomes.results) == count, "every pending write is failed by close()"
    assert outcomes.indices == list(range(count))
    succeeded = [index for index, error in outcomes.results if error is None]
    assert succeeded == list(range(len(succeeded))), "successes are a prefix"
    assert written >= len(succeeded) * 2048
    for _, error in outcomes.results[len(succeeded) :]:
        assert isinstance(error, ChannelClosed)
        assert error.cause is reason
        assert error.__cause__ is reason
    assert closed_with == [reason]

    later = Outcomes()
    channel.write(b"too late", later.callback(0))
    assert len(later.results) == 1, "failed before write() returns"
    assert isinstance(later.results[0][1], ChannelClosed)
    assert later.results[0][1].cause is reason

    channel.close()
    assert closed_with == [reason], "on_closed runs once"
    assert channel.statistics() == ChannelStatistics(
        writable=False,
        pending_bytes=0,
        writability_changes=1,  # the burst made it unwritable; closing is not a flip
        bytes_written=written,
        writes=len(succeeded),
        closed=True,
    )
    assert server.fileno() == -1
    # The peer sees exactly what reached the kernel, then EOF.
    received = gevent.spawn(_read_to_eof, peer).get(timeout=WAIT)
    assert received == b"z" * written


def test_owner_close_reports_none_and_stops_the_writer(
    tcp_pair: tuple[gevent.socket.socket, gevent.socket.socket],
) -> None:
    server, _ = tcp_pair
    closed_with: list[BaseException | None] = []
    blocked = gevent.event.Event()
    channel = Channel(
        server,
        on_closed=closed_with.append,
        high_watermark=1 << 22,
        low_watermark=1 << 21,
        on_send_blocked=blocked.set,
    )
    channel.write(b"z" * 512 * 1024)  # more than the kernel takes while the peer reads none
    assert blocked.wait(WAIT), "the writer, started by the partial send, parks in its send"
    writer = channel._writer  # the greenlet must not outlive the channel
    assert writer is not None
    channel.close()
    channel.close()
    assert closed_with == [None]
    writer.join(timeout=WAIT)
    assert writer.dead
    assert writer.successful()


def test_close_from_a_callback_keeps_completed_writes(channels: Callable[..., Channel]) -> None:
    sock = ScriptedSocket()
    closed_with: list[BaseException | None] = []
    channel = channels(sock, on_closed=closed_with.append)
    outcomes = Outcomes()
    record_first = outcomes.callback(0)

    def first_closes(error: BaseException | None) -> None:
        record_first(error)
        channel.close()

    channel.write(b"a", first_closes)
    channel.write(b"b", outcomes.callback(1))
    channel.write(b"c", outcomes.callback(2))
    sock.next_offer()
    sock.grant(2)  # "a" and "b" reach the kernel in one send; "c" does not
    outcomes.wait_for(3)
    assert outcomes.indices == [0, 1, 2], "still in write order"
    assert outcomes.results[0] == (0, None)
    assert outcomes.results[1] == (1, None), "its bytes were in the kernel before close()"
    assert isinstance(outcomes.results[2][1], ChannelClosed)
    assert closed_with == [None]
    assert channel.statistics().writes == 2
    assert sock.closed


def test_close_from_the_writable_hook_keeps_completed_writes(
    channels: Callable[..., Channel],
) -> None:
    sock = ScriptedSocket()
    outcomes = Outcomes()

    def close_when_writable(writable: bool) -> None:
        if writable:
            channel.close()

    channel = channels(
        sock, high_watermark=2, low_watermark=2, on_writability_changed=close_when_writable
    )
    channel.write(b"ab", outcomes.callback(0))
    channel.write(b"c", outcomes.callback(1))
    channel.write(b"d", outcomes.callback(2))
    assert not channel.writable
    sock.next_offer()
    sock.grant(3)  # pending 1 < 2: the hook closes while "ab" and "c" are in the kernel
    outcomes.wait_for(3)
    assert outcomes.results[:2] == [(0, None), (1, None)]
    assert outcomes.results[2][0] == 2
    assert isinstance(outcomes.results[2][1], ChannelClosed)


def test_peer_reset_closes_the_channel_once(
    tcp_pair: tuple[gevent.socket.socket, gevent.socket.socket],
) -> None:
    server, peer = tcp_pair
    closed_with: list[BaseException | None] = []
    closed = gevent.event.Event()

    def on_closed(exc: BaseException | None) -> None:
        closed_with.append(exc)
        closed.set()

    channel = Channel(server, on_closed=on_closed)
    # Linger 0 makes close() send RST instead of FIN.
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    peer.close()

    outcomes = Outcomes()
    for index in range(50):  # the first sends may still be accepted before the RST lands
        channel.write(b"r" * 4096, outcomes.callback(index))
        outcomes.wait_for(index + 1)
        if outcomes.results[-1][1] is not None:
            break
    assert closed.wait(WAIT)
    error = outcomes.results[-1][1]
    assert isinstance(error, ChannelClosed)
    assert isinstance(error.cause, ConnectionResetError | BrokenPipeError)
    assert closed_with == [error.cause]
    assert channel.closed
    assert not channel.writable

    channel.close()
    later = Outcomes()
    channel.write(b"x", later.callback(0))
    assert isinstance(later.results[0][1], ChannelClosed)
    assert closed_with == [error.cause], "on_closed runs once"


# -- robustness -------------------------------------------------------------------------


def test_writer_survives_raising_callbacks(
    tcp_pair: tuple[gevent.socket.socket, gevent.socket.socket],
    channels: Callable[..., Channel],
    caplog: pytest.LogCaptureFixture,
) -> None:
    server, peer = tcp_pair

    def raising_flip(value: bool) -> None:
        raise RuntimeError(f"flip {value}")

    channel = channels(
        server,
        high_watermark=10,
        low_watermark=10,
        on_writability_changed=raising_flip,
        name="robust",
    )
    outcomes = Outcomes()

    def raising(error: BaseException | None) -> None:
        raise ValueError("callback bug")

    with caplog.at_level(logging.ERROR, logger="brokerlet.transport.channel"):
        channel.write(b"first", raising)
        channel.write(b"-second-", outcomes.callback(1))  # 13 > 10: flips, and the hook raises
        assert not channel.writable
        reader = gevent.spawn(_read_exactly, peer, 13)
        outcomes.wait_for(1)
        assert reader.get(timeout=WAIT) == b"first-second-"
        assert channel.writable
        channel.write(b"third", outcomes.callback(2))
        assert _read_exactly(peer, 5) == b"third"
        outcomes.wait_for(2)

    assert outcomes.results == [(1, None), (2, None)]
    messages = [record.getMessage() for record in caplog.records]
    assert any("write callback raised" in message for message in messages)
    assert any("on_writability_changed(False) raised" in message for message in messages)
    assert any("on_writability_changed(True) raised" in message for message in messages)
    assert not channel.closed


def test_socket_timeout_is_retried_not_fatal(channels: Callable[..., Channel]) -> None:
    sock = ScriptedSocket()
    channel = channels(sock)
    outcomes = Outcomes()
    channel.write(b"abc", outcomes.callback(0))
    sock.next_offer()
    sock.fail(TimeoutError("timed out"))  # a read timeout on the socket, not a failure
    assert sock.next_offer() == [b"abc"]
    sock.grant(3)
    outcomes.wait_for(1)
    assert outcomes.results == [(0, None)]
    assert not channel.closed


def test_unexpected_send_error_closes_with_it(channels: Callable[..., Channel]) -> None:
    sock = ScriptedSocket()
    closed_with: list[BaseException | None] = []
    channel = channels(sock, on_closed=closed_with.append)
    outcomes = Outcomes()
    channel.write(b"abc", outcomes.callback(0))
    sock.next_offer()
    failure = OSError(errno.EPIPE, "broken pipe")
    sock.fail(failure)
    outcomes.wait_for(1)
    error = outcomes.results[0][1]
    assert isinstance(error, ChannelClosed)
    assert error.cause is failure
    assert closed_with == [failure]
    assert sock.closed


# -- batching ---------------------------------------------------------------------------


class CountingSocket(gevent.socket.socket):  # type: ignore[misc]
    """A gevent socket that records what each ``sendmsg`` was offered."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.iovec_counts: list[int] = []
        self.offered_bytes: list[int] = []

    def sendmsg(self, buffers: Any, *args: Any) -> int:
        self.iovec_counts.append(len(buffers))
        self.offered_bytes.append(sum(len(buffer) for buffer in buffers))
        sent: int = super().sendmsg(buffers, *args)
        return sent


def test_many_small_writes_share_a_sendmsg() -> None:
    server, peer = _connected_pair(0, server_class=CountingSocket)
    channel = Channel(server, high_watermark=1 << 20, low_watermark=1 << 19)
    outcomes = Outcomes()
    count = 3000
    try:
        for index in range(count):
            channel.write(index.to_bytes(2, "big") * 50, outcomes.callback(index))
        reader = gevent.spawn(_read_exactly, peer, count * 100)
        outcomes.wait_for(count)
        received = reader.get(timeout=WAIT)
    finally:
        channel.close()
        peer.close()
    assert received == b"".join(index.to_bytes(2, "big") * 50 for index in range(count))
    assert server.iovec_counts[0] == MAX_IOVECS, "the first send gathers a full iovec list"
    assert max(server.iovec_counts) <= MAX_IOVECS
    assert len(server.iovec_counts) <= 30, server.iovec_counts
    assert channel.statistics().writes == count


def _runs_of(glet: Any) -> Callable[[], int]:
    """Count the switches into ``glet`` from now on; returns a reader of the count."""
    runs = 0
    previous = greenlet.gettrace()

    def trace(event: str, args: tuple[Any, Any]) -> None:
        nonlocal runs
        if event in ("switch", "throw") and args[1] is glet:
            runs += 1
        if previous is not None:
            previous(event, args)

    greenlet.settrace(trace)
    return lambda: runs


def test_writes_that_fit_are_flushed_by_the_loop_without_waking_the_writer(
    channels: Callable[..., Channel],
) -> None:
    """Three writes in one turn leave in one non-blocking send from a loop callback: the
    writer greenlet, two switches per write before, is not even spawned while the kernel has
    room."""
    server, peer = _connected_pair(0, server_class=CountingSocket)
    channel = channels(server)
    outcomes = Outcomes()
    try:
        for index in range(3):
            channel.write(bytes([index]) * 100, outcomes.callback(index))
        assert outcomes.results == [], "completions never run inside write()"
        outcomes.wait_for(3)
        assert _read_exactly(peer, 300) == bytes([0]) * 100 + bytes([1]) * 100 + bytes([2]) * 100
    finally:
        peer.close()
    assert channel._writer is None
    assert server.iovec_counts == [3], "one sendmsg for the three writes"
    assert outcomes.indices == [0, 1, 2]


def test_what_the_kernel_does_not_take_at_once_goes_through_the_writer_in_order(
    tcp_pair: tuple[gevent.socket.socket, gevent.socket.socket],
    channels: Callable[..., Channel],
) -> None:
    """A write larger than the socket's buffers is partly sent by the loop's try, the rest by
    the writer parked in its send; writes made meanwhile queue behind it, and once the queue
    is empty the loop flushes again."""
    server, peer = tcp_pair
    blocked = gevent.event.Event()
    channel = channels(
        server, high_watermark=1 << 22, low_watermark=1 << 21, on_send_blocked=blocked.set
    )
    outcomes = Outcomes()
    big = random.Random(7).randbytes(512 * 1024)
    try:
        channel.write(big, outcomes.callback(0))
        assert blocked.wait(WAIT), "the writer parks in its send and reports it"
        assert channel._writer is not None
        writer_runs = _runs_of(channel._writer)
        assert channel.send_blocked
        channel.write(b"after", outcomes.callback(1))
        received = _read_exactly(peer, len(big) + 5)
        outcomes.wait_for(2)
        assert received == big + b"after"
        runs = writer_runs()
        channel.write(b"later", outcomes.callback(2))
        outcomes.wait_for(3)
        assert _read_exactly(peer, 5) == b"later"
        assert writer_runs() == runs, "with the queue empty again, the loop flushes"
    finally:
        greenlet.settrace(None)
    assert outcomes.indices == [0, 1, 2]
    assert all(error is None for _, error in outcomes.results)


def test_gather_is_capped_by_bytes() -> None:
    server, peer = _connected_pair(0, server_class=CountingSocket)
    channel = Channel(server, high_watermark=1 << 22, low_watermark=1 << 21)
    outcomes = Outcomes()
    block = 64 * 1024
    count = 40
    try:
        for index in range(count):
            channel.write(bytes([index]) * block, outcomes.callback(index))
        reader = gevent.spawn(_read_exactly, peer, count * block)
        outcomes.wait_for(count)
        received = reader.get(timeout=WAIT)
    finally:
        channel.close()
        peer.close()
    assert received == b"".join(bytes([index]) * block for index in range(count))
    assert server.offered_bytes[0] == MAX_SEND_BYTES, "four 64 KiB blocks reach the cap"
    assert max(server.offered_bytes) < MAX_SEND_BYTES + block


def test_a_full_kernel_buffer_is_reported_once_until_a_send_takes_everything(
    tcp_pair: tuple[gevent.socket.socket, gevent.socket.socket],
    channels: Callable[..., Channel],
) -> None:
    # A dispatcher waits for a write's completion to read again; once the kernel's buffer is
    # full that completion waits for the peer to read, so the channel says so (and stays
    # writable: 32 KiB pending is under the 64 KiB high watermark).
    server, peer = tcp_pair
    blocked = gevent.event.Event()
    reports: list[int] = []

    def on_blocked() -> None:
        reports.append(channel.pending_bytes)
        blocked.set()

    unblocked: list[bool] = []  # send_blocked as each return of the parked send is told

    channel = channels(
        server,
        on_send_blocked=on_blocked,
        on_send_unblocked=lambda: unblocked.append(channel.send_blocked),
    )
    outcomes = Outcomes()
    for index in range(15):  # 60 KiB, under the high watermark; the kernel holds ~45 KB
        channel.write(b"y" * 4096, outcomes.callback(index))
    assert blocked.wait(WAIT), "the kernel's buffer filled without a report"
    assert channel.send_blocked
    assert channel.writable
    channel.write(b"z" * 4096, outcomes.callback(15))  # queued behind the full buffer
    assert len(reports) == 1
    assert unblocked == []

    reader = gevent.spawn(_read_exactly, peer, 16 * 4096)
    outcomes.wait_for(16)
    assert reader.get(timeout=WAIT) == b"y" * 4096 * 15 + b"z" * 4096
    assert not channel.send_blocked
    assert len(reports) == 1
    # Whoever held back for the parked send hears that it returned: once, per report.
    assert unblocked == [False]


# -- socket options -------------------------------------------------------------------


def test_configure_socket_sets_tcp_options() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        default_sndbuf = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        configure_socket(sock)
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        if sys.platform.startswith("linux"):
            assert sock.getsockopt(socket.IPPROTO_TCP, 25) == 16384
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == default_sndbuf

        configure_socket(sock, nodelay=False, sndbuf=8192, rcvbuf=8192)
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
        if sys.platform.startswith("linux"):  # Linux doubles the request
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == 16384
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) == 16384
    finally:
        sock.close()


def test_configure_socket_skips_tcp_options_on_unix_sockets() -> None:
    a, b = socket.socketpair()
    try:
        configure_socket(a, sndbuf=8192)  # TCP_NODELAY would fail on AF_UNIX
        assert a.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) >= 8192
    finally:
        a.close()
        b.close()


@linux_only
def test_listen_buffers_are_inherited_by_accepted_sockets() -> None:
    server, client = _connected_pair(SMALL_BUFFER, configure_server=False)
    try:
        assert server.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) == 2 * SMALL_BUFFER
        assert server.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == 2 * SMALL_BUFFER
    finally:
        server.close()
        client.close()
