"""Stats gathered off the hot actors.

A stats request never makes one actor wait for another: the broker actor answers with topic
refs, each topic actor with its own part and its dispatchers' refs, each dispatcher with its
subscription's part, every one at once. The caller (a greenlet outside the actors: the admin
server's, or the one ``Broker.topic_stats`` runs on the hub) waits for the parts and composes
Pulsar's topic stats, so a ``/metrics`` scrape never stalls appends or dispatch.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import pykka

from brokerlet.actors.messages import FindTopic, GetStats, ListTopics, TopicStats, TopicStatsPart
from brokerlet.transport.protocol import ConsumerStatsFigures

if TYPE_CHECKING:
    from brokerlet.actors.broker import BrokerActor
    from brokerlet.actors.topic import TopicActor
    from brokerlet.dispatch.consumer import Consumer

__all__ = ["all_stats", "of_topic", "of_topic_with_part", "topic_stats"]

TIMEOUT = 5.0


def topic_stats(broker: pykka.ActorRef[BrokerActor], name: str) -> dict[str, Any] | None:
    """One topic's stats, shaped like Pulsar's; None for a topic the broker does not have."""
    topic: pykka.ActorRef[TopicActor] | None = broker.ask(FindTopic(name), block=True)
    if topic is None:
        return None
    with contextlib.suppress(pykka.ActorDeadError):
        return of_topic(topic)
    return None


def all_stats(broker: pykka.ActorRef[BrokerActor]) -> dict[str, Any]:
    """Every topic's stats, by topic name."""
    topics: dict[str, pykka.ActorRef[TopicActor]] = broker.ask(ListTopics(), block=True)
    result = {}
    for name, topic in topics.items():
        with contextlib.suppress(pykka.ActorDeadError):
            result[name] = of_topic(topic)
    return result


def consumer_figures(
    subscription: dict[str, Any], last_entry_id: int, consumer: Consumer
) -> ConsumerStatsFigures:
    """One consumer's CONSUMER_STATS_RESPONSE figures from its subscription's stats part."""
    mine: dict[str, Any] = next(
        (c for c in subscription["consumers"] if c["consumerId"] == consumer.consumer_id), {}
    )
    mark_delete = int(subscription["markDeletePosition"].rsplit(":", 1)[1])
    backlog = last_entry_id - mark_delete - subscription.get("individuallyAcked", 0)
    return ConsumerStatsFigures(
        msg_rate_out=float(mine.get("msgRateOut", 0.0)),
        msg_throughput_out=float(mine.get("msgThroughputOut", 0.0)),
        msg_rate_redeliver=0.0,
        consumer_name=consumer.name,
        available_permits=int(mine.get("availablePermits", consumer.permits)),
        unacked_messages=int(mine.get("unackedMessages", consumer.unacked)),
        blocked_consumer_on_unacked_msgs=bool(mine.get("blockedConsumerOnUnackedMsgs", False)),
        address=str(mine.get("address", consumer.connection.peer)),
        connected_since=str(mine.get("connectedSince", "")),
        type=str(subscription.get("type", "")),
        msg_rate_expired=0.0,
        msg_backlog=max(0, backlog),
        message_ack_rate=0.0,
    )


def of_topic(topic: pykka.ActorRef[TopicActor]) -> dict[str, Any]:
    """A topic's stats: its own part, then every dispatcher asked at once."""
    return of_topic_with_part(topic)[0]


def of_topic_with_part(
    topic: pykka.ActorRef[TopicActor],
) -> tuple[dict[str, Any], TopicStatsPart]:
    """:func:`of_topic`, and the topic's own part (``extra`` holds what the topic operations
    add: terminated, non-persistent drops)."""
    part: TopicStatsPart = topic.ask(TopicStats(), block=True, timeout=TIMEOUT)
    asked = {
        name: (ref.ask(GetStats(), block=False), mark_delete)
        for name, (ref, mark_delete) in part.subscriptions.items()
    }
    last = part.last_entry_id
    subscriptions: dict[str, dict[str, Any]] = {}
    for name, (future, mark_delete) in asked.items():
        try:
            sub: dict[str, Any] = future.get(timeout=TIMEOUT)
        except pykka.ActorDeadError:
            continue  # closed meanwhile
        sub["msgBacklog"] = max(0, last - mark_delete - sub.pop("individuallyAcked", 0))
        sub["msgBacklogNoDelayed"] = max(0, sub["msgBacklog"] - sub.get("msgDelayed", 0))
        subscriptions[name] = sub
    own = part.own
    subs = subscriptions.values()
    stats: dict[str, Any] = {
        "msgRateIn": own["msgRateIn"],
        "msgThroughputIn": own["msgThroughputIn"],
        "msgRateOut": sum(s["msgRateOut"] for s in subs),
        "msgThroughputOut": sum(s["msgThroughputOut"] for s in subs),
        "msgInCounter": own["msgInCounter"],
        "bytesInCounter": own["bytesInCounter"],
        "msgOutCounter": sum(s["msgOutCounter"] for s in subs),
        "bytesOutCounter": sum(s["bytesOutCounter"] for s in subs),
        "storageSize": own["storageSize"],
        "ledgerId": own["ledgerId"],
        "lastEntryId": own["lastEntryId"],
        "publishers": own["publishers"],
        "subscriptions": subscriptions,
        # Access modes and deduplication (brokerlet.producers.hooks.TopicProducers.stats).
        **{
            k: own[k]
            for k in ("waitingPublishers", "deduplicationStatus", "topicEpoch")
            if k in own
        },
    }
    # The rest of the topic's own part as it is (the data rules' figures: backlogSize,
    # firstEntryId, backlog quota state, compaction).
    stats.update({key: value for key, value in own.items() if key not in stats})
    return stats, part
