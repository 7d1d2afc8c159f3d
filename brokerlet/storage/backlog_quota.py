"""Backlog quotas: Pulsar's ``BacklogQuotaManager`` and ``checkBacklogQuotaExceeded``.

A topic's backlog is its slowest durable subscription's: ``destination_storage`` measures
its bytes (from that subscription's mark-delete to the end), ``message_age`` the age of its
oldest unacknowledged message (by publish time). A quota (namespace ``backlogQuota`` per
type, else ``backlogQuotaDefaultLimitBytes`` / ``backlogQuotaDefaultLimitSecond`` with
``backlogQuotaDefaultRetentionPolicy``; -1 = no limit) is exceeded above its limit, and then:

- ``producer_request_hold``: producers are disconnected and new ones refused with
  ProducerBlockedQuotaExceededError; the client keeps retrying, so its sends wait in its
  queue and time out unless the backlog drains first.
- ``producer_exception``: the same, refused with ProducerBlockedQuotaExceededException; the
  client fails its pending and new sends with that error.
- ``consumer_backlog_eviction``: the slowest subscriptions are moved forward, for size to
  90% of the limit (``dropBacklogForSizeLimit``), for age to the first message within it
  (``dropBacklogForTimeLimit``). Evicted entries are not counted as expired.

The check runs every ``backlogQuotaCheckIntervalInSeconds`` on a greenlet of its own (the age
needs a read); a new producer is also checked against the size at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import gevent

from brokerlet.actors._loop import in_turns
from brokerlet.storage.expiry import _read_one, newest_published_before, publish_time
from brokerlet.storage.ledger import Ledger
from brokerlet.transport.protocol import pb

__all__ = [
    "EVICTION_TARGET",
    "BacklogQuota",
    "QuotaService",
    "QuotaState",
    "backlog_quotas",
    "eviction_point",
    "refusal",
]

log = logging.getLogger(__name__)

EVICTION_TARGET = 0.9  # BacklogQuotaManager: reduce to 90% of the size limit

HOLD = "producer_request_hold"
EXCEPTION = "producer_exception"
EVICTION = "consumer_backlog_eviction"


@dataclass(frozen=True, slots=True)
class BacklogQuota:
    limit_size: int = -1  # bytes
    limit_time: int = -1  # seconds
    policy: str = HOLD


@dataclass(frozen=True, slots=True)
class QuotaState:
    """A topic's quota state as the last check saw it; ``exceeded`` names the quota type
    (``destination_storage`` or ``message_age``) or is None."""

    exceeded: str | None = None
    policy: str = HOLD
    oldest_age_s: int = 0
    limit_size: int = -1
    limit_time: int = -1


def backlog_quotas(
    namespace_policies: Mapping[str, Any] | None, settings: Any
) -> tuple[BacklogQuota, BacklogQuota]:
    """The (destination_storage, message_age) quotas: the namespace's, else the defaults."""
    stored = (namespace_policies or {}).get("backlog_quota_map") or {}
    policy = settings.backlog_quota_default_retention_policy
    size = stored.get("destination_storage")
    age = stored.get("message_age")
    size_quota = (
        BacklogQuota(int(size.get("limitSize", -1)), int(size.get("limitTime", -1)), size["policy"])
        if size
        else BacklogQuota(settings.backlog_quota_default_limit_bytes, -1, policy)
    )
    age_quota = (
        BacklogQuota(int(age.get("limitSize", -1)), int(age.get("limitTime", -1)), age["policy"])
        if age
        else BacklogQuota(-1, settings.backlog_quota_default_limit_second, policy)
    )
    return size_quota, age_quota


def size_exceeded(quota: BacklogQuota, backlog_bytes: int) -> bool:
    return quota.limit_size >= 0 and backlog_bytes > quota.limit_size


def size_exceeded_now(state: QuotaState, backlog_bytes: int) -> bool:
    return state.limit_size >= 0 and backlog_bytes > state.limit_size


