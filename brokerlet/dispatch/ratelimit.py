"""Dispatch rate limits: token buckets in messages and bytes per second.

Pulsar limits dispatch per subscription, per topic and per broker
(``dispatchThrottlingRatePerSubscriptionInMsg`` and friends, 0 = off). A bucket holds at most
one second of tokens and refills continuously. Dispatch charges it after sending, so a bucket
may go negative; the dispatcher reads no more than the tokens left, and when a bucket is
empty it reschedules the read for when tokens return instead of reading.

Buckets of a topic or of the broker are shared by several dispatcher actors, so every bucket
operation (refill, read, charge) holds the bucket's lock: the accounting holds on real threads
too, not only because a gevent hub never switches inside one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

__all__ = ["DispatchRateLimiter", "TokenBucket", "limiters_allowance", "limiters_wait"]


class TokenBucket:
    """``rate`` tokens per second, at most ``rate`` banked."""

    __slots__ = ("_clock", "_lock", "_stamp", "_tokens", "rate")

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = rate
        self._clock = clock
        self._lock = threading.Lock()
        self._tokens = float(rate)
        self._stamp = clock()

    def _refill(self) -> float:
        """Add the tokens earned since the last call; the caller holds ``_lock``."""
        now = self._clock()
        self._tokens = min(self.rate, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        return self._tokens

    @property
    def tokens(self) -> float:
        with self._lock:
            return self._refill()

    def charge(self, amount: int) -> None:
        """Spend ``amount`` tokens (after sending); the balance may go negative."""
        with self._lock:
            self._refill()
            self._tokens -= amount

    def seconds_until_available(self) -> float:
        """How long until at least one token is there (0 if there is one now)."""
        with self._lock:
            tokens = self._refill()
        return 0.0 if tokens >= 1 else (1 - tokens) / self.rate


class DispatchRateLimiter:
    """A messages-per-second bucket and a bytes-per-second bucket; either may be off."""

    __slots__ = ("bytes", "messages", "name")

    def __init__(
        self,
        name: str,
        msg_rate: float,
        byte_rate: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.messages = TokenBucket(msg_rate, clock) if msg_rate > 0 else None
        self.bytes = TokenBucket(byte_rate, clock) if byte_rate > 0 else None

    @property
    def enabled(self) -> bool:
        return self.messages is not None or self.bytes is not None

    def charge(self, messages: int, size: int) -> None:
        if self.messages is not None:
            self.messages.charge(messages)
        if self.bytes is not None:
            self.bytes.charge(size)


def limiters_wait(limiters: Sequence[DispatchRateLimiter]) -> float:
    """Seconds until every bucket has a token again (0: dispatch may go ahead)."""
    wait = 0.0
    for limiter in limiters:
        for bucket in (limiter.messages, limiter.bytes):
            if bucket is not None:
                wait = max(wait, bucket.seconds_until_available())
    return wait


def limiters_allowance(
    limiters: Sequence[DispatchRateLimiter], max_entries: int, max_bytes: int
) -> tuple[int, int]:
    """Cap a read to the tokens left: (entries, bytes), each at least 1."""
    for limiter in limiters:
        if limiter.messages is not None:
            max_entries = min(max_entries, max(1, int(limiter.messages.tokens)))
        if limiter.bytes is not None:
            max_bytes = min(max_bytes, max(1, int(limiter.bytes.tokens)))
    return max_entries, max_bytes
