"""Where schema versions live: a small storage protocol and two implementations.

A storage keeps, per schema id (``tenant/namespace/topic``), the records in version order,
deletion markers included; it applies no rule of its own. :class:`MemorySchemaStorage` is for
an embedded broker that stores nothing; :class:`TableSchemaStorage` keeps them in one table
of the metadata store's SQLite database (so a disk broker's schemas survive a restart with
its tenants, namespaces and topics).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable
from typing import Protocol, TypeVar

from brokerlet.schema.record import SchemaRecord, StoredSchema
from brokerlet.schema.types import SchemaType

__all__ = ["MemorySchemaStorage", "SchemaStorage", "SqlDatabase", "TableSchemaStorage"]

T = TypeVar("T")


class SchemaStorage(Protocol):
    """What the registry needs from a store. Calls may come from any thread."""

    def versions(self, schema_id: str) -> list[StoredSchema]:
        """Every stored record of ``schema_id`` in version order (empty if none)."""
        ...

    def put(self, schema_id: str, record: SchemaRecord) -> int:
        """Append ``record`` as the next version (one past the last; 0 for the first)."""
        ...

    def delete(self, schema_id: str) -> None:
        """Forget ``schema_id`` entirely; its next put is version 0 again."""
        ...

    def schema_ids(self) -> list[str]:
        """Every schema id with at least one stored record."""
        ...

    def close(self) -> None:
        """Release what the storage holds (not a connection it was given)."""
        ...


class MemorySchemaStorage:
    """Versions in a dict; gone with the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._versions: dict[str, list[StoredSchema]] = {}

    def versions(self, schema_id: str) -> list[StoredSchema]:
        with self._lock:
            return list(self._versions.get(schema_id, ()))

    def put(self, schema_id: str, record: SchemaRecord) -> int:
        with self._lock:
            stored = self._versions.setdefault(schema_id, [])
            version = stored[-1].version + 1 if stored else 0
            stored.append(StoredSchema(version, record))
            return version

    def delete(self, schema_id: str) -> None:
        with self._lock:
            self._versions.pop(schema_id, None)

    def schema_ids(self) -> list[str]:
        with self._lock:
            return sorted(self._versions)

    def close(self) -> None:
        pass


class SqlDatabase(Protocol):
    """A SQLite database that runs callables on its connection: the metadata store
    (:class:`brokerlet.metadata.MetadataStore`) is one. ``write`` runs its callable as one
    transaction (and may wait for the commit cooperatively)."""

    def read(self, query: Callable[[sqlite3.Connection], T]) -> T: ...

    def write(self, change: Callable[[sqlite3.Connection], T]) -> T: ...


class TableSchemaStorage:
    """Versions in the ``schema_versions`` table of a :class:`SqlDatabase` (the metadata
    store's migration 2 creates it), with every row also kept in memory: admission reads
    the history of a topic on each PRODUCER, and a read then costs no SQL.

    The in-memory copy changes only after the database's transaction committed, so a
    failed write leaves both as they were. Callers serialise writes (the registry's lock).
    """

    def __init__(self, database: SqlDatabase) -> None:
        self._database = database
        self._lock = threading.Lock()
        rows = database.read(
            lambda connection: connection.execute(
                "SELECT schema_id, version, type, data, properties, timestamp_ms, deleted "
                "FROM schema_versions ORDER BY schema_id, version"
            ).fetchall()
        )
        self._versions: dict[str, list[StoredSchema]] = {}
        for schema_id, version, kind, data, properties, timestamp, deleted in rows:
            record = SchemaRecord(
                SchemaType(kind), bytes(data), json.loads(properties), timestamp, bool(deleted)
            )
            self._versions.setdefault(schema_id, []).append(StoredSchema(version, record))

    def versions(self, schema_id: str) -> list[StoredSchema]:
        with self._lock:
            return list(self._versions.get(schema_id, ()))

    def put(self, schema_id: str, record: SchemaRecord) -> int:
        with self._lock:
            stored = self._versions.get(schema_id, [])
            version = stored[-1].version + 1 if stored else 0
        row = (
            schema_id,
            version,
            int(record.type),
            record.data,
            json.dumps(dict(record.properties), sort_keys=True),
            record.timestamp_ms,
            int(record.deleted),
        )
        self._database.write(
            lambda connection: connection.execute(
                "INSERT INTO schema_versions VALUES (?, ?, ?, ?, ?, ?, ?)", row
            )
        )
        with self._lock:
            self._versions.setdefault(schema_id, []).append(StoredSchema(version, record))
        return version

    def delete(self, schema_id: str) -> None:
        self._database.write(
            lambda connection: connection.execute(
                "DELETE FROM schema_versions WHERE schema_id = ?", (schema_id,)
            )
        )
        with self._lock:
            self._versions.pop(schema_id, None)

    def schema_ids(self) -> list[str]:
        with self._lock:
            return sorted(self._versions)

    def close(self) -> None:
        pass  # the database is its owner's to close
