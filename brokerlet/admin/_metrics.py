"""Broker stats as Prometheus metrics, read at scrape time.

Metric and label names follow Pulsar's topic, subscription and consumer metrics
(``pulsar_rate_in``, ``pulsar_subscription_back_log``, ``pulsar_consumer_available_permits``,
...) so dashboards built for Pulsar work unchanged. brokerlet's own backpressure figures use
the ``brokerlet_`` prefix.

The stats dicts are shaped like Pulsar's topic stats but are produced by actors that gain
fields over time, so every field is optional here: a missing number reads as 0 and a missing
flag as false.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from brokerlet.actors.supervision import restarts

__all__ = ["AllStats", "StatsCollector", "TopicStats"]

TopicStats = Callable[[str], Mapping[str, Any] | None]
"""Returns one topic's stats by its full name, or None for an unknown topic."""

AllStats = Callable[[], Mapping[str, Mapping[str, Any]]]
"""Returns every topic's stats, keyed by full topic name."""

Stats = Mapping[str, Any]
Extract = Callable[[Stats], float]

TOPIC_LABELS = ("cluster", "namespace", "topic")
SUBSCRIPTION_LABELS = (*TOPIC_LABELS, "subscription")
# Pulsar labels a consumer by name and by id: names need not be unique.
CONSUMER_LABELS = (*SUBSCRIPTION_LABELS, "consumer_name", "consumer_id")


def _number(value: object) -> float:
    """A stats value as a sample: numbers as they are, flags as 1/0, anything else as 0."""
    if isinstance(value, bool | int | float):
        return float(value)
    return 0.0


def _field(key: str) -> Extract:
    return lambda stats: _number(stats.get(key))


def _mapping(value: object) -> Stats:
    return value if isinstance(value, Mapping) else {}


def _subscriptions(topic: Stats) -> Stats:
    return _mapping(topic.get("subscriptions"))


def _consumers(subscription: Stats) -> list[Stats]:
    consumers = subscription.get("consumers")
    if not isinstance(consumers, Sequence) or isinstance(consumers, str):
        return []
    return [c for c in consumers if isinstance(c, Mapping)]


def _topic_backlog(topic: Stats) -> float:
    # Pulsar's topic-level figure is the sum over its subscriptions.
    if "msgBacklog" in topic:
        return _number(topic["msgBacklog"])
    return sum(_number(_mapping(sub).get("msgBacklog")) for sub in _subscriptions(topic).values())


def _consumer_count(topic: Stats) -> float:
    return float(sum(len(_consumers(_mapping(sub))) for sub in _subscriptions(topic).values()))


def _count(key: str) -> Extract:
    def count(stats: Stats) -> float:
        value = stats.get(key)
        return float(len(value)) if isinstance(value, Mapping | list | tuple) else 0.0

    return count


@dataclass(frozen=True, slots=True)
class _Spec:
    """One metric: its name (counters end in ``_total``), how to read it, and its help."""

    name: str
    value: Extract
    help: str

    def family(self, labels: Sequence[str]) -> GaugeMetricFamily | CounterMetricFamily:
        if self.name.endswith("_total"):
            return CounterMetricFamily(self.name, self.help, labels=labels)
        return GaugeMetricFamily(self.name, self.help, labels=labels)


TOPIC_METRICS = (
    _Spec("pulsar_rate_in", _field("msgRateIn"), "Messages published per second."),
    _Spec("pulsar_rate_out", _field("msgRateOut"), "Messages dispatched per second."),
    _Spec("pulsar_throughput_in", _field("msgThroughputIn"), "Bytes published per second."),
    _Spec("pulsar_throughput_out", _field("msgThroughputOut"), "Bytes dispatched per second."),
    _Spec("pulsar_in_messages_total", _field("msgInCounter"), "Messages published."),
    _Spec("pulsar_in_bytes_total", _field("bytesInCounter"), "Bytes published."),
    _Spec("pulsar_out_messages_total", _field("msgOutCounter"), "Messages dispatched."),
    _Spec("pulsar_out_bytes_total", _field("bytesOutCounter"), "Bytes dispatched."),
    _Spec("pulsar_storage_size", _field("storageSize"), "Bytes stored for the topic."),
    _Spec("pulsar_storage_backlog_size", _field("backlogSize"), "Bytes in the backlog."),
    _Spec("pulsar_msg_backlog", _topic_backlog, "Messages in all subscriptions' backlogs."),
    _Spec("pulsar_subscriptions_count", _count("subscriptions"), "Subscriptions."),
    _Spec("pulsar_producers_count", _count("publishers"), "Connected producers."),
    _Spec("pulsar_consumers_count", _consumer_count, "Connected consumers."),
)

