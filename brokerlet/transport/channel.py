"""An outbound buffer for one gevent socket: watermarks, write completions, one writer.

A :class:`Channel` turns a socket into something an actor can write to without ever
blocking. ``write()`` only queues. A loop callback, once per loop pass, gathers what was
queued into one vectored ``sendmsg`` that does not wait; whatever the kernel does not take
at once is left to the channel's writer greenlet, which alone parks until the kernel's send
buffer has room, and sends everything queued behind it too. Most writes never wake the
writer (two greenlet switches each, a large share of a small write's cost). The
bytes queued but not yet handed to the kernel are the channel's *pending* bytes, and two
watermarks turn them into a writability signal (the same rule as Netty's
``WriteBufferWaterMark``):

* the channel becomes **unwritable** as soon as pending bytes exceed ``high_watermark``;
* it becomes **writable** again only once they drop below ``low_watermark``.

The gap between the two keeps a draining socket from flapping. Writes are never refused
while unwritable: the signal is advice to the producer (the dispatcher stops selecting the
consumer), not a limit.

A write's completion means its bytes were **handed to the kernel**, not that the peer
received them; only an application-level acknowledgement says that.

Backpressure only reaches the watermarks if the kernel's buffers are bounded; see
:mod:`brokerlet.transport.sockopts`.

Over TLS there is no vectored write (an ``SSLSocket`` has no ``sendmsg``) and no
non-blocking try: every write goes through the writer, which joins
the gathered buffers into one record-sized send instead, and retries it unchanged after a
timeout, as OpenSSL requires. Completions then mean "encrypted and handed to the kernel";
watermarks and writability work the same.

Everything here runs on one gevent hub; a channel is not thread-safe.
"""

from __future__ import annotations

import logging
import socket
import ssl
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Protocol

import gevent
import gevent.event
import gevent.socket
import gevent.ssl

__all__ = [
    "BytesLike",
    "Channel",
    "ChannelClosed",
    "ChannelLike",
    "ChannelStatistics",
    "WriteCallback",
    "is_tls_socket",
]

logger = logging.getLogger(__name__)

BytesLike = bytes | bytearray | memoryview
_Buffer = bytes | memoryview  # as queued: a bytearray is written through a view of it
WriteCallback = Callable[[BaseException | None], None]

# Linux's IOV_MAX; sendmsg fails with EMSGSIZE beyond it.
MAX_IOVECS = 1024
# Enough to fill a loopback send buffer in one call without building huge iovec lists.
MAX_SEND_BYTES = 256 * 1024
# Over TLS the gathered buffers are copied into one send: a few records at a time.
MAX_TLS_SEND_BYTES = 64 * 1024


class ChannelClosed(Exception):  # noqa: N818 -- reads as a state, like trio's ClosedResourceError
    """A write failed because its channel is closed.

    Attributes:
        cause: why the channel closed: the socket error, what the owner passed to
            :meth:`Channel.close`, or None for a plain close. Also set as ``__cause__``.
    """

    def __init__(self, cause: BaseException | None = None) -> None:
        message = "channel closed" if cause is None else f"channel closed: {cause!r}"
        super().__init__(message)
        self.cause = cause
        self.__cause__ = cause


@dataclass(frozen=True, slots=True)
class ChannelStatistics:
    """A snapshot of a channel's counters.

    Attributes:
        writable: whether the channel is writable (see the module docstring).
        pending_bytes: bytes queued and not yet handed to the kernel.
        writability_changes: how many times ``writable`` has flipped, either way.
        bytes_written: bytes handed to the kernel so far.
        writes: logical writes completed so far (each ``write()`` call counts once, however
            many buffers it had).
        closed: whether the channel is closed.
    """

    writable: bool
    pending_bytes: int
    writability_changes: int
    bytes_written: int
    writes: int
    closed: bool


class ChannelLike(Protocol):
    """What the actors use of a connection's channel: a `Channel`, or a test's fake.

    Compiled, `Channel` is a native class, whose type compiled code checks at runtime where
    it is declared; the connection's handle declares this instead (dispatch's tests hand it
    fakes that only know writability).
    """

    @property
    def writable(self) -> bool: ...

    @property
    def send_blocked(self) -> bool: ...

    def write(
        self, data: BytesLike | Sequence[BytesLike], callback: WriteCallback | None = None
    ) -> None: ...

    def close(self, exc: BaseException | None = None) -> None: ...

    def statistics(self) -> ChannelStatistics: ...


