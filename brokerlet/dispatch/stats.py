"""Small pieces shared by the actors' stats and timers."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["Cancellable", "Rate"]


class Cancellable(Protocol):
    """A timer handle: ``done`` once it has fired or been cancelled."""

    @property
    def done(self) -> bool: ...

    def cancel(self) -> None: ...


class Rate:
    """A per-second rate of a growing counter, over at least ``window`` seconds.

    ``sample(counter)`` returns the rate measured between the previous sample that is at least
    ``window`` old and now; calls in between return the last figure, so frequent readers (a
    dashboard and an operator at once) do not shorten each other's window.
    """

    __slots__ = ("_clock", "_count", "_last", "_stamp", "window")

    def __init__(self, window: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self._clock = clock
        self._stamp = clock()
        self._count = 0
        self._last = 0.0

    def sample(self, counter: int) -> float:
        now = self._clock()
        elapsed = now - self._stamp
        if elapsed >= self.window:
            self._last = (counter - self._count) / elapsed
            self._stamp = now
            self._count = counter
        return self._last