SUBSCRIPTION_METRICS = (
    _Spec("pulsar_subscription_back_log", _field("msgBacklog"), "Messages in the backlog."),
    _Spec(
        "pulsar_subscription_unacked_messages",
        _field("unackedMessages"),
        "Messages delivered and not yet acknowledged.",
    ),
    _Spec(
        "pulsar_subscription_blocked_on_unacked_messages",
        _field("blockedSubscriptionOnUnackedMsgs"),
        "1 while dispatch is blocked by the subscription's unacked-message limit.",
    ),
    _Spec(
        "pulsar_subscription_msg_rate_out",
        _field("msgRateOut"),
        "Messages dispatched per second.",
    ),
    _Spec(
        "pulsar_subscription_msg_throughput_out",
        _field("msgThroughputOut"),
        "Bytes dispatched per second.",
    ),
)

CONSUMER_METRICS = (
    _Spec(
        "pulsar_consumer_available_permits",
        _field("availablePermits"),
        "Messages the consumer can still receive (flow permits).",
    ),
    _Spec(
        "pulsar_consumer_unacked_messages",
        _field("unackedMessages"),
        "Messages delivered to the consumer and not yet acknowledged.",
    ),
    _Spec(
        "pulsar_consumer_blocked_on_unacked_messages",
        _field("blockedConsumerOnUnackedMsgs"),
        "1 while the consumer is blocked by its unacked-message limit.",
    ),
    _Spec("pulsar_consumer_msg_rate_out", _field("msgRateOut"), "Messages sent per second."),
    _Spec(
        "pulsar_consumer_msg_throughput_out", _field("msgThroughputOut"), "Bytes sent per second."
    ),
    _Spec(
        "brokerlet_consumer_writable",
        _field("writable"),
        "1 while the consumer's connection accepts writes (outbound buffer below its watermark).",
    ),
    _Spec(
        "brokerlet_consumer_pending_outbound_bytes",
        _field("pendingOutboundBytes"),
        "Bytes queued on the consumer's connection and not yet handed to the kernel.",
    ),
    _Spec(
        "brokerlet_consumer_writability_changes_total",
        _field("writabilityChanges"),
        "Times the consumer's connection switched between writable and unwritable.",
    ),
)


def namespace_of(topic: str) -> str:
    """The namespace part of a topic name, as Pulsar labels it.

    >>> namespace_of("persistent://public/default/orders")
    'public/default'
    """
    _, _, path = topic.partition("://")
    namespace, _, _ = (path or topic).rpartition("/")
    return namespace


class StatsCollector:
    """A Prometheus collector over the broker's topic stats.

    Register it on a :class:`prometheus_client.CollectorRegistry`; each scrape calls
    ``all_stats`` once, on the scraping greenlet, and renders what it returns.

    Args:
        all_stats: returns ``{topic name: topic stats}``.
        cluster: the value of every sample's ``cluster`` label.
    """

    def __init__(self, all_stats: AllStats, *, cluster: str = "brokerlet") -> None:
        self._all_stats = all_stats
        self.cluster = cluster

    def collect(self) -> Iterator[Metric]:
        """Read the stats now and yield one family per metric (families may have no samples)."""
        topic_families = [(spec, spec.family(TOPIC_LABELS)) for spec in TOPIC_METRICS]
        sub_families = [(spec, spec.family(SUBSCRIPTION_LABELS)) for spec in SUBSCRIPTION_METRICS]
        consumer_families = [(spec, spec.family(CONSUMER_LABELS)) for spec in CONSUMER_METRICS]
        for topic, raw in sorted(self._all_stats().items()):
            stats = _mapping(raw)
            topic_labels = [self.cluster, namespace_of(topic), topic]
            for spec, family in topic_families:
                family.add_metric(topic_labels, spec.value(stats))
            for sub_name, raw_sub in sorted(_subscriptions(stats).items()):
                sub = _mapping(raw_sub)
                sub_labels = [*topic_labels, str(sub_name)]
                for spec, family in sub_families:
                    family.add_metric(sub_labels, spec.value(sub))
                for consumer in _consumers(sub):
                    consumer_labels = [
                        *sub_labels,
                        str(consumer.get("consumerName", "")),
                        str(consumer.get("consumerId", "")),
                    ]
                    for spec, family in consumer_families:
                        family.add_metric(consumer_labels, spec.value(consumer))
        for _, family in (*topic_families, *sub_families, *consumer_families):
            yield family
        restarted = CounterMetricFamily(
            "brokerlet_actor_restarts_total",
            "Actors that failed and were replaced by supervision, by kind (in this process).",
            labels=["kind"],
        )
        for kind, count in restarts().items():
            restarted.add_metric([kind], count)
        yield restarted
