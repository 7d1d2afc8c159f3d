"""Stats in Pulsar's shapes: TopicStats, PartitionedTopicStats, internal stats, broker-stats.

Field names follow pulsar-common's ``TopicStatsImpl``, ``SubscriptionStatsImpl``,
``ConsumerStatsImpl``, ``PublisherStatsImpl``, ``PartitionedTopicStatsImpl`` and
``PersistentTopicInternalStats``; brokerlet's own figures (``writable``, ``readsIssued``,
...) stay beside them.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from brokerlet.storage.ledger import Ledger

__all__ = [
    "aggregate_partitions",
    "broker_topic_stats",
    "cursor_stats",
    "internal_stats",
    "topic_stats",
]

_TOPIC_DEFAULTS: dict[str, Any] = {
    "msgRateIn": 0.0,
    "msgThroughputIn": 0.0,
    "msgRateOut": 0.0,
    "msgThroughputOut": 0.0,
    "averageMsgSize": 0.0,
    "bytesInCounter": 0,
    "msgInCounter": 0,
    "bytesOutCounter": 0,
    "msgOutCounter": 0,
    "storageSize": 0,
    "backlogSize": 0,
    "offloadedStorageSize": 0,
    "earliestMsgPublishTimeInBacklogs": 0,
    "publishRateLimitedTimes": 0,
    "delayedMessageIndexSizeInBytes": 0,
    "waitingPublishers": 0,
    "nonContiguousDeletedMessagesRanges": 0,
    "nonContiguousDeletedMessagesRangesSerializedSize": 0,
    "msgChunkPublished": False,
    "replication": {},
    "deduplicationStatus": "Disabled",
    "topicEpoch": None,
    "compaction": {
        "lastCompactionRemovedEventCount": 0,
        "lastCompactionSucceedTimestamp": 0,
        "lastCompactionFailedTimestamp": 0,
        "lastCompactionDurationTimeInMills": 0,
    },
    "ownerBroker": None,
}

_SUBSCRIPTION_DEFAULTS: dict[str, Any] = {
    "msgRateOut": 0.0,
    "msgThroughputOut": 0.0,
    "msgRateRedeliver": 0.0,
    "messageAckRate": 0.0,
    "msgRateExpired": 0.0,
    "chunkedMessageRate": 0,
    "bytesOutCounter": 0,
    "msgOutCounter": 0,
    "msgBacklog": 0,
    "msgBacklogNoDelayed": 0,
    "msgDelayed": 0,
    "unackedMessages": 0,
    "backlogSize": -1,
    "earliestMsgPublishTimeInBacklog": 0,
    "totalMsgExpired": 0,
    "lastExpireTimestamp": 0,
    "lastConsumedFlowTimestamp": 0,
    "lastConsumedTimestamp": 0,
    "lastAckedTimestamp": 0,
    "lastMarkDeleteAdvancedTimestamp": 0,
    "blockedSubscriptionOnUnackedMsgs": False,
    "isDurable": True,
    "isReplicated": False,
    "allowOutOfOrderDelivery": False,
    "consumersAfterMarkDeletePosition": {},
    "subscriptionProperties": {},
    "filterProcessedMsgCount": 0,
    "filterAcceptedMsgCount": 0,
    "filterRejectedMsgCount": 0,
    "filterRescheduledMsgCount": 0,
}

_CONSUMER_DEFAULTS: dict[str, Any] = {
    "msgRateRedeliver": 0.0,
    "messageAckRate": 0.0,
    "chunkedMessageRate": 0.0,
    "lastAckedTimestamp": 0,
    "lastConsumedTimestamp": 0,
    "lastConsumedFlowTimestamp": 0,
    "avgMessagesPerEntry": 0,
    "clientVersion": "",
    "connectedSince": "",
    "keyHashRanges": [],
    "metadata": {},
}

_PUBLISHER_DEFAULTS: dict[str, Any] = {
    "accessMode": "Shared",
    "msgRateIn": 0.0,
    "msgThroughputIn": 0.0,
    "averageMsgSize": 0.0,
    "chunkedMessageRate": 0.0,
    "producerId": 0,
    "clientVersion": "",
    "connectedSince": "",
    "supportsPartialProducer": False,
    "metadata": {},
}


def _with_defaults(values: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    shaped = dict(defaults)
    shaped.update(values)
    return shaped


def topic_stats(
    raw: Mapping[str, Any],
    *,
    non_persistent: bool = False,
    terminated: bool = False,
    drops: Mapping[str, tuple[int, float]] | None = None,
) -> dict[str, Any]:
    """Pulsar's TopicStats from the topic actor's own stats."""
    shaped = _with_defaults(raw, _TOPIC_DEFAULTS)
    if shaped["msgInCounter"]:
        shaped["averageMsgSize"] = shaped["bytesInCounter"] / shaped["msgInCounter"]
    shaped["publishers"] = [_with_defaults(p, _PUBLISHER_DEFAULTS) for p in raw["publishers"]]
    subscriptions: dict[str, Any] = {}
    drops = drops or {}
    for name, sub in raw["subscriptions"].items():
        shaped_sub = _with_defaults(sub, _SUBSCRIPTION_DEFAULTS)
        shaped_sub["consumers"] = [_with_defaults(c, _CONSUMER_DEFAULTS) for c in sub["consumers"]]
        if non_persistent:
            # NonPersistentSubscriptionStats: no backlog, dropped messages instead.
            count, rate = drops.get(name, (0, 0.0))
            shaped_sub["msgBacklog"] = 0
            shaped_sub["msgBacklogNoDelayed"] = 0
            shaped_sub["msgDropRate"] = rate
            shaped_sub["msgDropCount"] = count  # brokerlet's own counter beside the rate
        else:
            shaped_sub["msgBacklogNoDelayed"] = shaped_sub["msgBacklog"]
        subscriptions[name] = shaped_sub
    shaped["subscriptions"] = subscriptions
    if non_persistent:
        shaped["msgDropRate"] = sum(s["msgDropRate"] for s in subscriptions.values())
        shaped["msgDropCount"] = sum(s["msgDropCount"] for s in subscriptions.values())
        shaped["storageSize"] = 0
    shaped["terminated"] = terminated  # brokerlet's own: PersistentTopicInternalStats has it
    return shaped


_SUMMED = (
    "msgRateIn",
    "msgThroughputIn",
    "msgRateOut",
    "msgThroughputOut",
    "bytesInCounter",
    "msgInCounter",
    "bytesOutCounter",
    "msgOutCounter",
    "storageSize",
    "backlogSize",
    "offloadedStorageSize",
    "publishRateLimitedTimes",
    "waitingPublishers",
)


def aggregate_partitions(
    per_partition: Mapping[str, Mapping[str, Any]], *, include_partitions: bool
) -> dict[str, Any]:
    """PartitionedTopicStats: the partitions' TopicStats merged, plus ``metadata``."""
    merged: dict[str, Any] = dict(_TOPIC_DEFAULTS)
    merged["publishers"] = []
    merged["subscriptions"] = {}
    for stats in per_partition.values():
        for key in _SUMMED:
            merged[key] += stats.get(key, 0)
        merged["publishers"].extend(stats.get("publishers", []))
        for name, sub in stats.get("subscriptions", {}).items():
            into = merged["subscriptions"].get(name)
            if into is None:
                into = merged["subscriptions"][name] = {**sub, "consumers": list(sub["consumers"])}
                continue
            for key in (
                "msgRateOut",
                "msgThroughputOut",
                "msgOutCounter",
                "bytesOutCounter",
                "msgBacklog",
                "msgBacklogNoDelayed",
                "unackedMessages",
            ):
                into[key] = into.get(key, 0) + sub.get(key, 0)
            into["consumers"].extend(sub["consumers"])
    if merged["msgInCounter"]:
        merged["averageMsgSize"] = merged["bytesInCounter"] / merged["msgInCounter"]
    merged["metadata"] = {"partitions": len(per_partition)}
    merged["partitions"] = (
        {k: dict(v) for k, v in per_partition.items()} if include_partitions else {}
    )
    return merged


