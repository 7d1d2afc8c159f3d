"""What partition producers and consumers share: life-cycle states, reconnection, timers.

A producer or consumer of one (partition) topic is a *handler* of the connection it is
registered with. When that connection is lost, or the broker closes the handler (a topic
unload on a real Pulsar cluster, say), the handler looks its topic up again and registers
anew on whichever broker now serves it, with exponential backoff, as the official client
does. Subclasses say how to register and what to do around it.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable

import gevent
import gevent.event

from brokerlet.client.connection import ClientContext, Connection
from brokerlet.client.errors import (
    AuthenticationError,
    AuthorizationError,
    IncompatibleSchema,
    InvalidTopicName,
    NotAllowedError,
    ProducerFenced,
    PulsarError,
    TopicNotFound,
    TopicTerminated,
)

__all__ = ["Handler", "OneShotTimer", "State"]

log = logging.getLogger("brokerlet.client")

_FIRST_BACKOFF = 0.1
_MAX_BACKOFF = 30.0

# Errors that a retry cannot fix: reconnecting stops and the handler fails.
_FATAL = (
    AuthenticationError,
    AuthorizationError,
    IncompatibleSchema,
    InvalidTopicName,
    NotAllowedError,
    ProducerFenced,
    TopicNotFound,
    TopicTerminated,
)


class State(enum.Enum):
    """Where a handler is in its life."""

    CREATING = "creating"
    READY = "ready"
    RECONNECTING = "reconnecting"
    CLOSING = "closing"
    CLOSED = "closed"


class OneShotTimer:
    """Runs a callback once after a delay, in a greenlet of its own; restartable.

    Used for batch flushes, grouped acks, negative-ack redelivery and send timeouts:
    at most one greenlet per timer at a time, never one per message.
    """

    __slots__ = ("_callback", "_greenlet")

    def __init__(self, callback: Callable[[], None]) -> None:
        self._callback = callback
        self._greenlet: gevent.Greenlet | None = None

    @property
    def armed(self) -> bool:
        return self._greenlet is not None

    def start(self, seconds: float) -> None:
        """Arm the timer; does nothing if it is already armed."""
        if self._greenlet is None:
            self._greenlet = gevent.spawn_later(max(seconds, 0.0), self._fire)

    def cancel(self) -> None:
        """Disarm the timer; a callback already running is left to finish."""
        greenlet = self._greenlet
        if greenlet is not None:
            self._greenlet = None
            greenlet.kill(block=False)

    def _fire(self) -> None:
        self._greenlet = None
        try:
            self._callback()
        except Exception:
            log.exception("timer callback %r failed", self._callback)


class Handler:
    """Base of the per-topic producer and consumer: state and reconnection.

    Subclasses implement :meth:`_register` (send PRODUCER or SUBSCRIBE on a connection and
    wait for the answer), :meth:`_unregister`, and the hooks :meth:`_disconnected`,
    :meth:`_reconnected` and :meth:`_failed`.

    Args:
        context: the client, for lookups.
        topic: the (partition) topic.
    """

    def __init__(self, context: ClientContext, topic: str) -> None:
        self.topic = topic
        self._context = context
        self._state = State.CREATING
        self._connection: Connection | None = None
        self._closed_event = gevent.event.Event()
        self._failure: PulsarError | None = None

    @property
    def state(self) -> State:
        return self._state

    @property
    def connection(self) -> Connection | None:
        """The connection while registered, None while reconnecting or closed."""
        return self._connection

    def start(self) -> None:
        """Look the topic up and register; raises what the broker answered."""
        connection = self._context.connection_for(self.topic)
        self._register(connection, initial=True)
        self._state = State.READY

    # -- called by the connection (reader greenlet) --------------------------------------

    def on_connection_lost(self, connection: Connection) -> None:
        if connection is self._connection:
            self._lose_connection(f"connection to {connection.logical_url} lost")

    def on_closed_by_broker(self, connection: Connection) -> None:
        if connection is self._connection:
            self._lose_connection(f"closed by the broker at {connection.logical_url}")

    # -- reconnection --------------------------------------------------------------------

    def _lose_connection(self, reason: str) -> None:
        self._connection = None
        if self._state is not State.READY:
            return
        log.info("%r: %s; reconnecting", self, reason)
        self._state = State.RECONNECTING
        self._disconnected()
        gevent.spawn(self._reconnect).name = f"reconnect {self.topic}"

    def _reconnect(self) -> None:
        delay = _FIRST_BACKOFF
        while self._state is State.RECONNECTING:
            try:
                connection = self._context.connection_for(self.topic)
                self._register(connection, initial=False)
            except _FATAL as error:
                log.error("%r: cannot reconnect: %s", self, error)
                self._fail(error)
                return
            except PulsarError as error:
                log.info("%r: reconnect failed (%s); retrying in %.1f s", self, error, delay)
                if self._closed_event.wait(delay):
                    return
                delay = min(delay * 2, _MAX_BACKOFF)
                continue
            if self.state is not State.RECONNECTING:
                # Closed while the registration was in flight: undo it.
                self._unregister(connection)
                return
            self._state = State.READY
            log.info("%r: reconnected to %s", self, connection.logical_url)
            self._reconnected()
            return

    def _fail(self, error: PulsarError) -> None:
        self._failure = error
        self._state = State.CLOSED
        self._closed_event.set()
        self._failed(error)

    def _mark_closed(self) -> None:
        self._state = State.CLOSED
        self._connection = None
        self._closed_event.set()

    # -- for subclasses ------------------------------------------------------------------

    def _register(self, connection: Connection, *, initial: bool) -> None:
        """Register on ``connection``, set ``self._connection``; raise PulsarError on refusal."""
        raise NotImplementedError

    def _unregister(self, connection: Connection) -> None:
        """Best-effort close of a registration nobody wants any more; never raises."""
        raise NotImplementedError

    def _disconnected(self) -> None:
        """The connection is gone and a reconnect is about to start."""

    def _reconnected(self) -> None:
        """Registered again after a reconnect."""

    def _failed(self, error: PulsarError) -> None:
        """Reconnecting hit an error a retry cannot fix; the handler is now closed."""
