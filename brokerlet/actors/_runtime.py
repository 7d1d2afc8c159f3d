"""Pykka actors that run as greenlets on one gevent hub, without monkey patching.

Pykka 4.5 keeps three runtime hooks on `pykka.Actor` (the inbox, the future
and the loop starter). `GeventActor` fills them with gevent primitives:
a `FairInbox` (a deque its actor waits on), a `GeventFuture` built on
`gevent.event.AsyncResult`, and a named `gevent.Greenlet` running the loop.
Every actor, future and caller must live on the same OS thread (one hub);
the inbox and `AsyncResult` are not safe across threads.

Pitfalls:

- A `BaseException` escaping a handler stops *every* actor: Pykka's loop
  only contains `Exception` per message and answers anything else with
  `ActorRegistry.stop_all()`. `gevent.Timeout` is a `BaseException`, so
  inside actors build it with `exception=False` (silent) or with an
  `Exception` subclass; `timeout_after()` does the latter.
- Never `Greenlet.kill()` an actor's greenlet. Killing it while idle leaves
  a ref that still claims to be alive and never answers; killing it while busy
  stops every actor as above. Use `ActorRef.stop()`.
- Do not wait on `actor_stopped`: waiting there would block the whole hub, so
  its `wait` raises unless the actor has stopped. `ActorRef.stop(block=True)`
  waits on a `GeventFuture` instead.
- `tell()` never blocks on the unbounded inbox, so the inbox is no flow
  control; use permits/credits for that.
- There is no preemption: CPU-bound work or a blocking call that does not
  cooperate with gevent stalls every actor; run it in the hub's thread pool.
"""

from __future__ import annotations

import itertools
import logging
import queue
import sys
import threading
import uuid
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar, cast

import gevent
import gevent.event
import pykka
import pykka.messages
from pykka._envelope import Envelope

from brokerlet.actors import _registry
from brokerlet.actors._loop import FairInbox, handle_messages

if TYPE_CHECKING:
    from types import TracebackType

    from pykka._actor import ActorInbox
    from pykka._future import GetHookFunc
    from pykka._types import OptExcInfo

__all__ = [
    "GeventActor",
    "GeventFuture",
    "GreenletTimer",
    "HandlerTimeout",
    "timeout_after",
]

failure_log = logging.getLogger("brokerlet.actors.supervision")
pykka_log = logging.getLogger("pykka")

# Every actor registers with Pykka, whose list would make each stop scan every running actor.
_registry.install()

T = TypeVar("T")
_UNSET = pykka._future._Unset()  # pykka.Future's "no get-hook result yet"


class _Outcome(NamedTuple, Generic[T]):
    """What a future was resolved with: a value, or an exception triple."""

    value: T | None = None
    exc_info: OptExcInfo | None = None


class GeventFuture(pykka.Future[T]):
    """A `pykka.Future` that parks the calling greenlet instead of a thread.

    Behaves like `pykka.ThreadingFuture`: setting a result twice, or setting
    a result on a future that has a get-hook (and vice versa), raises
    `queue.Full`.
    """

    def __init__(self) -> None:
        # What pykka.Future.__init__ sets, without its call chain: a future per ask.
        self._get_hook = None
        self._get_hook_result = _UNSET
        # Holds an `_Outcome` once resolved; never anything else.
        self._outcome = gevent.event.AsyncResult()

    def get(self, *, timeout: float | None = None) -> T:
        """Return the value, or raise the exception, this future holds.

        Args:
            timeout: seconds to wait; `None` waits forever.

        Returns:
            The value set on the future, or what its get-hook returns.

        Raises:
            pykka.Timeout: if `timeout` seconds pass without a result.
        """
        if self._get_hook is not None:
            return super().get(timeout=timeout)
        if timeout is not None:
            timeout = max(timeout, 0.0)
        # `wait` reports its own timeout by returning, so a `gevent.Timeout`
        # raised here belongs to a caller's block and must propagate as is.
        self._outcome.wait(timeout)
        if not self._outcome.ready():
            msg = f"{timeout} seconds"
            raise pykka.Timeout(msg)
        outcome: _Outcome[T] = self._outcome.value
        if outcome.exc_info is not None:
            _raise_exc_info(outcome.exc_info)
        return cast("T", outcome.value)

    def set(self, value: T | None = None) -> None:
        """Resolve the future with `value` and wake every waiter.

        Raises:
            queue.Full: if the future is already resolved or has a get-hook.
        """
        self._ensure_settable()
        self._outcome.set(_Outcome(value))

    def set_exception(self, exc_info: OptExcInfo | None = None) -> None:
        """Resolve the future with an exception; `get()` will raise it.

        Args:
            exc_info: a `sys.exc_info()` triple; by default the exception
                being handled right now.

        Raises:
            queue.Full: if the future is already resolved or has a get-hook.
            ValueError: if there is no exception to set.
        """
        if exc_info is None:
            exc_info = sys.exc_info()
        if exc_info[0] is None:
            msg = "set_exception() needs an exception: none given and none being handled"
            raise ValueError(msg)
        self._ensure_settable()
        self._outcome.set(_Outcome(exc_info=exc_info))

    def set_get_hook(self, func: GetHookFunc[T]) -> None:
        """Make `get()` return `func(timeout)` instead of a set value.

        Raises:
            queue.Full: if the future is already resolved.
        """
        if self._outcome.ready():
            raise queue.Full
        super().set_get_hook(func)

    def _ensure_settable(self) -> None:
        if self._outcome.ready() or self._get_hook is not None:
            raise queue.Full


