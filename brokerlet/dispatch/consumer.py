"""Consumers and their permit accounting.

A :class:`Consumer` is shared by two actors: the connection actor that received its SUBSCRIBE
and FLOWs, and the dispatcher actor of its subscription. They touch disjoint parts:

* the connection actor calls :meth:`Consumer.flow`;
* the dispatcher owns ``pending`` and ``unacked`` and calls :meth:`Consumer.debit`,
  :meth:`Consumer.attach` and :meth:`Consumer.detach`.

Permits are the one field both write. They live behind the consumer's own small lock, and the
dispatcher's total is a :class:`~brokerlet.dispatch.permits.PermitTotal` that every writer updates
atomically, so a FLOW reaches the total at once, without queueing behind the dispatcher's mailbox
(docs/architecture.md, "Flow").
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from brokerlet.dispatch.permits import PermitTotal
from brokerlet.dispatch.stats import Rate

if TYPE_CHECKING:
    import pykka

    from brokerlet.actors._conflate import ConflatedTell
    from brokerlet.actors.connection import ConnectionActor
    from brokerlet.actors.dispatcher import DispatcherActor
    from brokerlet.actors.eventloop import EventLoopActor
    from brokerlet.keyshared import KeySharedMeta
    from brokerlet.transport.channel import ChannelLike

__all__ = ["ConnectionHandle", "Consumer"]


class ConnectionHandle:
    """What other actors may know of a connection: its channel, its event loop and its consumers.

    ``consumers`` is replaced as a whole by the connection actor (one reference assignment), so
    the event loop can walk it on a writable event without taking any lock.
    """

    # A plain class, not a dataclass: compiled, a dataclass's field types are looked up at
    # import, and these are type names only (dispatch/ imports no actor or gevent module).
    def __init__(
        self,
        peer: str,
        channel: ChannelLike,
        event_loop: pykka.ActorRef[EventLoopActor],  # owns this channel's I/O tasks
        *,
        actor: pykka.ActorRef[ConnectionActor] | None = None,  # for broker-initiated closes
        consumers: tuple[Consumer, ...] = (),
        closed: bool = False,
        # WritabilityChanged to ``event_loop``, conflated.
        writable_notice: ConflatedTell[EventLoopActor] | None = None,
    ) -> None:
        self.peer = peer
        self.channel = channel
        self.event_loop = event_loop
        self.actor = actor
        self.consumers = consumers
        self.closed = closed
        self.writable_notice = writable_notice

    def __repr__(self) -> str:
        return f"ConnectionHandle({self.peer!r}, consumers={len(self.consumers)})"

    def channel_writability_changed(self, writable: bool) -> None:
        """The channel's callback; runs on the I/O path, so it only queues a notification."""
        if writable and self.writable_notice is not None:
            self.writable_notice.request()

    def channel_send_blocked(self) -> None:
        """The channel's callback when the kernel's buffer is full: the write completions the
        dispatchers wait for to read again now wait for the client to read, which a paused
        client never does. Its dispatchers read now, for their other consumers (the channel
        may still be writable: its pending bytes are under the high watermark)."""
        for consumer in self.consumers:
            if consumer.read_gate is not None:
                consumer.read_gate.request()

    def channel_send_unblocked(self) -> None:
        """The channel's callback when that parked send returns. A dispatcher that found
        its consumer here not accepting (`Consumer.accepting`) stopped; with no write of its
        own in flight, no completion will wake it, and the channel, under its high watermark
        throughout, makes no writable event. It is woken as by one: the event loop's
        writability task requests a read for every writable consumer of the connection."""
        if self.writable_notice is not None:
            self.writable_notice.request()