def refusal(state: QuotaState | None) -> tuple[pb.ServerError.ValueType, str] | None:
    """The error a new producer gets under ``state`` (ServerCnx#handleProducer), or None."""
    if state is None or state.exceeded is None or state.policy == EVICTION:
        return None
    code = (
        pb.ProducerBlockedQuotaExceededError
        if state.policy == HOLD
        else pb.ProducerBlockedQuotaExceededException
    )
    return code, f"Cannot create producer on topic with backlog quota exceeded ({state.exceeded})"


def eviction_point(ledger: Any, slowest: int, limit_size: int) -> int:
    """The entry id to move the slowest subscriptions to so that at most 90% of
    ``limit_size`` bytes of backlog remain (binary search over ``ledger.bytes_from``)."""
    target = int(limit_size * EVICTION_TARGET)
    low, high = slowest + 1, ledger.last_entry_id  # candidate new mark-delete ids
    found = slowest
    while low <= high:
        middle = (low + high) // 2
        if ledger.bytes_from(middle + 1) <= target:
            found = middle
            high = middle - 1
        else:
            low = middle + 1
    return found


class QuotaService:
    """The periodic backlog-quota check, on a greenlet of its own.

    Args:
        targets: the open topics as ``(name, ledger, report)``; the ledger's
            ``consumed_up_to`` is the slowest durable mark-delete id (set by the topic), and
            ``report(state, evict_to)`` tells the topic its state and, for eviction, the entry
            id to move the slow subscriptions to (-1: none).
        quotas_of: a topic's (size, age) quotas.
    """

    def __init__(
        self,
        targets: Callable[[], Iterable[tuple[str, Ledger, Callable[[QuotaState, int], None]]]],
        quotas_of: Callable[[str], tuple[BacklogQuota, BacklogQuota]],
        interval: float,
        clock: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self._targets = targets
        self._quotas_of = quotas_of
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

    def check(self, name: str, ledger: Ledger, slowest: int | None) -> tuple[QuotaState, int]:
        """One topic's state and eviction point (-1: none)."""
        size_quota, age_quota = self._quotas_of(name)
        limits = {"limit_size": size_quota.limit_size, "limit_time": age_quota.limit_time}
        if slowest is None or slowest >= ledger.last_entry_id:
            return QuotaState(None, size_quota.policy, **limits), -1
        bytes_from = getattr(ledger, "bytes_from", None)
        backlog = bytes_from(slowest + 1) if bytes_from is not None else 0
        age_s = 0
        oldest = _read_one(ledger, max(slowest + 1, ledger.first_entry_id), 30.0)
        published = None if oldest is None else publish_time(oldest)
        if published is not None:
            age_s = max(0, (self._clock() - published) // 1000)
        if size_exceeded(size_quota, backlog):
            evict = -1
            if size_quota.policy == EVICTION:
                evict = eviction_point(ledger, slowest, size_quota.limit_size)
            return QuotaState("destination_storage", size_quota.policy, age_s, **limits), evict
        if age_quota.limit_time >= 0 and age_s > age_quota.limit_time:
            evict = -1
            if age_quota.policy == EVICTION:
                cutoff = self._clock() - age_quota.limit_time * 1000
                evict = newest_published_before(ledger, cutoff, low=slowest + 1)
            return QuotaState("message_age", age_quota.policy, age_s, **limits), evict
        return QuotaState(None, size_quota.policy, age_s, **limits), -1

    def run_once(self) -> None:
        for name, ledger, report in in_turns(self._targets()):
            try:
                state, evict = self.check(name, ledger, ledger.consumed_up_to)
                report(state, evict)
            except Exception:  # one topic's trouble must not stop the others' checks
                log.exception("%s: backlog quota check failed", name)

    def _run(self) -> None:
        while True:
            gevent.sleep(self._interval)
            self.run_once()
            self.passes += 1