def _raise_exc_info(exc_info: OptExcInfo) -> None:
    """Re-raise a stored exception with the traceback it was stored with."""
    exc_type, exc_value, exc_traceback = exc_info
    if exc_value is None:
        assert exc_type is not None  # set_exception() refuses an empty triple
        exc_value = exc_type()
    raise exc_value.with_traceback(exc_traceback)


_greenlet_numbers = itertools.count()

# Actor URNs: a random UUID's first 24 characters, then a counter, which is unique within
# the process as uuid4() is and costs no system call (getrandom) per actor.
_URN_PREFIX = uuid.uuid4().urn[:-12]
_urn_numbers = itertools.count()


class _StoppedFlag(threading.Event):
    """An actor's ``actor_stopped``: the `threading.Event` methods Pykka calls (``is_set``,
    ``set``, ``clear``) over a plain attribute, ``stopped``, that a tell and every turn of the
    loop read directly.

    A real Event's condition and lock were a tenth of starting an actor and nothing may wait
    on them (the module's pitfalls), so this one has neither: ``wait`` answers only once set.
    """

    def __init__(self) -> None:  # no Event.__init__: no condition, no lock
        self.stopped = False

    def is_set(self) -> bool:
        return self.stopped

    def set(self) -> None:
        self.stopped = True

    def clear(self) -> None:
        self.stopped = False

    def wait(self, timeout: float | None = None) -> bool:
        if self.stopped:
            return True
        raise RuntimeError(
            "waiting on a GeventActor's actor_stopped would block its hub; "
            "use ActorRef.stop(block=True)"
        )


class GeventRef(pykka.ActorRef[Any]):
    """The ref of a `GeventActor`: a `tell` puts the bare message in the inbox.

    Pykka wraps every message in an ``Envelope`` (the message and the future to answer);
    a tell has no future, so the loop of a `GeventActor` takes a bare message for a tell
    and an envelope only for an ``ask``. One object and two calls fewer per hand-over.
    """

    actor_stopped: _StoppedFlag

    def tell(self, message: Any) -> None:
        """Send ``message`` without waiting for an answer; never blocks.

        Raises:
            pykka.ActorDeadError: the actor has stopped.
        """
        if self.actor_stopped.stopped:
            raise pykka.ActorDeadError(f"{self} not found")
        self.actor_inbox.put(message)

    def ask(self, message: Any, *, block: bool = True, timeout: float | None = None) -> Any:
        """Pykka's ``ask``, made without its generic steps (the actor's future factory, the
        stopped check as a method call)."""
        future: GeventFuture[Any] = GeventFuture()
        if self.actor_stopped.stopped:
            dead = pykka.ActorDeadError(f"{self} not found")
            future.set_exception((pykka.ActorDeadError, dead, None))
        else:
            self.actor_inbox.put(Envelope(message, future))
        if block:
            return future.get(timeout=timeout)
        return future


