"""The metadata store's tables, as an ordered list of migrations.

The database's ``PRAGMA user_version`` is the number of migrations applied. Opening a store
applies the missing ones, each in its own transaction; a database whose version is above
``len(MIGRATIONS)`` was written by a newer brokerlet and is refused.

To add tables (schemas, security policies, ...): append a :class:`Migration` with the next
version and never edit one that has shipped. Each migration gets the open connection inside
a transaction; it should only run DDL and DML, never commit.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

__all__ = ["APPLICATION_ID", "MIGRATIONS", "Migration"]

APPLICATION_ID: Final = 0x42524B4C
"""``PRAGMA application_id`` of brokerlet metadata files ("BRKL"): a foreign SQLite file is
refused rather than altered."""


@dataclass(frozen=True, slots=True)
class Migration:
    """One step of the schema: ``version`` is its 1-based place in :data:`MIGRATIONS`."""

    version: int
    description: str
    apply: Callable[[sqlite3.Connection], None]


def _statements(*sql: str) -> Callable[[sqlite3.Connection], None]:
    def apply(connection: sqlite3.Connection) -> None:
        for statement in sql:
            connection.execute(statement)

    return apply


MIGRATIONS: Final[list[Migration]] = [
    Migration(
        1,
        "tenants, namespaces with policies, topics with partition counts",
        _statements(
            # Values are JSON documents in Pulsar's shapes (TenantInfo, Policies, properties).
            "CREATE TABLE tenants (name TEXT PRIMARY KEY, info TEXT NOT NULL)",
            "CREATE TABLE namespaces ("
            " name TEXT PRIMARY KEY,"
            " tenant TEXT NOT NULL REFERENCES tenants(name),"
            " policies TEXT NOT NULL)",
            # partitions: 0 for a non-partitioned topic, n > 0 for a partitioned one (whose
            # partitions <name>-partition-<i> have no rows of their own).
            "CREATE TABLE topics ("
            " name TEXT PRIMARY KEY,"
            " namespace TEXT NOT NULL REFERENCES namespaces(name),"
            " partitions INTEGER NOT NULL CHECK (partitions >= 0),"
            " properties TEXT NOT NULL)",
            "CREATE INDEX topics_by_namespace ON topics(namespace)",
        ),
    ),
    Migration(
        2,
        "schema versions of the schema registry (brokerlet.schema.TableSchemaStorage)",
        _statements(
            # One row per version, deletion markers included; schema_id is tenant/ns/topic.
            "CREATE TABLE schema_versions ("
            " schema_id TEXT NOT NULL,"
            " version INTEGER NOT NULL,"
            " type INTEGER NOT NULL,"
            " data BLOB NOT NULL,"
            " properties TEXT NOT NULL,"
            " timestamp_ms INTEGER NOT NULL,"
            " deleted INTEGER NOT NULL,"
            " PRIMARY KEY (schema_id, version))",
        ),
    ),
]

for _index, _migration in enumerate(MIGRATIONS, start=1):
    assert _migration.version == _index, f"migration {_migration.version} out of order"
