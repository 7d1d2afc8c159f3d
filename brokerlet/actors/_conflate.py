"""Conflated tells: many requests for the same work, one message in the inbox.

Pulsar guards its dispatcher read loop with one atomic state, IDLE, RUNNING
or RUNNING_REQUESTED, so that any number of wake-ups while a pass runs cause
exactly one more pass. An actor already runs one message at a time, so the
same gate shrinks to a single "a message is waiting" flag:

- IDLE: no message waiting. `request()` sets the flag and tells the message.
- Message waiting (RUNNING_REQUESTED): `request()` does nothing; the message
  already in the inbox will do the work.
- The actor calls `taken()` as it starts the pass, clearing the flag, so a
  request made during the pass (even by the pass itself) queues exactly one
  more message. Every extra pass is a later message, never a recursive call.
- Held: the actor knows a pass could do nothing for now (its read is waiting
  for new entries, say) and drops requests until it releases the gate, so the
  wake-ups meanwhile cost the requester a flag check and the actor nothing.

The flag is the one piece of state shared across actors, greenlets and
threads, hence the lock. It is held only to flip the flag, never across the
`tell()`, so it cannot be held across a greenlet switch.
"""

from __future__ import annotations

import threading
from typing import Generic, TypeVar

import pykka

__all__ = ["ConflatedTell"]

A = TypeVar("A", bound=pykka.Actor)


class ConflatedTell(Generic[A]):
    """At most one `message` sits in `actor_ref`'s inbox until the actor takes it.

    Example:
        In the actor, create one gate per kind of work and start each pass by
        taking the message:

            self.read_request = ConflatedTell(self.actor_ref, READ_MORE)

            def on_receive(self, message):
                if message is READ_MORE:
                    self.read_request.taken()
                    self.read_more_entries()

        Anyone who may have made work possible calls
        `read_request.request()`.
    """

    def __init__(self, actor_ref: pykka.ActorRef[A], message: object) -> None:
        """Create a gate; nothing is sent until the first `request()`.

        Args:
            actor_ref: the actor that does the work.
            message: what to tell it; the same object every time.
        """
        self.actor_ref = actor_ref
        self.message = message
        self._lock = threading.Lock()
        self._requested = False
        self._held = False

    @property
    def requested(self) -> bool:
        """Whether a message is in the inbox and not yet taken."""
        return self._requested

    def request(self) -> bool:
        """Ask the actor to run a pass; safe from any actor, greenlet or thread.

        Returns:
            True if this call told the message; False if a message was already
            waiting, the gate is held, or the actor is dead.
        """
        with self._lock:
            if self._held:
                return False
            if self._requested:
                if not self.actor_ref.is_alive():
                    # The waiting message died with the actor; re-arm.
                    self._requested = False
                return False
            self._requested = True
        try:
            self.actor_ref.tell(self.message)
        except pykka.ActorDeadError:
            # Re-arm so that the flag does not claim a message that never left.
            with self._lock:
                self._requested = False
            return False
        return True

    def taken(self) -> None:
        """Mark the waiting message as taken; call it first thing in the pass.

        Requests from then on, including from within the pass, queue one new
        message.
        """
        with self._lock:
            self._requested = False

    def hold(self) -> None:
        """Drop requests until `release()`; for the actor only, when it knows that a pass
        started now would find nothing to do and that it will decide afresh on release."""
        with self._lock:
            self._held = True

    def release(self) -> None:
        """Take requests again (no message is told: the actor decides what runs next)."""
        with self._lock:
            self._held = False

    def __repr__(self) -> str:
        return (
            f"<ConflatedTell {self.message!r} to {self.actor_ref}"
            f" requested={self._requested} held={self._held}>"
        )
