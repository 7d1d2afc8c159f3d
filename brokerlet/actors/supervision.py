"""Supervision: an actor that fails is replaced, and the peers it served reconnect.

Erlang and Akka's rule, on Pykka's ``on_failure`` hooks. A handler's unhandled exception stops
its actor (Pykka logs nothing more: :class:`~brokerlet.actors._runtime.GeventActor` logs the
failure once, at ERROR, with its traceback); the actor's ``on_failure`` then hands its
durable state to its supervisor and tells the clients it served to reconnect:

- a **topic** stops its dispatchers (they save their cursors), tells the connections of its
  producers to close them (CLOSE_PRODUCER) and reports :class:`TopicFailed` with its
  subscriptions' cursors to the broker, which drops the dead ref; the next user of the topic
  gets a fresh actor on the same ledger, with those cursors;
- a **dispatcher** closes its consumers (CLOSE_CONSUMER) and reports
  :class:`DispatcherFailed` with its cursor to its topic, which starts a fresh dispatcher
  from that cursor when a consumer comes back; unacknowledged messages are redelivered;
- a **connection** releases its producers and consumers and closes its socket.

Every failure is counted by actor kind (``brokerlet_actor_restarts_total{kind=...}``).
Messages to an actor that may have failed go through :func:`tell_quietly`: a dead recipient
must never take the sender down with it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pykka

from brokerlet.actors.messages import (
    CursorState,
    DispatcherFailed,
    GetCursorState,
    TopicClosedByBroker,
    TopicFailed,
)

if TYPE_CHECKING:
    from brokerlet.actors.dispatcher import DispatcherActor
    from brokerlet.dispatch.consumer import Consumer

__all__ = [
    "CursorState",
    "DispatcherFailed",
    "GetCursorState",
    "QuietRef",
    "TopicClosedByBroker",
    "TopicFailed",
    "record_failure",
    "restarts",
    "tell_quietly",
]

log = logging.getLogger(__name__)

_restarts: Counter[str] = Counter()
_lock = threading.Lock()


def record_failure(kind: str) -> None:
    """Count one failed actor of ``kind`` (``topic``, ``dispatcher``, ``connection``)."""
    with _lock:
        _restarts[kind] += 1


def restarts() -> dict[str, int]:
    """Failed actors so far, by kind, for every kind (0 when none failed)."""
    with _lock:
        return {kind: _restarts[kind] for kind in ("topic", "dispatcher", "connection")}


def tell_quietly(ref: pykka.ActorRef[Any] | QuietRef | None, message: object) -> bool:
    """Tell ``message`` to ``ref`` unless the actor is dead; returns whether it was told."""
    if ref is None:
        return False
    try:
        ref.tell(message)
    except pykka.ActorDeadError:
        return False
    return True


class QuietRef:
    """An actor ref whose ``tell`` drops the message if the actor is dead.

    Given to children for their parent: a dispatcher whose topic just failed (and is about
    to stop it) must not fail itself telling the topic an ack moved.
    """

    __slots__ = ("ref",)

    def __init__(self, ref: pykka.ActorRef[Any]) -> None:
        self.ref = ref

    def tell(self, message: object) -> None:
        tell_quietly(self.ref, message)

    def ask(self, message: object, **kwargs: Any) -> Any:
        return self.ref.ask(message, **kwargs)


def stop_quietly(ref: pykka.ActorRef[Any], timeout: float = 5.0) -> None:
    """Stop an actor and wait for it, whether it is alive, stopping or already dead."""
    with contextlib.suppress(pykka.ActorDeadError, pykka.Timeout):
        ref.stop(block=True, timeout=timeout)


def dispatcher_failed(
    dispatcher: DispatcherActor, closed_by_broker: Callable[[Consumer], object]
) -> None:
    """The on_failure of a dispatcher actor: close its consumers, report its cursor.

    ``closed_by_broker(consumer)`` makes the message that tells a connection to close one.
    """
    record_failure("dispatcher")
    for timer in (dispatcher._retry, dispatcher._replay_timer, dispatcher._persist_timer):
        if timer is not None:
            timer.cancel()
    cursor: CursorState | None = None
    if dispatcher.durable:
        cursor = (dispatcher.cursor.mark_delete, dispatcher.cursor.acked_ranges())
        try:
            dispatcher.cursor_saver.save()
        except Exception:
            log.exception("%s: could not save the cursor of a failed dispatcher", dispatcher)
    consumers = dispatcher.book.consumers
    for consumer in list(consumers):
        consumer.detach()
        tell_quietly(consumer.connection.actor, closed_by_broker(consumer))
    consumers.clear()
    tell_quietly(dispatcher.topic, DispatcherFailed(dispatcher.name, dispatcher.actor_ref, cursor))
