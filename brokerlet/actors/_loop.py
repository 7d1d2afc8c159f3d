"""The actors' hot loop: an actor's inbox, the turn a busy greenlet takes, and the loop that
hands each message to its handler; every message between actors passes here, compiled
(brokerlet/_compiled.py). `brokerlet.actors._runtime` builds its actors on them.
"""

from __future__ import annotations

import collections
import queue
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Final, TypeVar

import gevent
import pykka.messages
from pykka._envelope import Envelope

if TYPE_CHECKING:
    from brokerlet.actors._runtime import GeventActor

__all__ = ["TIME_SLICE", "FairInbox", "handle_messages", "in_turns", "take_turn"]


T = TypeVar("T")

TIME_SLICE: Final = 0.001
"""Seconds an actor may keep handling queued messages before it lets the hub run others."""


def take_turn() -> None:
    """Let the sockets that became ready, the timers that fell due and every other greenlet
    that wants the hub run once, then carry on.

    ``gevent.sleep(0)`` queues the caller behind other callbacks, and gevent runs up to 50
    callbacks before it next looks at the clock: with a few busy greenlets taking turns that
    way, a timer or a new socket event waited 50 slices (about 50 ms in `make bench`'s stall
    probe). A zero timer resumes the caller in the loop's next pass over its watchers
    instead, so the wait for anything else is one turn of each busy greenlet.

    The timer is due now, not at the loop's cached time: libev runs expired timers in order
    of expiry, and one due when the iteration began would jump ahead of every timer that
    fell due since, which then waited a second round of turns.
    """
    hub = gevent.get_hub()
    hub.loop.update_now()
    with hub.loop.timer(0.0) as turn:
        hub.wait(turn)


def in_turns(items: Iterable[T]) -> Iterator[T]:
    """``items``, one by one, taking a turn (`take_turn`) whenever :data:`TIME_SLICE` has
    gone by since the last: a periodic pass over every open topic (quotas, expiry,
    retention, compaction thresholds) lets the hub run others between topics, instead of
    holding it for all of them (150 ms with 8,000 topics)."""
    slice_ends = time.perf_counter() + TIME_SLICE
    for item in items:
        yield item
        if time.perf_counter() >= slice_ends:
            take_turn()
            slice_ends = time.perf_counter() + TIME_SLICE


class FairInbox:
    """An actor's inbox: the items, the actor's greenlet while it waits, and turns for a
    busy actor.

    A put wakes a waiting actor through one loop callback that switches to it. This does
    what gevent's ``SimpleQueue`` did here at under half its cost per hand-over (2.3 against
    5.0 µs on the 2-vCPU bench machine, `bench/micro/actor_hop.py`), which matters because a
    message takes ten or more hand-overs through the broker. It has no capacity, no
    timeouts and no other readers: only its actor's loop gets from it.

    A hand-over to an actor that already has items needs no switch at all, so an actor with
    a long queue would hold the hub until the queue is empty: every other actor, reader and
    timer would wait behind it. After each :data:`TIME_SLICE` of uninterrupted handling, the
    next ``get`` yields to the hub first.
    """

    __slots__ = ("_items", "_schedule", "_slice_ends", "_switch_out", "_waiter")

    def __init__(self) -> None:
        hub = gevent.get_hub()
        self._items: collections.deque[Any] = collections.deque()
        self._waiter: Any = None  # the actor's greenlet while it waits for an item
        self._schedule = hub.loop.run_callback
        self._switch_out = hub.switch
        self._slice_ends = 0.0

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        """Add ``item``; never blocks (``block`` and ``timeout`` are accepted and unused)."""
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            self._schedule(waiter.switch)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """The next item; waits for one (other greenlets run meanwhile) unless ``block`` is
        False, which raises `queue.Empty` instead. ``timeout`` is not supported."""
        items = self._items
        if items:
            if time.perf_counter() < self._slice_ends:
                return items.popleft()
            take_turn()
        elif not block:
            raise queue.Empty
        else:
            if timeout is not None:
                raise ValueError("FairInbox.get() has no timeout")
            self._wait()
        self._slice_ends = time.perf_counter() + TIME_SLICE
        return items.popleft()

    def _wait(self) -> None:
        current = gevent.getcurrent()
        items = self._items
        while not items:
            self._waiter = current
            try:
                self._switch_out()
            finally:
                if self._waiter is current:  # woken otherwise: killed, say
                    self._waiter = None

    def empty(self) -> bool:
        """Whether no item is waiting."""
        return not self._items

    def qsize(self) -> int:
        """How many items are waiting."""
        return len(self._items)


_ENVELOPE: Final = Envelope  # Final: compiled, a C static rather than a dict lookup per item
# Pykka's own messages (stop, proxy calls and attributes), which its _handle_receive serves.
_PYKKA_MESSAGES: Final = frozenset(
    {
        pykka.messages._ActorStop,
        pykka.messages.ProxyCall,
        pykka.messages.ProxyGetAttr,
        pykka.messages.ProxySetAttr,
    }
)


def handle_messages(actor: GeventActor, inbox: FairInbox) -> None:
    """``actor``'s loop until it stops: each item of ``inbox`` to its handler, an ask's
    result or exception to its future; a failure goes to the actor's ``_failed``."""
    stopped = actor.actor_stopped
    while not stopped.stopped:
        item = inbox.get()
        if item.__class__ is _ENVELOPE:
            message, reply_to = item.message, item.reply_to
        else:
            message, reply_to = item, None
        try:
            if message.__class__ in _PYKKA_MESSAGES:
                response = actor._handle_receive(message)
            else:
                response = actor.on_receive(message)
            if reply_to is not None:
                reply_to.set(response)
        except BaseException as error:  # the actor applies Pykka's rules, BaseException too
            actor._failed(error, reply_to)
