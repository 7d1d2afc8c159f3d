"""The one bounded wait of brokerlet's test helpers: poll until a condition holds.

A broker's state lives on another thread (an in-process :class:`~brokerlet.Broker` runs its
own gevent hub) or in another process, so a test that has no event to wait on polls, with a
deadline::

    from brokerlet.testing.waiting import wait_until

    wait_until(lambda: broker.topic_stats(topic) is not None, message="the topic")
    sub = wait_until(
        lambda: broker.topic_stats(topic)["subscriptions"]["sub"],
        predicate=lambda sub: sub["msgBacklog"] == 0,
        message="an empty backlog",
    )

On timeout it raises :class:`AssertionError` naming what was awaited, how long, and the
last value the condition returned. Between polls it sleeps with ``gevent.sleep``: in a
thread without greenlets that is a plain sleep, and where brokerlet's client runs its
greenlets on the caller's hub they keep receiving and acknowledging while the test waits.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import gevent

__all__ = ["wait_until"]

T = TypeVar("T")

_SHOWN_CHARS = 500


def wait_until(
    condition: Callable[[], T],
    *,
    message: str | Callable[[], str],
    predicate: Callable[[T], object] | None = None,
    timeout: float = 10.0,
    interval: float = 0.02,
) -> T:
    """Call ``condition`` until its value is accepted, then return that value.

    Args:
        condition: reads the state waited on. An exception it raises ends the wait (and
            the test) at once; catch inside it what may fail while the state settles.
        message: what is awaited, for the failure ("the acks on disk"); a callable is
            asked only on failure, to describe the state then.
        predicate: accepts a value of ``condition``; None accepts any truthy value.
        timeout: seconds before giving up; the condition is checked once more at the end.
        interval: seconds between polls.

    Raises:
        AssertionError: no accepted value within ``timeout`` seconds; the message names
            what was awaited and shows the last value seen.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if predicate(value) if predicate is not None else value:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            text = message() if callable(message) else message
            shown = repr(value)
            if len(shown) > _SHOWN_CHARS:
                shown = shown[:_SHOWN_CHARS] + "..."
            raise AssertionError(
                f"timed out after {timeout:g} s waiting for {text}; last value: {shown}"
            )
        gevent.sleep(min(interval, left))
