"""Topic, namespace and tenant names, as Pulsar's ``TopicName`` and ``NamedEntity`` parse them.

A full topic name is ``<domain>://<tenant>/<namespace>/<local name>``; a partition of a
partitioned topic is the topic ``<name>-partition-<i>``. Tenant, namespace and cluster names
follow ``NamedEntity.checkName`` (letters, digits, ``_ - = : .``). brokerlet also refuses
local names that could not be served safely: empty or dot-only segments (``a//b``,
``/..``), control characters, and more than :data:`MAX_LOCAL_NAME` characters.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Final

__all__ = [
    "DOMAINS",
    "MAX_LOCAL_NAME",
    "PARTITION_SUFFIX",
    "InvalidName",
    "TopicName",
    "check_entity_name",
    "namespace_name",
]

DOMAINS: Final = ("persistent", "non-persistent")
PARTITION_SUFFIX: Final = "-partition-"
MAX_LOCAL_NAME: Final = 1000

_ENTITY: Final = re.compile(r"^[-=:.\w]+$")
_PARTITION: Final = re.compile(r"^(?P<base>.+)-partition-(?P<index>0|[1-9][0-9]*)$")
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")
_PARSED_KEPT: Final = 4096  # valid topic names kept parsed (TopicName.parse)


class InvalidName(ValueError):  # noqa: N818 - Pulsar's own term (InvalidTopicName)
    """A name Pulsar would refuse; the message says why."""


def check_entity_name(kind: str, name: str) -> str:
    """``name`` if it is a valid tenant, namespace or cluster name (``kind`` for messages)."""
    if not _ENTITY.match(name) or name in (".", ".."):
        raise InvalidName(f"Invalid {kind} name {name!r}: use letters, digits and _-=:.")
    return name


def namespace_name(tenant: str, namespace: str) -> str:
    """``tenant/namespace`` after checking both parts."""
    check_entity_name("tenant", tenant)
    check_entity_name("namespace", namespace)
    return f"{tenant}/{namespace}"


def _check_local(local: str) -> None:
    if not local:
        raise InvalidName("Invalid topic name: the local name is empty")
    if len(local) > MAX_LOCAL_NAME:
        raise InvalidName(
            f"Invalid topic name: {len(local)} characters, at most {MAX_LOCAL_NAME} allowed"
        )
    if _CONTROL.search(local):
        raise InvalidName(f"Invalid topic name {local!r}: control characters are not allowed")
    for segment in local.split("/"):
        if segment in ("", ".", ".."):
            raise InvalidName(
                f"Invalid topic name {local!r}: empty, '.' or '..' path segments are not allowed"
            )


@dataclass(frozen=True, slots=True)
class TopicName:
    """A parsed, checked full topic name."""

    domain: str
    tenant: str
    namespace_local: str
    local: str

    @staticmethod
    @functools.lru_cache(maxsize=_PARSED_KEPT)
    def parse(name: str) -> TopicName:
        """Parse ``domain://tenant/namespace/local``; :class:`InvalidName` when malformed.

        The last :data:`_PARSED_KEPT` valid names are kept parsed: a client names the same
        topic in each of its requests (lookup, producer, subscribe), and a PRODUCER for a new
        topic parsed its name three times, 70 of that request's 960 lines of bytecode.
        """
        domain, sep, rest = name.partition("://")
        if not sep or domain not in DOMAINS:
            raise InvalidName(
                f"Invalid topic name {name!r}: expected persistent:// or non-persistent://"
            )
        parts = rest.split("/", 2)
        if len(parts) != 3:
            raise InvalidName(f"Invalid topic name {name!r}: expected <tenant>/<namespace>/<topic>")
        tenant, namespace, local = parts
        try:
            check_entity_name("tenant", tenant)
            check_entity_name("namespace", namespace)
            _check_local(local)
        except InvalidName as error:
            raise InvalidName(f"{error} (in {name!r})") from None
        return TopicName(domain, tenant, namespace, local)

    @classmethod
    def of(cls, domain: str, tenant: str, namespace: str, local: str) -> TopicName:
        """From REST path parts; checked like :meth:`parse`."""
        if domain not in DOMAINS:
            raise InvalidName(f"Invalid domain {domain!r}")
        check_entity_name("tenant", tenant)
        check_entity_name("namespace", namespace)
        _check_local(local)
        return cls(domain, tenant, namespace, local)

    @property
    def namespace(self) -> str:
        """``tenant/namespace``."""
        return f"{self.tenant}/{self.namespace_local}"

    @property
    def persistent(self) -> bool:
        return self.domain == "persistent"

    @property
    def full(self) -> str:
        return f"{self.domain}://{self.tenant}/{self.namespace_local}/{self.local}"

    def __str__(self) -> str:
        return self.full

    @property
    def partition_index(self) -> int:
        """The index when this is a ``-partition-<i>`` name, else -1."""
        match = _PARTITION.match(self.local)
        return int(match["index"]) if match else -1

    @property
    def base(self) -> TopicName:
        """The partitioned topic this partition belongs to (itself when not a partition)."""
        match = _PARTITION.match(self.local)
        if match is None:
            return self
        return TopicName(self.domain, self.tenant, self.namespace_local, match["base"])

    def partition(self, index: int) -> TopicName:
        """The name of partition ``index``."""
        return TopicName(
            self.domain, self.tenant, self.namespace_local, f"{self.local}{PARTITION_SUFFIX}{index}"
        )