def _iso(epoch_seconds: float) -> str:
    return datetime.fromtimestamp(epoch_seconds, tz=UTC).isoformat(timespec="milliseconds")


def cursor_stats(sub: Mapping[str, Any]) -> dict[str, Any]:
    """One open cursor of internalStats, from its dispatcher's stats."""
    return {
        "markDeletePosition": sub["markDeletePosition"],
        "readPosition": sub["readPosition"],
        "waitingReadOp": False,
        "pendingReadOps": 0,
        "messagesConsumedCounter": sub.get("msgOutCounter", 0),
        "cursorLedger": -1,
        "cursorLedgerLastEntry": -1,
        "individuallyDeletedMessages": "[]",
        "lastLedgerSwitchTimestamp": "",
        "state": "Open",
        "active": bool(sub.get("consumers")),
        "numberOfEntriesSinceFirstNotAckedMessage": 0,
        "totalNonContiguousDeletedMessagesRange": sub.get("individuallyAcked", 0),
        "subscriptionHavePendingRead": False,
        "subscriptionHavePendingReplayRead": False,
        "properties": {},
    }


def internal_stats(
    ledger: Ledger,
    cursors: Mapping[str, Mapping[str, Any]],
    *,
    saved: Mapping[str, int],
    msg_in: int,
    terminated: bool,
    created_at: float,
) -> dict[str, Any]:
    """PersistentTopicInternalStats (ManagedLedger's view) of one topic."""
    ledger_id = ledger.ledger_id
    entries = max(0, ledger.last_entry_id - ledger.first_entry_id + 1)
    size = int(getattr(ledger, "size_bytes", 0))
    shaped_cursors: dict[str, Any] = {name: cursor_stats(sub) for name, sub in cursors.items()}
    for name, mark_delete in saved.items():
        shaped_cursors.setdefault(
            name,
            {
                "markDeletePosition": f"{ledger_id}:{mark_delete}",
                "readPosition": f"{ledger_id}:{mark_delete + 1}",
                "state": "Open",
                "active": False,
                "properties": {},
            },
        )
    return {
        "entriesAddedCounter": msg_in,
        "numberOfEntries": entries,
        "totalSize": size,
        "currentLedgerEntries": entries,
        "currentLedgerSize": size,
        "lastLedgerCreatedTimestamp": _iso(created_at),
        "waitingCursorsCount": 0,
        "pendingAddEntriesCount": 0,
        "lastConfirmedEntry": f"{ledger_id}:{ledger.last_entry_id}",
        "state": "Terminated" if terminated else "LedgerOpened",
        "ledgers": [
            {
                "ledgerId": ledger_id,
                "entries": entries,
                "size": size,
                "offloaded": False,
                "underReplicated": False,
            }
        ],
        "cursors": shaped_cursors,
        "schemaLedgers": [],
        "compactedLedger": {
            "ledgerId": -1,
            "entries": -1,
            "size": -1,
            "offloaded": False,
            "underReplicated": False,
        },
    }


FULL_BUNDLE = "0x00000000_0xffffffff"
"""brokerlet owns each namespace as one bundle covering the whole hash range."""


def broker_topic_stats(all_stats: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """/admin/v2/broker-stats/topics: namespace -> bundle -> domain -> topic -> stats."""
    nested: dict[str, Any] = {}
    for name, stats in sorted(all_stats.items()):
        domain, _, rest = name.partition("://")
        tenant, namespace, _local = rest.split("/", 2)
        bundle = nested.setdefault(f"{tenant}/{namespace}", {}).setdefault(FULL_BUNDLE, {})
        bundle.setdefault(domain, {})[name] = stats
    return nested


def now_ms() -> int:
    return int(time.time() * 1000)