class GeventActor(pykka.Actor):
    """A `pykka.Actor` whose loop runs in its own greenlet.

    Its loop behaves as Pykka's: an ``ask`` is answered with the handler's result or its
    exception, a tell whose handler raises an `Exception` fails the actor (``on_failure``),
    a `BaseException` stops every actor; and a message left in the inbox when it stops
    fails the ``ask`` that sent it with `pykka.ActorDeadError`. It differs in the cost per
    message: tells come bare (`GeventRef`), and only Pykka's own messages go through
    ``_handle_receive`` (four type checks); the rest go straight to ``on_receive``.

    Attributes:
        actor_greenlet: the greenlet running the actor loop, named after the
            actor class; set by `start()`. Inspect it, never kill it.
    """

    actor_greenlet: gevent.Greenlet
    actor_stopped: _StoppedFlag

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        # Pykka's own __init__ sets these four, with a `threading.Event` and an `ActorRef`
        # that would be replaced at once: a topic is an actor, and every new topic paid for
        # both. `test_runtime` checks this still sets every attribute Pykka's does.
        self.actor_urn = f"{_URN_PREFIX}{next(_urn_numbers):012x}"
        self.actor_inbox = self._create_actor_inbox()
        self.actor_stopped = _StoppedFlag()
        self._actor_ref = GeventRef(self)

    @staticmethod
    def _create_actor_inbox() -> ActorInbox:
        inbox: ActorInbox = FairInbox()
        return inbox

    @staticmethod
    def _create_future() -> pykka.Future[Any]:
        return GeventFuture()

    def _actor_loop_running(self) -> None:
        inbox = self.actor_inbox
        if not isinstance(inbox, FairInbox):
            raise TypeError(f"{self} has no FairInbox")
        handle_messages(self, inbox)

    def _failed(self, error: BaseException, reply_to: pykka.Future[Any] | None) -> None:
        """A handler raised ``error``: an ask gets it back; a tell's `Exception` fails the
        actor; any other `BaseException` stops every actor (Pykka's rules)."""
        exc_info = (type(error), error, error.__traceback__)
        if not isinstance(error, Exception):
            pykka_log.debug("%r in %s. Stopping all actors.", error, self)
            self._stop()
            pykka.ActorRegistry.stop_all()
            return
        if reply_to is not None:
            pykka_log.info("Exception returned from %s to caller:", self, exc_info=exc_info)
            reply_to.set_exception(exc_info)
            return
        self._handle_failure(*exc_info)
        try:
            self.on_failure(*exc_info)
        except Exception as failure:  # a failing on_failure is logged, no more
            self._handle_failure(type(failure), failure, failure.__traceback__)

    def _actor_loop_teardown(self) -> None:
        inbox = self.actor_inbox
        while not inbox.empty():
            item = inbox.get()
            if item.__class__ is not Envelope or item.reply_to is None:
                continue  # a tell: nobody waits for it
            if item.message.__class__ is pykka.messages._ActorStop:
                item.reply_to.set(None)
            else:
                dead = pykka.ActorDeadError(f"{self.actor_ref} stopped before handling the message")
                item.reply_to.set_exception((pykka.ActorDeadError, dead, None))

    def _handle_failure(
        self,
        exception_type: type[BaseException] | None,
        exception_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        # Pykka's own version logs under "pykka"; one ERROR record per failure, under ours,
        # then the same bookkeeping (unregister, mark stopped) before on_failure runs.
        failure_log.error(
            "%s failed; it is replaced (see brokerlet.actors.supervision)",
            self,
            exc_info=(exception_type, exception_value, traceback),  # type: ignore[arg-type]
        )
        pykka.ActorRegistry.unregister(self.actor_ref)
        self.actor_stopped.set()

    def _start_actor_loop(self) -> None:
        greenlet = gevent.Greenlet(self._actor_loop)
        greenlet.name = f"{self.__class__.__name__}-{next(_greenlet_numbers)}"
        self.actor_greenlet = greenlet
        greenlet.start()


class HandlerTimeout(Exception):  # noqa: N818
    """Raised by `timeout_after()` when its time is up.

    An ordinary `Exception`, so Pykka treats it as a failure of one message,
    not as a reason to stop every actor.
    """


def timeout_after(seconds: float) -> gevent.Timeout:
    """Return a `gevent.Timeout` that is safe to use inside an actor handler.

    Use it as a context manager; when `seconds` pass inside the block, the
    block is interrupted with `HandlerTimeout`:

        with timeout_after(0.5):
            reply = channel.read()

    Args:
        seconds: how long the block may run.

    Returns:
        An unstarted timeout; entering the `with` block starts it.
    """
    return gevent.Timeout(seconds, HandlerTimeout(f"{seconds} seconds"))


class GreenletTimer:
    """A ``call_later`` handle on gevent."""

    __slots__ = ("_greenlet",)

    def __init__(self, greenlet: gevent.Greenlet) -> None:
        self._greenlet = greenlet

    @property
    def done(self) -> bool:
        return bool(self._greenlet.dead)

    def cancel(self) -> None:
        self._greenlet.kill(block=False)
