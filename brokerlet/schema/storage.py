"""Where schema versions live: a small storage protocol and two implementations.

A storage keeps, per schema id (``tenant/namespace/topic``), the records in version order,
deletion markers included; it applies no rule of its own. :class:`MemorySchemaStorage` is for
an embedded broker that stores nothing; :class:`SqliteSchemaStorage` keeps them in one table
of a SQLite database, which may be the metadata store's own (pass its connection) or a file
of its own in the data directory.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Protocol

from brokerlet.schema.record import SchemaRecord, StoredSchema
from brokerlet.schema.types import SchemaType

__all__ = ["MemorySchemaStorage", "SchemaStorage", "SqliteSchemaStorage"]


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


_CREATE = """
CREATE TABLE IF NOT EXISTS schema_versions (
    schema_id    TEXT    NOT NULL,
    version      INTEGER NOT NULL,
    type         INTEGER NOT NULL,
    data         BLOB    NOT NULL,
    properties   TEXT    NOT NULL,
    timestamp_ms INTEGER NOT NULL,
    deleted      INTEGER NOT NULL,
    PRIMARY KEY (schema_id, version)
)
"""


class SqliteSchemaStorage:
    """Versions in the ``schema_versions`` table of a SQLite database.

    Args:
        database: a path (the file is created, with its directory) or an open
            ``sqlite3.Connection`` to share, e.g. the metadata store's. A shared connection
            must have been opened with ``check_same_thread=False`` if other threads use it;
            it is not closed by :meth:`close`.
    """

    def __init__(self, database: str | Path | sqlite3.Connection) -> None:
        self._lock = threading.Lock()
        if isinstance(database, sqlite3.Connection):
            self._connection = database
            self._owned = False
        else:
            path = Path(database)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._connection = sqlite3.connect(path, check_same_thread=False)
            self._connection.execute("PRAGMA journal_mode=WAL")
            self._owned = True
        with self._lock, self._connection:
            self._connection.execute(_CREATE)

    def versions(self, schema_id: str) -> list[StoredSchema]:
        with self._lock:
            rows = self._connection.execute(
                "SELECT version, type, data, properties, timestamp_ms, deleted "
                "FROM schema_versions WHERE schema_id = ? ORDER BY version",
                (schema_id,),
            ).fetchall()
        return [
            StoredSchema(
                version,
                SchemaRecord(
                    SchemaType(kind), bytes(data), json.loads(properties), timestamp, bool(deleted)
                ),
            )
            for version, kind, data, properties, timestamp, deleted in rows
        ]

    def put(self, schema_id: str, record: SchemaRecord) -> int:
        with self._lock, self._connection:
            (last,) = self._connection.execute(
                "SELECT MAX(version) FROM schema_versions WHERE schema_id = ?", (schema_id,)
            ).fetchone()
            version = 0 if last is None else int(last) + 1
            self._connection.execute(
                "INSERT INTO schema_versions VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    schema_id,
                    version,
                    int(record.type),
                    record.data,
                    json.dumps(dict(record.properties), sort_keys=True),
                    record.timestamp_ms,
                    int(record.deleted),
                ),
            )
        return version

    def delete(self, schema_id: str) -> None:
        with self._lock, self._connection:
            self._connection.execute(
                "DELETE FROM schema_versions WHERE schema_id = ?", (schema_id,)
            )

    def schema_ids(self) -> list[str]:
        with self._lock:
            rows = self._connection.execute(
                "SELECT DISTINCT schema_id FROM schema_versions ORDER BY schema_id"
            ).fetchall()
        return [row[0] for row in rows]

    def close(self) -> None:
        if self._owned:
            with self._lock:
                self._connection.close()