class _PendingWrite:
    """One logical write: its remaining buffers and the callback to run once all are sent."""

    __slots__ = ("buffers", "callback", "index")

    def __init__(self, buffers: list[_Buffer], callback: WriteCallback | None) -> None:
        self.buffers = buffers
        self.callback = callback
        self.index = 0  # first buffer not yet fully sent

    def unsent(self) -> Iterator[_Buffer]:
        return islice(self.buffers, self.index, None)

    def consume(self, sent: int) -> int:
        """Advance past up to ``sent`` bytes; return how many of them belong to later writes."""
        buffers = self.buffers
        index = self.index
        while index < len(buffers):
            size = len(buffers[index])
            if sent < size:
                if sent:
                    # A view of the unsent tail: it is never copied.
                    buffers[index] = memoryview(buffers[index])[sent:]
                    sent = 0
                break
            sent -= size
            index += 1
        self.index = index
        return sent

    @property
    def done(self) -> bool:
        return self.index == len(self.buffers)


def is_tls_socket(sock: object) -> bool:
    """Whether ``sock`` is a TLS socket: the standard library's or gevent's, which is not a
    subclass of it. Such a socket has no ``sendmsg``, and OpenSSL may hold bytes of it that
    the kernel no longer has."""
    return isinstance(sock, ssl.SSLSocket | gevent.ssl.SSLSocket)


def _byte_view(data: BytesLike) -> memoryview:
    view = memoryview(data)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    return view