@dataclass(eq=False)
class Consumer:
    """One consumer of a subscription, as the broker sees it."""

    consumer_id: int
    name: str
    topic: str
    subscription: str
    sub_type: int
    priority: int
    connection: ConnectionHandle
    read_gate: ConflatedTell[DispatcherActor] | None = None  # the dispatcher's read request
    key_shared: KeySharedMeta | None = None  # Key_Shared options from SUBSCRIBE
    # Exclusive/Failover: the client's consumer_epoch (SUBSCRIBE, raised by REDELIVER); MESSAGE
    # frames carry it, and the client drops those of an older epoch. None: the client sent none.
    epoch: int | None = None
    # Set by the connection as it answers the client's CLOSE_CONSUMER, before the dispatcher
    # removes it: the event loop writes no MESSAGE for it after that answer.
    closed: bool = False

    # Dispatcher-owned state.
    pending: dict[int, int] = field(default_factory=dict)  # entry id -> messages unacked
    unacked: int = 0
    msg_out: int = 0
    bytes_out: int = 0
    # Moving average of messages per entry over its deliveries (Pulsar's avgMessagesPerEntry;
    # 0 before the first): sizes reads under precise_dispatcher_flow_control.
    avg_messages_per_entry: float = 0.0
    rate_out: Rate = field(default_factory=Rate)
    throughput_out: Rate = field(default_factory=Rate)

    # Permit accounting, behind _lock.
    _permits: int = 0
    _parked: int = 0  # FLOW permits received while blocked
    _blocked: bool = False
    _total: PermitTotal | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def permits(self) -> int:
        return self._permits

    @property
    def messages_per_entry(self) -> int:
        """The average rounded half up, as Pulsar reports it (0 before any delivery)."""
        return int(self.avg_messages_per_entry + 0.5)

    @property
    def accounted(self) -> bool:
        """True from :meth:`attach` until :meth:`detach`: the dispatcher counts its FLOWs."""
        return self._total is not None

    @property
    def writable(self) -> bool:
        return self.connection.channel.writable

    @property
    def accepting(self) -> bool:
        """Writable, and the kernel took all of the last send: a write now is sent at once.

        A paused client's socket fills while the channel is still under its high watermark;
        writes queued then wait for the client, and so would the read their completion
        requests. Until its writes complete, the consumer gets nothing more.
        """
        channel = self.connection.channel
        return channel.writable and not channel.send_blocked

    def flow(self, permits: int) -> None:
        """Add FLOW permits, to the dispatcher's total too while accounted; request a read.

        Runs on the connection actor that received the FLOW. While the consumer is blocked on
        unacked messages the permits are parked instead, and :meth:`unblock` releases them.
        """
        with self._lock:
            if self._blocked:
                self._parked += permits
                return
            self._permits += permits
            if self._total is not None:
                self._total.add(permits)
        if self.read_gate is not None:
            self.read_gate.request()

    @property
    def blocked(self) -> bool:
        """True while the consumer holds ``max_unacked_messages_per_consumer`` unacked messages."""
        return self._blocked

    @property
    def parked_permits(self) -> int:
        return self._parked

    def block(self) -> None:
        """Stop taking FLOW permits into the balance (the dispatcher saw the unacked limit)."""
        with self._lock:
            self._blocked = True

    def unblock(self) -> None:
        """Release the parked permits into the balance and the total; request a read."""
        with self._lock:
            if not self._blocked:
                return
            self._blocked = False
            parked, self._parked = self._parked, 0
            self._permits += parked
            if self._total is not None:
                self._total.add(parked)
        if self.read_gate is not None:
            self.read_gate.request()

    def debit(self, messages: int) -> None:
        """Charge ``messages`` dispatched to this consumer (may go negative)."""
        with self._lock:
            self._permits -= messages
            if self._total is not None:
                self._total.add(-messages)

    def attach(self, total: PermitTotal, read_gate: ConflatedTell[DispatcherActor]) -> None:
        """Start accounting: the balance so far joins the dispatcher's total."""
        with self._lock:
            self.read_gate = read_gate
            self._total = total
            total.add(self._permits)

    def detach(self) -> bool:
        """Stop accounting and debit this consumer's balance from the total.

        Returns False when the consumer was not accounted (a second removal), so callers
        release its unacked count only once.
        """
        with self._lock:
            total = self._total
            if total is None:
                return False
            self._total = None
            total.add(-self._permits)
            return True

    def __repr__(self) -> str:
        return (
            f"Consumer({self.consumer_id}, {self.name!r}, {self.topic} / {self.subscription}, "
            f"peer={self.connection.peer})"
        )
