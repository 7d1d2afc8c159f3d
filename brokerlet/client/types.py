"""Small value types and pure helpers of the client: ids, enums, names and URLs."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from urllib.parse import urlsplit

from brokerlet.client.errors import InvalidConfiguration, InvalidTopicName

__all__ = [
    "ConsumerType",
    "InitialPosition",
    "MessageId",
    "format_url",
    "java_string_hash",
    "normalize_topic",
    "parse_service_url",
    "partition_topic",
]

DEFAULT_PORT = 6650


@dataclass(frozen=True, order=True, slots=True)
class MessageId:
    """Where a message is stored: an entry of a ledger, and its index inside a batch.

    Ids order the way the broker stores messages: by ledger, then entry, then batch index.

    Attributes:
        ledger_id: the ledger holding the entry.
        entry_id: the entry within the ledger.
        batch_index: the message's index inside a batched entry; -1 if the entry holds one
            message.
        partition: the partition of a partitioned topic; -1 for a non-partitioned topic.
    """

    ledger_id: int
    entry_id: int
    batch_index: int = -1
    partition: int = -1


class ConsumerType(enum.Enum):
    """Subscription types; the values are the wire's ``SubType``."""

    Exclusive = 0
    Shared = 1
    Failover = 2
    KeyShared = 3


class InitialPosition(enum.Enum):
    """Where a new subscription starts; the values are the wire's ``InitialPosition``."""

    Latest = 0
    Earliest = 1


def normalize_topic(topic: str) -> str:
    """Expand a short topic name the way the official client does.

    ``t`` becomes ``persistent://public/default/t`` and ``tenant/ns/t`` becomes
    ``persistent://tenant/ns/t``; full names are kept.

    Args:
        topic: a short or fully qualified name.

    Returns:
        The fully qualified name.

    Raises:
        InvalidTopicName: the name has an unknown domain or the wrong number of parts.
    """
    if "://" in topic:
        domain, _, rest = topic.partition("://")
        if domain not in ("persistent", "non-persistent"):
            raise InvalidTopicName(f"unknown topic domain in {topic!r}")
    else:
        domain, rest = "persistent", topic
        if rest.count("/") == 0:
            rest = f"public/default/{rest}"
    parts = rest.split("/")
    # Three parts (tenant/namespace/topic), or four in the old cluster-qualified form.
    if len(parts) not in (3, 4) or not all(parts):
        raise InvalidTopicName(f"invalid topic name {topic!r}")
    return f"{domain}://{rest}"


def partition_topic(topic: str, partition: int) -> str:
    """The name of one partition of a partitioned topic."""
    return f"{topic}-partition-{partition}"


def java_string_hash(key: str) -> int:
    """Java's ``String.hashCode`` masked to a non-negative int, as Pulsar's JavaStringHash.

    Producers route keyed messages of a partitioned topic to ``hash % partitions``; using
    the Java client's default scheme keeps keys on the same partitions across clients.

    >>> java_string_hash("key-1")
    101943363
    """
    value = 0
    units = key.encode("utf-16-be")
    for index in range(0, len(units), 2):
        value = (31 * value + (units[index] << 8 | units[index + 1])) & 0xFFFFFFFF
    return value & 0x7FFFFFFF


def parse_service_url(service_url: str) -> list[tuple[str, int]]:
    """Split a ``pulsar://host[:port][,host[:port]...]`` URL into addresses.

    Args:
        service_url: the URL given to the client.

    Returns:
        The (host, port) pairs in order; the port defaults to 6650.

    Raises:
        InvalidConfiguration: not a ``pulsar://`` URL (TLS is not supported), or no host.
    """
    parsed = urlsplit(service_url.strip())
    if parsed.scheme != "pulsar":
        raise InvalidConfiguration(
            f"unsupported service URL {service_url!r}: only pulsar:// is supported"
        )
    addresses: list[tuple[str, int]] = []
    for part in parsed.netloc.split(","):
        host, port = _split_host_port(part, service_url)
        addresses.append((host, port))
    return addresses


def _split_host_port(part: str, service_url: str) -> tuple[str, int]:
    part = part.strip()
    if part.startswith("["):  # [IPv6]:port
        host, _, rest = part[1:].partition("]")
        port_text = rest.removeprefix(":")
    else:
        host, _, port_text = part.rpartition(":") if ":" in part else (part, "", "")
    if not host:
        raise InvalidConfiguration(f"no host in service URL {service_url!r}")
    if not port_text:
        return host, DEFAULT_PORT
    try:
        port = int(port_text)
    except ValueError:
        raise InvalidConfiguration(f"bad port in service URL {service_url!r}") from None
    if not 0 < port < 65536:
        raise InvalidConfiguration(f"bad port in service URL {service_url!r}")
    return host, port


def format_url(host: str, port: int) -> str:
    """The canonical ``pulsar://host:port`` for an address (IPv6 hosts bracketed)."""
    if ":" in host:
        return f"pulsar://[{host}]:{port}"
    return f"pulsar://{host}:{port}"
