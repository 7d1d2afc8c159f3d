"""The schema registry: Pulsar's SchemaRegistryServiceImpl rules over a :class:`SchemaStorage`.

Thread-safe (one lock around each read-check-write), runtime-free: it never yields to gevent,
so connection actors and admin handlers on the broker's hub, and embedding threads, may share
one registry. Topics map to schema ids as Pulsar's ``TopicName.getSchemaName`` does:
``tenant/namespace/topic`` without the domain and without a ``-partition-N`` suffix, so a
partitioned topic's partitions share their parent's schema.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

from brokerlet.config import Settings
from brokerlet.schema import compat
from brokerlet.schema.avro_rules import same_avro
from brokerlet.schema.policies import (
    NamespacePolicies,
    SchemaPolicies,
    namespace_of,
    schema_policies,
)
from brokerlet.schema.record import (
    IncompatibleSchemaError,
    SchemaNotFoundError,
    SchemaRecord,
    StoredSchema,
)
from brokerlet.schema.storage import MemorySchemaStorage, SchemaStorage
from brokerlet.schema.types import SchemaType, Strategy
from brokerlet.schema.validate import validate

__all__ = ["SchemaRegistry", "schema_id"]

_PARTITION = re.compile(r"-partition-\d+$")
_AVRO_DEFINED = frozenset({SchemaType.AVRO, SchemaType.JSON, SchemaType.PROTOBUF})


def schema_id(topic: str) -> str:
    """The registry key of a topic: ``persistent://t/ns/x-partition-3`` -> ``t/ns/x``.

    Raises:
        ValueError: not ``[domain://]tenant/namespace/topic``.
    """
    _, _, rest = topic.rpartition("://")
    parts = rest.split("/")
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"invalid topic name {topic!r}")
    tenant, namespace, local = parts
    return f"{tenant}/{namespace}/{_PARTITION.sub('', local)}"


def _live(stored: list[StoredSchema]) -> list[StoredSchema]:
    """The versions after the latest deletion marker (Pulsar's trimDeletedSchemaAndGetList)."""
    for index in range(len(stored) - 1, -1, -1):
        if stored[index].record.deleted:
            return stored[index + 1 :]
    return stored


def _same(a: SchemaRecord, b: SchemaRecord) -> bool:
    if a.type != b.type:
        return False
    if a.type in _AVRO_DEFINED:
        return same_avro(a.data, b.data)
    return a.data == b.data


class SchemaRegistry:
    """Versions per topic, with Pulsar's compatibility and admission rules.

    Args:
        settings: broker settings (strategy, auto update, validation, size limit).
        storage: where versions live; in memory by default.
        namespace_policies: a namespace's policies document (None where it has none), for
            the metadata store to supply; without it the broker settings apply everywhere.
        clock: seconds since the epoch, for registration timestamps.
        lock: what serialises changes; a plain thread lock by default. A storage whose
            writes yield (the metadata store waits for its commit on the hub's thread pool)
            needs a lock that yields too, or a second greenlet would block the hub thread.
    """

    def __init__(
        self,
        settings: Settings,
        storage: SchemaStorage | None = None,
        *,
        namespace_policies: NamespacePolicies | None = None,
        clock: Callable[[], float] = time.time,
        lock: AbstractContextManager[object] | None = None,
    ) -> None:
        self.settings = settings
        self.storage: SchemaStorage = storage if storage is not None else MemorySchemaStorage()
        self.namespace_policies = namespace_policies
        self._clock = clock
        # The default is held across no yield with the memory storage, so greenlets of one
        # hub and other threads exclude each other alike.
        self._lock: AbstractContextManager[object] = lock if lock is not None else threading.Lock()

    # Policies.

    def policies(self, topic: str) -> SchemaPolicies:
        """The schema policies in force for ``topic``."""
        document = None
        if self.namespace_policies is not None:
            document = self.namespace_policies(namespace_of(schema_id(topic)))
        return schema_policies(self.settings, document)

    # Reading.

    def _versions(self, topic: str) -> list[StoredSchema]:
        return _live(self.storage.versions(schema_id(topic)))

    def history(self, topic: str) -> list[StoredSchema]:
        """The live versions of ``topic``'s schema, oldest first."""
        return self._versions(topic)

    def get(self, topic: str, version: int | None = None) -> StoredSchema | None:
        """The latest live version, or ``version`` if it is live; else None."""
        versions = self._versions(topic)
        if version is None:
            return versions[-1] if versions else None
        for stored in versions:
            if stored.version == version:
                return stored
        return None

    def has_schema(self, topic: str) -> bool:
        return bool(self._versions(topic))

    def find_version(self, topic: str, record: SchemaRecord) -> int | None:
        """The live version equal to ``record`` (Avro-defined types compare as Avro)."""
        return self._find(self._versions(topic), record)

    @staticmethod
    def _find(versions: Sequence[StoredSchema], record: SchemaRecord) -> int | None:
        for stored in versions:
            if _same(stored.record, record):
                return stored.version
        return None

    # Checking.

    def _validate(self, record: SchemaRecord) -> None:
        validate(record, self.settings.schema_max_size_bytes)

    @staticmethod
    def _with_latest(
        versions: Sequence[StoredSchema], record: SchemaRecord, strategy: Strategy
    ) -> None:
        if strategy is Strategy.ALWAYS_COMPATIBLE or not versions:
            return
        latest = versions[-1].record
        if latest.type != record.type:
            raise IncompatibleSchemaError(
                f"Incompatible schema: exists schema type {latest.type.name}, new schema type "
                f"{record.type.name}"
            )
        if not latest.same_hash(record):
            compat.check([latest], record, strategy)

    @staticmethod
    def _with_all(
        versions: Sequence[StoredSchema], record: SchemaRecord, strategy: Strategy
    ) -> None:
        if strategy is Strategy.ALWAYS_COMPATIBLE or not versions:
            return
        for stored in versions:
            if stored.record.type != record.type:
                raise IncompatibleSchemaError(
                    f"Incompatible schema: exists schema type {stored.record.type.name}, new "
                    f"schema type {record.type.name}"
                )
        compat.check([s.record for s in reversed(versions)], record, strategy)

    def check_compatible(
        self, topic: str, record: SchemaRecord, strategy: Strategy | None = None
    ) -> None:
        """Would ``record`` be accepted as a new version? (The admin ``/compatibility``.)

        Raises:
            InvalidSchemaError: malformed.
            IncompatibleSchemaError: refused by the strategy.
        """
        self._validate(record)
        strategy = strategy or self.policies(topic).compatibility
        versions = self._versions(topic)
        if strategy.transitive:
            self._with_all(versions, record, strategy)
        else:
            self._with_latest(versions, record, strategy)

    def check_consumer(
        self, topic: str, record: SchemaRecord, strategy: Strategy | None = None
    ) -> None:
        """May a consumer read ``topic`` with ``record``? (checkConsumerCompatibility.)

        A consumer's schema must be able to read what was written: non-transitive strategies
        (and FORWARD_TRANSITIVE) check it BACKWARD against the latest version only.

        Raises:
            IncompatibleSchemaError: refused, or the topic has no schema to check against.
        """
        strategy = strategy or self.policies(topic).compatibility
        if strategy is Strategy.ALWAYS_COMPATIBLE:
            return
        versions = self._versions(topic)
        if not versions:
            raise IncompatibleSchemaError("Topic does not have schema to check")
        if strategy in (
            Strategy.BACKWARD,
            Strategy.FORWARD,
            Strategy.FORWARD_TRANSITIVE,
            Strategy.FULL,
        ):
            self._with_latest(versions, record, Strategy.BACKWARD)
        else:
            self._with_all(versions, record, strategy)

    # Writing.

    def put_if_absent(
        self, topic: str, record: SchemaRecord, strategy: Strategy | None = None
    ) -> int:
        """The version of ``record``, registering it if it is new and compatible.

        Raises:
            InvalidSchemaError: malformed (nothing is registered).
            IncompatibleSchemaError: refused by the strategy (nothing is registered).
        """
        self._validate(record)
        strategy = strategy or self.policies(topic).compatibility
        key = schema_id(topic)
        with self._lock:
            versions = _live(self.storage.versions(key))
            found = self._find(versions, record)
            if found is not None:
                return found
            if strategy.transitive:
                self._with_all(versions, record, strategy)
            else:
                self._with_latest(versions, record, strategy)
            stamped = SchemaRecord(
                record.type, record.data, dict(record.properties), int(self._clock() * 1000)
            )
            return self.storage.put(key, stamped)

    def add_schema(self, topic: str, record: SchemaRecord) -> int:
        """A topic's addSchema: register (if auto update allows it) or find ``record``.

        Raises:
            InvalidSchemaError, IncompatibleSchemaError: refused; nothing is registered.
        """
        policies = self.policies(topic)
        if policies.allow_auto_update:
            return self.put_if_absent(topic, record, policies.compatibility)
        self._validate(record)
        found = self.find_version(topic, record)
        if found is None:
            raise IncompatibleSchemaError("Schema not found and schema auto updating is disabled.")
        return found

    def delete(self, topic: str) -> int:
        """Mark the schema deleted (Pulsar's non-forced delete); return the marker's version.

        Earlier versions stay stored but no longer count; the next registration starts a new
        history after the marker.

        Raises:
            SchemaNotFoundError: no live schema.
        """
        key = schema_id(topic)
        with self._lock:
            if not _live(self.storage.versions(key)):
                raise SchemaNotFoundError(f"No schema found for {key}")
            marker = SchemaRecord(SchemaType.NONE, b"", {}, int(self._clock() * 1000), deleted=True)
            return self.storage.put(key, marker)

    def delete_all(self, topic: str) -> None:
        """Forget every version (a forced delete, and what deleting a topic does)."""
        with self._lock:
            self.storage.delete(schema_id(topic))

    def topic_deleted(self, topic: str) -> bool:
        """What deleting ``topic`` does to its schema; True if the history was dropped.

        Pulsar's AbstractTopic.deleteSchema drops the whole history (not a deletion marker:
        "when we delete a topic, the schema history is meaningless"), except for a partition
        of a partitioned topic, whose shared schema goes when the partitioned topic does.
        """
        if _PARTITION.search(topic):
            return False
        self.delete_all(topic)
        return True

    # Admission of producers and consumers (ServerCnx / AbstractTopic rules).

    def admit_producer(self, topic: str, record: SchemaRecord | None) -> int | None:
        """The schema version a new producer gets, or None when it has no schema.

        A producer without a schema (BYTES) on a topic with one is refused only when
        ``schemaValidationEnforced`` is on.

        Raises:
            InvalidSchemaError, IncompatibleSchemaError: the producer must be refused.
        """
        if record is None:
            if self.policies(topic).validation_enforced and self.has_schema(topic):
                raise IncompatibleSchemaError(
                    "Producers cannot connect or send message without a schema to topics with "
                    "a schema"
                )
            return None
        return self.add_schema(topic, record)

    def admit_consumer(
        self, topic: str, record: SchemaRecord | None, topic_idle: Callable[[], bool]
    ) -> None:
        """Check (or, on an idle topic without a schema, register) a consumer's schema.

        ``topic_idle`` says whether the topic has no producers, no consumers with a schema
        other than AUTO_CONSUME and no data; it is called only when the topic has no schema.
        An AUTO_CONSUME consumer or one without a schema is not checked.

        Raises:
            InvalidSchemaError, IncompatibleSchemaError: the consumer must be refused.
        """
        if record is None or record.type is SchemaType.AUTO_CONSUME:
            return
        self._validate(record)
        if self.has_schema(topic):
            self.check_consumer(topic, record)
        elif topic_idle():
            self.add_schema(topic, record)
        else:
            raise IncompatibleSchemaError(
                "Failed to add schema to an active topic with empty(BYTES) schema: new schema "
                f"type {record.type.name}"
            )
