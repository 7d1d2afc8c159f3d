"""Message TTL: finding the newest expired entry, and the periodic check.

Pulsar's ``PersistentMessageExpiryMonitor``: every ``messageExpiryCheckIntervalInMinutes``,
for each topic with a TTL (namespace ``messageTTL``, else ``ttlDurationDefaultInSeconds``;
0 = none), find the newest entry whose publish time is older than the TTL
(``PersistentMessageFinder``'s binary search over publish times, which assumes they grow with
entry ids) and move every subscription's mark-delete to it. The entries that expiry
acknowledges are counted per subscription (``totalMsgExpired``, ``msgRateExpired``,
``lastExpireTimestamp``). The admin ``expireMessages/{seconds}`` operation is the same move
with its own age (`ExpireEntries` on the topic).

The search reads entries, so it runs on a greenlet of its own (`ExpiryService`), never on
an actor's: a disk read completes on the hub while that greenlet waits.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import gevent
import gevent.event

from brokerlet.actors._loop import in_turns
from brokerlet.dispatch.stats import Rate
from brokerlet.storage.ledger import Entry, Ledger
from brokerlet.transport.protocol import ProtocolError, parse_metadata

__all__ = [
    "ExpiryCounter",
    "ExpiryService",
    "message_ttl",
    "newest_published_before",
    "publish_time",
]

log = logging.getLogger(__name__)


def message_ttl(namespace_policies: Mapping[str, Any] | None, settings: Any) -> int:
    """TTL seconds: the namespace's ``message_ttl_in_seconds``, else the broker default."""
    stored = (namespace_policies or {}).get("message_ttl_in_seconds")
    if stored is not None:
        return int(stored)
    return int(settings.ttl_duration_default_in_seconds)


def publish_time(entry: Entry) -> int | None:
    """The entry's publish time (epoch ms); None when its metadata cannot be read."""
    try:
        return int(parse_metadata(entry.data).publish_time)
    except ProtocolError:
        return None


def _read_one(ledger: Ledger, entry_id: int, timeout: float) -> Entry | None:
    result: gevent.event.AsyncResult[Any] = gevent.event.AsyncResult()
    ledger.read_ids([entry_id], result.set)
    entries = result.get(timeout=timeout)
    if isinstance(entries, BaseException):
        raise entries
    return entries[0] if entries else None


def newest_published_before(
    ledger: Ledger, cutoff_ms: int, *, low: int | None = None, timeout: float = 30.0
) -> int:
    """The id of the newest entry published before ``cutoff_ms``; ``low - 1`` when none.

    Binary search from ``low`` (default: the first stored entry) to the last entry. Blocks
    the calling greenlet on reads; never call it on an actor's greenlet. An entry whose
    metadata cannot be read counts as not expired (nothing is acknowledged on a guess).
    """
    start = ledger.first_entry_id if low is None else max(low, ledger.first_entry_id)
    high = ledger.last_entry_id
    found = start - 1
    while start <= high:
        middle = (start + high) // 2
        entry = _read_one(ledger, middle, timeout)
        published = None if entry is None else publish_time(entry)
        if published is not None and published < cutoff_ms:
            found = middle
            start = middle + 1
        else:
            high = middle - 1
    return found


class ExpiryCounter:
    """A subscription's expiry figures, as Pulsar's SubscriptionStats report them."""

    __slots__ = ("_rate", "last_expire_ms", "total")

    def __init__(self) -> None:
        self.total = 0
        self.last_expire_ms = 0
        self._rate = Rate()

    def record(self, count: int) -> None:
        if count > 0:
            self.total += count
            self.last_expire_ms = int(time.time() * 1000)

    def stats(self) -> dict[str, Any]:
        return {
            "msgRateExpired": self._rate.sample(self.total),
            "totalMsgExpired": self.total,
            "lastExpireTimestamp": self.last_expire_ms,
        }


class ExpiryService:
    """The periodic TTL check, on a greenlet of its own.

    Args:
        targets: the open topics as ``(name, ledger, expire)``, where ``expire(entry_id)``
            moves every subscription of the topic to ``entry_id`` (a tell to its actor).
        ttl_of: a topic's TTL in seconds (0 = none), read at every pass.
        interval: seconds between passes.
    """

    def __init__(
        self,
        targets: Callable[[], Iterable[tuple[str, Ledger, Callable[[int], None]]]],
        ttl_of: Callable[[str], int],
        interval: float,
        clock: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self._targets = targets
        self._ttl_of = ttl_of
        self._interval = interval
        self._clock = clock
        self._greenlet: gevent.Greenlet[Any, Any] | None = None
        self.passes = 0

    def start(self) -> None:
        if self._greenlet is None:
            self._greenlet = gevent.spawn(self._run)

    def stop(self) -> None:
        if self._greenlet is not None:
            self._greenlet.kill(block=False)
            self._greenlet = None

    def run_once(self) -> int:
        """One pass over every open topic; returns how many topics had entries expired."""
        moved = 0
        for name, ledger, expire in in_turns(self._targets()):
            try:
                ttl = self._ttl_of(name)
                if ttl <= 0 or ledger.last_entry_id < ledger.first_entry_id:
                    continue
                newest = newest_published_before(ledger, self._clock() - ttl * 1000)
                if newest >= ledger.first_entry_id:
                    expire(newest)
                    moved += 1
            except Exception:  # one topic's trouble must not stop the others' expiry
                log.exception("%s: message expiry check failed", name)
        return moved

    def _run(self) -> None:
        while True:
            gevent.sleep(self._interval)
            self.run_once()
            self.passes += 1
