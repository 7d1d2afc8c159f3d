"""Retention: which whole segments of a topic's ledger may go, and the periodic check.

Pulsar's rule (``ManagedLedgerImpl#internalTrimLedgers``), applied to brokerlet's segments
(disk segment files, or the in-memory ledger's segment-sized chunks):

- Only whole segments are deleted, oldest first, and never the open (newest) one.
- A segment may go only when every *durable* subscription has acknowledged all of it
  (readers and other non-durable subscriptions hold nothing back). With no durable
  subscription at all, every sealed segment counts as consumed, as on Pulsar.
- A consumed segment goes when the retention policy lets it: the topic is over its size
  limit (``retentionSizeInMB`` >= 0 and the bytes left after the deletions so far exceed it),
  or the segment is older than the time limit (``retentionTimeInMinutes`` >= 0 and its
  newest entry was stored longer ago than that). -1 is "no limit" for either; 0 and 0
  (Pulsar's default) deletes a segment as soon as it is consumed; -1 and -1 keep everything.

The check runs on the storage side: a greenlet of the broker's hub that is no actor's
(`RetentionService`), woken periodically (``retentionCheckIntervalInSeconds``) and whenever
a topic's slowest durable subscription moves on (as Pulsar trims in the background after a
mark-delete). File deletions then run on the storage writer thread, oldest file first, so a
crash part-way leaves a contiguous run of segments: nothing the policy keeps is lost.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import gevent
import gevent.event

from brokerlet.actors._loop import in_turns

__all__ = [
    "Retainable",
    "RetentionPolicy",
    "RetentionService",
    "SegmentInfo",
    "retention_policy",
    "segments_to_drop",
]

log = logging.getLogger(__name__)

_MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """``retentionTimeInMinutes`` and ``retentionSizeInMB``; -1 is unlimited."""

    time_minutes: int = 0
    size_mb: int = 0

    @property
    def infinite(self) -> bool:
        return self.time_minutes < 0 and self.size_mb < 0


def retention_policy(
    namespace_policies: Mapping[str, Any] | None, settings: Any
) -> RetentionPolicy:
    """The namespace's ``retention_policies``, else the broker's defaults."""
    stored = (namespace_policies or {}).get("retention_policies")
    if stored:
        return RetentionPolicy(
            int(stored.get("retentionTimeInMinutes", 0)), int(stored.get("retentionSizeInMB", 0))
        )
    return RetentionPolicy(
        settings.default_retention_time_in_minutes, settings.default_retention_size_in_mb
    )


class SegmentInfo(NamedTuple):
    """One segment of a ledger, oldest first: ids ``first_id..last_id``."""

    first_id: int
    last_id: int
    size: int
    stored_ms: int  # when its newest entry was stored (broker clock)


def segments_to_drop(
    segments: Sequence[SegmentInfo],
    consumed_up_to: int | None,
    policy: RetentionPolicy,
    now_ms: int,
) -> int:
    """How many of the oldest ``segments`` may be deleted now (see the module's rule).

    ``consumed_up_to`` is the slowest durable subscription's mark-delete id; None when the
    topic has no durable subscription.
    """
    if policy.infinite or len(segments) < 2:
        return 0
    total = sum(segment.size for segment in segments)
    dropped = 0
    freed = 0
    for segment in segments[:-1]:  # the open segment always stays
        if consumed_up_to is not None and segment.last_id > consumed_up_to:
            break
        over_size = policy.size_mb >= 0 and total - freed > policy.size_mb * _MIB
        expired = (
            policy.time_minutes >= 0 and now_ms - segment.stored_ms > policy.time_minutes * 60_000
        )
        if not (over_size or expired):
            break
        dropped += 1
        freed += segment.size
    return dropped


class Retainable(Protocol):
    """What a ledger offers retention (`MemoryLedger` and `DiskLedger` both do)."""

    @property
    def closed(self) -> bool: ...

    @property
    def consumed_up_to(self) -> int | None: ...

    @property
    def oldest_sealed_last_id(self) -> int | None: ...

    def segments(self) -> list[SegmentInfo]: ...

    def drop_segments(self, count: int) -> None: ...


class RetentionService:
    """The periodic retention check of every open ledger, on a greenlet of its own.

    Args:
        policy_of: the retention policy of a topic (read at every pass, so policy changes
            take effect at the next one).
        interval: seconds between full passes.
        clock: epoch milliseconds (tests move it).
    """

    def __init__(
        self,
        policy_of: Callable[[str], RetentionPolicy],
        interval: float,
        clock: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self._policy_of = policy_of
        self._interval = interval
        self._clock = clock
        self._ledgers: dict[str, Retainable] = {}
        self._due: set[str] = set()
        self._poked_at: dict[str, int] = {}  # topic -> the oldest sealed segment's end then
        self._wake = gevent.event.Event()
        self._greenlet: gevent.Greenlet[Any, Any] | None = None
        self.passes = 0  # completed passes (tests wait on it)
        self._passed = gevent.event.Event()

    def watch(self, name: str, ledger: Retainable) -> None:
        self._ledgers[name] = ledger
        self._poked_at.pop(name, None)

    def forget(self, name: str) -> None:
        self._ledgers.pop(name, None)
        self._poked_at.pop(name, None)

    def poke(self, name: str) -> None:
        """The topic's slowest durable subscription moved: check that topic soon if that
        can drop anything.

        Segments go oldest first and only once consumed, so nothing can go before the
        slowest subscription is past the oldest sealed segment (or there is none); after
        that one check is enough until that segment goes, time and size being the periodic
        pass's. Checking at every move woke this greenlet for each acknowledgement.
        """
        ledger = self._ledgers.get(name)
        if ledger is None:
            return
        sealed = ledger.oldest_sealed_last_id
        if sealed is None or self._poked_at.get(name) == sealed:
            return
        consumed = ledger.consumed_up_to
        if consumed is not None and consumed < sealed:
            return
        self._poked_at[name] = sealed
        self._due.add(name)
        self._wake.set()

    def start(self) -> None:
        if self._greenlet is None:
            self._greenlet = gevent.spawn(self._run)

    def stop(self) -> None:
        if self._greenlet is not None:
            self._greenlet.kill(block=False)
            self._greenlet = None

    def run_once(self, names: Sequence[str] | None = None) -> int:
        """Check the named topics (every topic when None); returns segments dropped."""
        dropped = 0
        for name in in_turns(list(self._ledgers) if names is None else names):
            ledger = self._ledgers.get(name)
            if ledger is None:
                continue
            if ledger.closed:
                self._ledgers.pop(name, None)
                continue
            try:
                policy = self._policy_of(name)
                count = segments_to_drop(
                    ledger.segments(), ledger.consumed_up_to, policy, self._clock()
                )
                if count:
                    ledger.drop_segments(count)
                    dropped += count
                    log.debug("%s: retention dropped %d segment(s)", name, count)
            except Exception:  # one topic's trouble must not stop the others' retention
                log.exception("%s: retention check failed", name)
        return dropped

    def wait_for_pass(self, timeout: float) -> bool:
        """Wait until the next pass completes (tests)."""
        self._passed.clear()
        return bool(self._passed.wait(timeout))

    def _run(self) -> None:
        next_full = time.monotonic() + self._interval
        while True:
            self._wake.wait(max(0.0, next_full - time.monotonic()))
            self._wake.clear()
            if time.monotonic() >= next_full:
                self._due.clear()
                self.run_once()
                next_full = time.monotonic() + self._interval
            else:
                due, self._due = list(self._due), set()
                self.run_once(due)
            self.passes += 1
            self._passed.set()
            gevent.sleep(0)