class Channel:
    """A non-blocking outbound buffer over a gevent socket.

    Writes go out from a loop callback of the current hub; a writer greenlet, spawned there
    by the first send the kernel does not take whole (at once on a TLS socket), parks in the
    sends that must wait. Callbacks run as follows:

    * a write's ``callback(None)`` runs once all of that write's bytes are in the kernel,
      in write order, never inside ``write()``: in the loop callback that flushed it, or in
      the writer greenlet;
    * ``on_writability_changed(False)`` runs synchronously inside the ``write()`` that
      crossed the high watermark; ``on_writability_changed(True)`` runs where the write
      callbacks do, once pending bytes drop below the low watermark (before the callbacks
      of the writes that send completed). Each flip is reported exactly once;
    * ``on_send_blocked()`` runs as a loop callback once the writer has parked in a send
      (the kernel's buffer is full, and what is written now waits for the peer to read), on
      plain and TLS sockets alike; :attr:`send_blocked` is True while it stays parked;
    * ``on_send_unblocked()`` runs in the writer greenlet once that send returns (after
      :attr:`send_blocked` turned False, before its write callbacks): whoever held back for
      the parked send may write again. It pairs with ``on_send_blocked``, one for one;
    * when the channel closes, every pending write's callback gets a :class:`ChannelClosed`,
      then ``on_closed`` runs once, where it was closed (the owner's greenlet for
      :meth:`close`; the flush callback or the writer for a socket error).

    Callbacks that run in the flush callback run on the hub, so they must not block (they
    never did: they ran in the writer, and a blocked writer stops the channel).

    An exception raised by any callback is logged and otherwise ignored; it never stops
    the writer. Callbacks may call :meth:`write` and :meth:`close`.

    The channel only writes. Whoever reads the socket sees EOF or errors on its own and
    should call :meth:`close`; a reset peer is also noticed by the next send.

    Args:
        sock: a connected gevent socket, in cooperative blocking mode (timeout None or
            positive; a positive timeout only bounds each wait and the writer retries).
            The channel becomes its only writer and closes it on close.
        high_watermark: the channel turns unwritable once pending bytes exceed this.
        low_watermark: an unwritable channel turns writable once pending bytes drop
            below this.
        on_writability_changed: called with the new value on each flip.
        on_send_blocked: called when the writer parks in a send (see above).
        on_send_unblocked: called when a send reported by ``on_send_blocked`` returns.
        on_closed: called once when the channel closes, with the socket error that
            closed it, or with what was passed to :meth:`close`.
        name: a label for logs and the writer greenlet.

    Raises:
        ValueError: the watermarks are not ``0 < low_watermark <= high_watermark``, or the
            socket is non-blocking (timeout 0), which would make the writer spin.
    """

    def __init__(
        self,
        sock: gevent.socket.socket,
        *,
        high_watermark: int = 65536,
        low_watermark: int = 32768,
        on_writability_changed: Callable[[bool], None] | None = None,
        on_closed: Callable[[BaseException | None], None] | None = None,
        name: str = "",
        on_send_blocked: Callable[[], None] | None = None,
        on_send_unblocked: Callable[[], None] | None = None,
    ) -> None:
        if not 0 < low_watermark <= high_watermark:
            raise ValueError(
                f"watermarks must satisfy 0 < low <= high, got low={low_watermark} "
                f"high={high_watermark}"
            )
        if sock.gettimeout() == 0.0:
            raise ValueError("the channel needs a socket in blocking mode, not timeout 0")
        self.name = name
        self._sock = sock
        # SSL sockets have no sendmsg: they take the joined-buffer path in _send.
        self._vectored = not is_tls_socket(sock)
        self._max_send = MAX_SEND_BYTES if self._vectored else MAX_TLS_SEND_BYTES
        self._high = high_watermark
        self._low = low_watermark
        self._on_writability_changed = on_writability_changed
        self._on_send_blocked = on_send_blocked
        self._on_send_unblocked = on_send_unblocked
        self._loop = gevent.get_hub().loop
        self._on_closed = on_closed
        self._queue: deque[_PendingWrite] = deque()
        # Writes wholly in the kernel whose callbacks have not run yet.
        self._finishing: deque[_PendingWrite] = deque()
        self._wakeup = gevent.event.Event()
        self._writable = True
        self._in_send = False  # seen True by others only while the writer is parked in it
        # The writer greenlet owns the socket from a failed try until the queue is empty;
        # otherwise writes are flushed by a loop callback without waking it.
        self._writer_active = not self._vectored
        self._flush_pending = False
        self._park_check_pending = False
        self._blocked_reported = False  # on_send_blocked ran for the send in progress
        self._closed = False
        self._close_cause: BaseException | None = None
        self._pending_bytes = 0
        self._writability_changes = 0
        self._bytes_written = 0
        self._writes = 0
        # Started by the first send the kernel does not take whole (at once for TLS): most
        # connections never need it, and its spawn and exit were 37,000 of the 512,000
        # instructions a connection's set-up and close cost.
        self._writer: gevent.Greenlet | None = None
        if self._writer_active:
            self._start_writer()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("writable" if self._writable else "unwritable")
        return f"<Channel {self.name!r} {state} pending={self._pending_bytes}>"

    @property
    def writable(self) -> bool:
        """False once pending bytes exceed the high watermark, until they drop below the low.

        Also False once closed.
        """
        return self._writable

    @property
    def send_blocked(self) -> bool:
        """The writer is parked in a send: the kernel's buffer is full, and what is written
        now waits for the peer to read (the channel may still be writable, under its high
        watermark)."""
        return self._in_send

    @property
    def pending_bytes(self) -> int:
        """Bytes queued but not yet handed to the kernel."""
        return self._pending_bytes

    @property
    def closed(self) -> bool:
        """Whether the channel is closed."""
        return self._closed

    def write(
        self, data: BytesLike | Sequence[BytesLike], callback: WriteCallback | None = None
    ) -> None:
        """Queue bytes for sending; never blocks.

        The buffers are sent without copying, so the caller must not change a mutable
        buffer (``bytearray``, ``memoryview``) until the write completes.

        Args:
            data: one buffer, or a sequence of buffers sent back to back as one logical
                write.
            callback: called once: with None when all of ``data`` has been handed to the
                kernel (not delivered to the peer), or with :class:`ChannelClosed` if the
                channel closes first. On a closed channel it is called with
                :class:`ChannelClosed` before ``write()`` returns.

        Raises:
            TypeError: ``data`` is not a bytes-like object or a sequence of them.
        """
        buffers: list[_Buffer]
        view: _Buffer
        if type(data) is bytes:
            # Nearly every write: bytes go to sendmsg as they are, and become a view only
            # if a partial send leaves a tail.
            buffers = [data] if data else []
            size = len(data)
        elif isinstance(data, bytes | bytearray | memoryview):
            view = _byte_view(data)
            buffers = [view] if len(view) else []
            size = len(view)
        else:
            buffers = []
            size = 0
            for part in data:
                view = part if type(part) is bytes else _byte_view(part)
                if len(view):
                    buffers.append(view)
                    size += len(view)
        if self._closed:
            self._notify_write(callback, ChannelClosed(self._close_cause))
            return
        self._queue.append(_PendingWrite(buffers, callback))
        self._pending_bytes += size
        if self._writer_active:
            self._wakeup.set()
        elif not self._flush_pending:
            self._flush_pending = True
            self._loop.run_callback(self._flush)
        if self._writable and self._pending_bytes > self._high:
            self._set_writable(False)

    def close(self, exc: BaseException | None = None) -> None:
        """Close the channel and its socket; idempotent, never blocks.

        Bytes already handed to the kernel may still reach the peer. Writes wholly in the
        kernel whose callbacks are still due (when this is called from a write callback)
        complete with None first, keeping callbacks in write order; then pending writes fail
        with ``ChannelClosed(exc)``, and so do later ones. ``on_closed(exc)`` runs once,
        before this returns, unless the channel was already closed.

        Args:
            exc: why the channel is being closed, passed on to the callbacks.
        """
        self._shutdown(exc)

    def statistics(self) -> ChannelStatistics:
        """Return a snapshot of the channel's counters."""
        return ChannelStatistics(
            writable=self._writable,
            pending_bytes=self._pending_bytes,
            writability_changes=self._writability_changes,
            bytes_written=self._bytes_written,
            writes=self._writes,
            closed=self._closed,
        )

    # -- flushing without the writer ---------------------------------------------------

    def _flush(self) -> None:
        """A loop callback: hand what is queued to the kernel without blocking.

        Most writes fit in the kernel's buffer: sending them here, once per loop pass for
        everything written since, saves waking the writer greenlet (two switches) per write.
        What the kernel does not take at once is left to the writer, which parks in its send.
        """
        self._flush_pending = False
        try:
            while self._queue and not self._closed and not self._writer_active:
                buffers, size = self._gather()
                try:
                    sent = self._sock.sendmsg(buffers, (), socket.MSG_DONTWAIT) if size else 0
                except BlockingIOError:
                    sent = 0
                except OSError as exc:
                    self._shutdown(exc)
                    return
                if sent < size:
                    self._writer_active = True
                    if self._writer is None:
                        self._start_writer()
                    self._wakeup.set()
                self._complete(sent)
        except Exception as exc:
            logger.exception("%r: flush failed", self)
            self._shutdown(exc)

    # -- the writer greenlet -------------------------------------------------------------

    def _start_writer(self) -> None:
        writer = gevent.Greenlet(self._run_writer)
        writer.name = f"channel-writer {self.name}".rstrip()
        self._writer = writer
        writer.start()

    def _run_writer(self) -> None:
        try:
            while not self._closed:
                self._wakeup.wait()
                self._wakeup.clear()
                while self._queue and not self._closed:
                    buffers, _ = self._gather()
                    sent = self._send(buffers) if buffers else 0
                    if sent is None:
                        return
                    self._complete(sent)
                if self._vectored:
                    self._writer_active = False  # later writes are flushed by the loop
        except Exception as exc:
            logger.exception("%r: writer failed", self)
            self._shutdown(exc)
        except BaseException as exc:  # killed, or the interpreter is exiting
            self._shutdown(exc)
            raise

    def _gather(self) -> tuple[list[_Buffer], int]:
        """The queued buffers for one send, up to the iovec and byte caps, and their size."""
        queue = self._queue
        if len(queue) == 1 and self._pending_bytes < self._max_send:
            # One write, untouched: its own list (pending bytes are all its unsent bytes).
            head = queue[0]
            if not head.index and len(head.buffers) < MAX_IOVECS:
                return head.buffers, self._pending_bytes
        buffers: list[_Buffer] = []
        total = 0
        for pending in queue:
            for buffer in pending.unsent():
                buffers.append(buffer)
                total += len(buffer)
                if len(buffers) >= MAX_IOVECS or total >= self._max_send:
                    return buffers, total
        return buffers, total

    def _check_parked(self) -> None:
        """A loop callback queued before a send: it runs at the writer's first yield, which
        is the send parking if the kernel's buffer is full, or a later idle wait if not."""
        self._park_check_pending = False
        if self._in_send and not self._closed and self._on_send_blocked is not None:
            self._blocked_reported = True
            try:
                self._on_send_blocked()
            except Exception:
                logger.exception("%r: on_send_blocked raised", self)

    def _send(self, buffers: list[_Buffer]) -> int | None:
        """Hand buffers to the kernel; return the bytes taken, or None once closed."""
        if self._on_send_blocked is not None and not self._park_check_pending:
            self._park_check_pending = True
            self._loop.run_callback(self._check_parked)
        self._in_send = True
        try:
            return self._send_now(buffers)
        finally:
            self._in_send = False
            if self._blocked_reported:
                self._blocked_reported = False
                self._send_unblocked()

    def _send_unblocked(self) -> None:
        if self._on_send_unblocked is not None and not self._closed:
            try:
                self._on_send_unblocked()
            except Exception:
                logger.exception("%r: on_send_unblocked raised", self)

    def _send_now(self, buffers: list[_Buffer]) -> int | None:
        if not self._vectored:
            return self._send_joined(buffers)
        while True:
            try:
                # Parks only this greenlet while the kernel's buffer is full.
                sent: int = self._sock.sendmsg(buffers)
            except TimeoutError:
                # A socket timeout set for reads; nothing was sent, so try again.
                if self._closed:
                    return None
                continue
            except OSError as exc:
                # After close() the parked send is cancelled with EBADF: not a new error.
                if not self._closed:
                    self._shutdown(exc)
                return None
            return sent

    def _send_joined(self, buffers: list[_Buffer]) -> int | None:
        """The TLS path: one ``send`` of the joined buffers, retried unchanged on timeout."""
        data: BytesLike = buffers[0] if len(buffers) == 1 else b"".join(buffers)
        while True:
            try:
                sent: int = self._sock.send(data)
            except (TimeoutError, ssl.SSLError) as exc:
                # gevent reports a timed-out SSL write as SSLError("... timed out").
                timed_out = isinstance(exc, TimeoutError) or "timed out" in str(exc)
                if timed_out and not self._closed:
                    continue
                if not self._closed:
                    self._shutdown(exc)
                return None
            except OSError as exc:
                if not self._closed:
                    self._shutdown(exc)
                return None
            return sent

    def _complete(self, sent: int) -> None:
        self._pending_bytes -= sent
        self._bytes_written += sent
        # Unlink finished writes before running any callback: if a callback closes the
        # channel, the writes already in the kernel still complete, and in order.
        queue = self._queue
        if not self._pending_bytes:
            # Everything queued is in the kernel: no write needs its buffers walked.
            self._finishing.extend(queue)
            queue.clear()
        while queue:
            head = queue[0]
            sent = head.consume(sent)
            if not head.done:
                break
            self._finishing.append(queue.popleft())
        # Flip before the write callbacks, so they see `writable` agree with `pending_bytes`.
        if not self._writable and self._pending_bytes < self._low:
            self._set_writable(True)
        self._run_finished_callbacks()

    def _run_finished_callbacks(self) -> None:
        finishing = self._finishing
        while finishing:
            callback = finishing.popleft().callback
            self._writes += 1
            if callback is not None:
                self._notify_write(callback, None)

    # -- state changes and callbacks -------------------------------------------------------

    def _set_writable(self, writable: bool) -> None:
        self._writable = writable
        self._writability_changes += 1
        if self._on_writability_changed is not None:
            try:
                self._on_writability_changed(writable)
            except Exception:
                logger.exception("%r: on_writability_changed(%s) raised", self, writable)

    def _shutdown(self, cause: BaseException | None) -> None:
        if self._closed:
            return
        self._closed = True
        self._close_cause = cause
        self._writable = False
        failed = list(self._queue)
        self._queue.clear()
        self._pending_bytes = 0
        self._wakeup.set()  # lets an idle writer exit
        try:
            # Also cancels a send parked in the writer.
            self._sock.close()
        except OSError:
            logger.debug("%r: closing the socket failed", self, exc_info=True)
        # Closed from a completion callback: the rest of that batch succeeded, and goes first.
        self._run_finished_callbacks()
        for pending in failed:
            self._notify_write(pending.callback, ChannelClosed(cause))
        if self._on_closed is not None:
            try:
                self._on_closed(cause)
            except Exception:
                logger.exception("%r: on_closed raised", self)

    def _notify_write(self, callback: WriteCallback | None, error: BaseException | None) -> None:
        if callback is None:
            return
        try:
            callback(error)
        except Exception:
            logger.exception("%r: write callback raised", self)
