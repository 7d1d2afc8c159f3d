"""Which topics exist, which may be created on use, and how they are listed.

The rules of Pulsar's ``BrokerService#getTopic``, ``ServerCnx#handlePartitionMetadataRequest``
and ``TopicLookupBase``, over the metadata store:

- a topic in a tenant or namespace that does not exist is refused (``TopicNotFound`` for
  producers and consumers, ``MetadataError`` for binary lookups, 404 for HTTP lookups);
- a missing topic is created on use when auto-creation is allowed (namespace override,
  else the broker's ``allowAutoTopicCreation*`` settings), else refused with
  ``TopicNotFound``;
- a partitioned topic's partitions ``<name>-partition-<i>`` (``i`` below its count) exist
  with it and have no rows of their own; the partitioned name itself is not a topic to
  produce to or consume from.

Refusals carry the ServerError's name, so this module needs no codec.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Final

import crc32c

from brokerlet.metadata.naming import TopicName
from brokerlet.metadata.policies import auto_creation
from brokerlet.metadata.store import MetadataStore

__all__ = [
    "MODE_ALL",
    "MODE_NON_PERSISTENT",
    "MODE_PERSISTENT",
    "Refused",
    "admit",
    "exists",
    "filter_by_pattern",
    "known_partitioned_metadata",
    "lookup_refusal",
    "partitioned_metadata",
    "partitions_of",
    "topic_names",
    "topics_hash",
]

# CommandGetTopicsOfNamespace.Mode
MODE_PERSISTENT: Final = 0
MODE_NON_PERSISTENT: Final = 1
MODE_ALL: Final = 2


class Refused(Exception):  # noqa: N818 - a refusal answered to the client, not a bug
    """A request refused with the ServerError named ``code``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _namespace_exists(store: MetadataStore, name: TopicName) -> bool:
    return name.tenant in store.tenants and name.namespace in store.namespaces


def partitions_of(store: MetadataStore, name: TopicName) -> int | None:
    """A stored topic's partition count (0: non-partitioned), None when it is not stored.

    A partition of a partitioned topic counts as a stored non-partitioned topic.
    """
    meta = store.topics.get(name.full)
    if meta is not None:
        return meta.partitions
    index = name.partition_index
    if index >= 0:
        base = store.topics.get(name.base.full)
        if base is not None and index < base.partitions:
            return 0
    return None


def exists(store: MetadataStore, name: TopicName) -> bool:
    return partitions_of(store, name) is not None


def partitioned_metadata(store: MetadataStore, settings: Any, name: TopicName) -> int:
    """PARTITIONED_METADATA's answer; creates a partitioned topic when auto-creation says so."""
    known = known_partitioned_metadata(store, settings, name)
    if known is not None:
        return known
    rule = auto_creation(store.namespaces.get(name.namespace), settings)
    created = store.create_topic(name.full, name.namespace, rule.partitions, exist_ok=True)
    return created.partitions


def known_partitioned_metadata(store: MetadataStore, settings: Any, name: TopicName) -> int | None:
    """:func:`partitioned_metadata` when answering it changes nothing; None when the answer
    is to create a partitioned topic, which only the topic registry may do."""
    if not _namespace_exists(store, name):
        raise Refused("TopicNotFound", f"Namespace {name.namespace} does not exist")
    partitions = partitions_of(store, name)
    if partitions is not None:
        return partitions
    rule = auto_creation(store.namespaces.get(name.namespace), settings)
    if rule.allow and rule.partitioned and name.partition_index < 0:
        return None
    return 0  # not there (yet): a non-partitioned topic, created or refused on use


def admit(store: MetadataStore, settings: Any, name: TopicName) -> bool:
    """Make sure a producer or consumer may use ``name``; True when it was just created.

    Raises:
        Refused: the namespace is missing, the topic is missing and may not be created, or
            the name is a partitioned topic's own (its partitions are the topics).
    """
    if not _namespace_exists(store, name):
        raise Refused("TopicNotFound", f"Namespace {name.namespace} does not exist")
    partitions = partitions_of(store, name)
    if partitions is not None and partitions > 0:
        raise Refused(
            "NotAllowedError",
            f"{name} is a partitioned topic: produce to and consume from its partitions",
        )
    if partitions == 0:
        return False
    index = name.partition_index
    base = store.topics.get(name.base.full) if index >= 0 else None
    if base is not None and base.partitions > 0:
        raise Refused(
            "TopicNotFound",
            f"Topic {name} does not exist: {name.base} has {base.partitions} partitions",
        )
    if not auto_creation(store.namespaces.get(name.namespace), settings).allow:
        raise Refused("TopicNotFound", f"Topic {name} does not exist")
    store.create_topic(name.full, name.namespace, 0, exist_ok=True, wait=False)
    return True


def lookup_refusal(store: MetadataStore, name: TopicName) -> Refused | None:
    """Why a binary LOOKUP fails, or None: only a missing namespace fails it, as in Pulsar."""
    if not _namespace_exists(store, name):
        return Refused("MetadataError", f"Namespace {name.namespace} does not exist")
    return None


def topic_names(store: MetadataStore, namespace: str, mode: int) -> list[str]:
    """Full names in a namespace as GET_TOPICS_OF_NAMESPACE answers them (partitions expanded)."""
    names: list[str] = []
    for meta in store.topics_of(namespace):
        persistent = meta.name.startswith("persistent://")
        if (mode == MODE_PERSISTENT and not persistent) or (
            mode == MODE_NON_PERSISTENT and persistent
        ):
            continue
        if meta.partitions == 0:
            names.append(meta.name)
        else:
            names.extend(f"{meta.name}-partition-{i}" for i in range(meta.partitions))
    return names


def filter_by_pattern(names: Iterable[str], pattern: str) -> list[str]:
    """The names the client's ``topics_pattern`` matches (Java ``matches``: the whole name).

    As in Pulsar's ``TopicList#filterTopics``, a partition is matched by its partitioned
    topic's name, and both sides lose their ``domain://`` prefix.
    """
    compiled = re.compile(pattern.split("://", 1)[-1])
    kept = []
    for name in names:
        try:
            base = TopicName.parse(name).base.full
        except ValueError:
            base = name
        if compiled.fullmatch(base.split("://", 1)[-1]):
            kept.append(name)
    return kept


def topics_hash(names: Iterable[str]) -> str:
    """An order-independent hash of a topic list: CRC32C over the sorted names, as in
    ``TopicList#calculateHash`` (clients only compare it with the hash they got before).
    """
    checksum = 0
    for name in sorted(names):
        checksum = crc32c.crc32c(name.encode(), checksum)
    return format(checksum & 0xFFFFFFFF, "x")
