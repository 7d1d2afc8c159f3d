"""The metadata store: tenants, namespaces with policies, topics and partition counts.

One SQLite database (the standard library's ``sqlite3``): ``<data_dir>/metadata.db`` for a
broker that stores on disk, an in-memory database otherwise. Every change is one
transaction, so a crash leaves the previous state or the next, never half of one; WAL mode
with ``synchronous=FULL`` makes a committed change survive power loss.

Reads come from an in-memory copy of the tables, kept in step with each commit, so the
binary protocol's existence checks cost a dict lookup. Writes are serialised by a gevent
lock; on disk they run on the hub's thread pool, since a commit may fsync and must not stall
the event loop. Call the store from greenlets of the broker's hub only.

Other areas add their own tables with a migration (:mod:`brokerlet.metadata.schema`) and use
:meth:`MetadataStore.read` and :meth:`MetadataStore.write` for them.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import gevent
import gevent.lock

from brokerlet.metadata.schema import APPLICATION_ID, MIGRATIONS

__all__ = [
    "DEFAULT_NAMESPACE",
    "DEFAULT_TENANT",
    "DEFERRED_COMMIT_DELAY",
    "FILE_NAME",
    "AlreadyExists",
    "MetadataError",
    "MetadataStore",
    "NotEmpty",
    "NotFound",
    "TopicMeta",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

FILE_NAME: Final = "metadata.db"
DEFAULT_TENANT: Final = "public"
DEFAULT_NAMESPACE: Final = "public/default"


class MetadataError(Exception):
    """The store cannot be opened (corrupt, incompatible) or a change is not allowed."""


class NotFound(MetadataError):  # noqa: N818 - read as "raise NotFound(...)"
    pass


DEFERRED_COMMIT_DELAY = 1.0
"""Seconds a change nobody waits for (an auto-created topic) may wait for its commit: its
fsync then falls outside the requests that follow the creation, and one commit carries every
topic created meanwhile. Storage recovers such a topic at start-up if a crash comes first."""


class AlreadyExists(MetadataError):  # noqa: N818
    pass


class NotEmpty(MetadataError):  # noqa: N818
    pass


@dataclass(frozen=True, slots=True)
class TopicMeta:
    """A topic's stored metadata: ``partitions`` is 0 for a non-partitioned topic."""

    name: str
    namespace: str
    partitions: int
    properties: Mapping[str, str] = field(default_factory=dict)


class MetadataStore:
    """Clusters, tenants, namespaces and topic metadata (see the module docstring).

    Args:
        path: the database file, or None for an in-memory store.
        cluster: this broker's cluster name (``cluster_name``).
        deferred_commit_delay: seconds the changes nobody waits for are gathered before
            their commit (a file's store only; in memory they commit at once).

    Raises:
        MetadataError: the file is not a brokerlet metadata database, is corrupt, or was
            written by a newer brokerlet.
    """

    def __init__(
        self,
        path: str | None,
        *,
        cluster: str = "standalone",
        deferred_commit_delay: float = DEFERRED_COMMIT_DELAY,
    ) -> None:
        self.path = path
        self.cluster = cluster
        self._lock = gevent.lock.Semaphore()
        self._offload = path is not None  # only a file's commits may fsync
        # Changes whose commit nobody waits for; they go first in the next transaction.
        self._deferred: list[Callable[[sqlite3.Connection], object]] = []
        self._flushing: gevent.Greenlet | None = None
        self._deferred_commit_delay = deferred_commit_delay
        self._commit_timer: Any = None  # a loop timer, made on the hub at the first deferral
        self._closed = False
        self._connection = self._open(path)
        self.tenants: dict[str, dict[str, Any]] = {}
        self.namespaces: dict[str, dict[str, Any]] = {}
        self.topics: dict[str, TopicMeta] = {}
        try:
            self._migrate()
            self._load()
        except BaseException:
            self._connection.close()
            raise
        self._ensure_defaults()

    @classmethod
    def in_directory(cls, data_dir: str, *, cluster: str = "standalone") -> MetadataStore:
        """The store kept beside a disk broker's topics."""
        os.makedirs(data_dir, exist_ok=True)
        return cls(os.path.join(data_dir, FILE_NAME), cluster=cluster)

    # Opening.

    def _where(self) -> str:
        return f"metadata store {self.path}" if self.path else "in-memory metadata store"

    def _open(self, path: str | None) -> sqlite3.Connection:
        try:
            connection = sqlite3.connect(
                path or ":memory:", isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as error:
            raise MetadataError(f"{self._where()} cannot be opened: {error}") from error
        try:
            connection.execute("PRAGMA foreign_keys = ON")
            if path is not None:
                connection.execute("PRAGMA journal_mode = WAL")
                connection.execute("PRAGMA synchronous = FULL")
                check = connection.execute("PRAGMA quick_check").fetchone()
                if check is None or check[0] != "ok":
                    raise MetadataError(
                        f"{self._where()} is corrupt ({check[0] if check else 'no answer'}); "
                        "restore it from a backup or move it away to start afresh"
                    )
        except sqlite3.DatabaseError as error:
            connection.close()
            raise MetadataError(
                f"{self._where()} is corrupt or not an SQLite database ({error}); restore it "
                "from a backup or move it away to start afresh"
            ) from error
        except BaseException:
            connection.close()
            raise
        return connection

    def _migrate(self) -> None:
        connection = self._connection
        try:
            app_id = connection.execute("PRAGMA application_id").fetchone()[0]
            version = connection.execute("PRAGMA user_version").fetchone()[0]
            tables = connection.execute(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table'"
            ).fetchone()[0]
        except sqlite3.DatabaseError as error:
            raise MetadataError(f"{self._where()} is unreadable: {error}") from error
        if app_id != APPLICATION_ID and (app_id != 0 or tables):
            raise MetadataError(
                f"{self._where()} is not a brokerlet metadata database "
                f"(application_id {app_id:#x}, {tables} table(s))"
            )
        if version > len(MIGRATIONS):
            raise MetadataError(
                f"{self._where()} has schema version {version}, written by a newer brokerlet; "
                f"this one knows versions up to {len(MIGRATIONS)}"
            )
        for migration in MIGRATIONS[version:]:
            try:
                connection.execute("BEGIN IMMEDIATE")
                migration.apply(connection)
                connection.execute(f"PRAGMA user_version = {migration.version}")
                connection.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                connection.execute("COMMIT")
            except sqlite3.Error as error:
                connection.execute("ROLLBACK")
                raise MetadataError(
                    f"{self._where()}: migration {migration.version} "
                    f"({migration.description}) failed: {error}"
                ) from error
            log.info(
                "metadata schema now at version %d: %s", migration.version, migration.description
            )

    def _load(self) -> None:
        try:
            for name, info in self._connection.execute("SELECT name, info FROM tenants"):
                self.tenants[name] = _document(info, dict)
            for name, policies in self._connection.execute("SELECT name, policies FROM namespaces"):
                self.namespaces[name] = _document(policies, dict)
            for name, namespace, partitions, properties in self._connection.execute(
                "SELECT name, namespace, partitions, properties FROM topics"
            ):
                self.topics[name] = TopicMeta(
                    name, namespace, int(partitions), _document(properties, dict)
                )
        except (sqlite3.DatabaseError, ValueError) as error:
            raise MetadataError(f"{self._where()} holds unreadable metadata: {error}") from error

    def _ensure_defaults(self) -> None:
        # As Pulsar standalone does at every start: public and public/default exist.
        if DEFAULT_TENANT not in self.tenants:
            info = {"adminRoles": [], "allowedClusters": [self.cluster]}
            self.create_tenant(DEFAULT_TENANT, info)
        if DEFAULT_NAMESPACE not in self.namespaces:
            self.create_namespace(DEFAULT_NAMESPACE, {})

    def close(self) -> None:
        self._closed = True
        if self._commit_timer is not None:
            self._commit_timer.close()  # the commit below takes its place
        with self._lock:
            if self._deferred:
                self._transact(lambda _connection: None)
            self._connection.close()

    # The generic API, for tables of other areas.

    def read(self, query: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``query(connection)`` for reading; no fsync, so it runs on the caller."""
        with self._lock:
            return query(self._connection)

    def write(self, change: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``change(connection)`` as one transaction; rolled back if it raises.

        Writers are serialised; on disk the transaction runs on the hub's thread pool. The
        caller's greenlet waits for the commit (other greenlets keep running).
        """
        with self._lock:
            return self._transact(change)

    def _transact(self, change: Callable[[sqlite3.Connection], T]) -> T:
        connection = self._connection

        deferred, self._deferred = self._deferred, []

        def run() -> T:
            connection.execute("BEGIN IMMEDIATE")
            try:
                for earlier in deferred:
                    earlier(connection)
                result = change(connection)
            except BaseException:
                connection.execute("ROLLBACK")
                self._deferred[:0] = deferred  # they were not refused: keep them for the next
                raise
            connection.execute("COMMIT")
            return result

        if self._offload:
            result: T = gevent.get_hub().threadpool.apply(run)
            return result
        return run()

    def _defer(self, change: Callable[[sqlite3.Connection], object]) -> None:
        """Commit ``change`` within the deferred commit delay, on a greenlet of its own,
        without making the caller wait; a waited write or `close` commits it first."""
        if not self._offload:
            self._transact(change)  # in memory: no fsync to wait for
            return
        self._deferred.append(change)
        self._schedule_commit()

    def _schedule_commit(self) -> None:
        if self._flushing is not None or self._closed:
            return  # a running commit schedules the next one when it ends
        if self._commit_timer is None:
            self._commit_timer = gevent.get_hub().loop.timer(self._deferred_commit_delay)
        if not self._commit_timer.active:
            self._commit_timer.start(self._start_commit)

    def _start_commit(self) -> None:
        self._flushing = gevent.spawn(self._flush)

    def _flush(self) -> None:
        try:
            with self._lock:
                if self._deferred:
                    self._transact(lambda _connection: None)
        except sqlite3.Error:
            log.exception("metadata: a deferred commit failed; it is retried")
        finally:
            self._flushing = None
        if self._deferred:  # deferred while this commit ran, or it failed
            self._schedule_commit()

    # Tenants.

    def create_tenant(self, name: str, info: Mapping[str, Any]) -> None:
        with self._lock:
            if name in self.tenants:
                raise AlreadyExists("Tenant already exist")
            document = dict(info)
            self._transact(
                lambda c: c.execute("INSERT INTO tenants VALUES (?, ?)", (name, _text(document)))
            )
            self.tenants[name] = document

    def update_tenant(self, name: str, info: Mapping[str, Any]) -> None:
        with self._lock:
            if name not in self.tenants:
                raise NotFound("Tenant does not exist")
            document = dict(info)
            self._transact(
                lambda c: c.execute(
                    "UPDATE tenants SET info = ? WHERE name = ?", (_text(document), name)
                )
            )
            self.tenants[name] = document

    def delete_tenant(self, name: str) -> None:
        with self._lock:
            if name not in self.tenants:
                raise NotFound("Tenant does not exist")
            if any(ns.split("/", 1)[0] == name for ns in self.namespaces):
                raise NotEmpty("The tenant still has active namespaces")
            self._transact(lambda c: c.execute("DELETE FROM tenants WHERE name = ?", (name,)))
            del self.tenants[name]

    # Namespaces.

    def namespaces_of(self, tenant: str) -> list[str]:
        prefix = tenant + "/"
        return sorted(ns for ns in self.namespaces if ns.startswith(prefix))

    def create_namespace(self, name: str, policies: Mapping[str, Any]) -> None:
        tenant = name.split("/", 1)[0]
        with self._lock:
            if tenant not in self.tenants:
                raise NotFound("Tenant does not exist")
            if name in self.namespaces:
                raise AlreadyExists("Namespace already exists")
            document = dict(policies)
            self._transact(
                lambda c: c.execute(
                    "INSERT INTO namespaces VALUES (?, ?, ?)", (name, tenant, _text(document))
                )
            )
            self.namespaces[name] = document

    def update_policies(
        self, name: str, change: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> dict[str, Any]:
        """Replace a namespace's policies by ``change(copy of them)``, atomically.

        ``change`` may raise to refuse (nothing is written); it runs under the store's lock,
        so it sees the latest policies.
        """
        with self._lock:
            current = self.namespaces.get(name)
            if current is None:
                raise NotFound("Namespace does not exist")
            document = change(json.loads(_text(current)))
            self._transact(
                lambda c: c.execute(
                    "UPDATE namespaces SET policies = ? WHERE name = ?", (_text(document), name)
                )
            )
            self.namespaces[name] = document
            return document

    def delete_namespace(self, name: str) -> None:
        with self._lock:
            if name not in self.namespaces:
                raise NotFound("Namespace does not exist")
            if any(topic.namespace == name for topic in self.topics.values()):
                raise NotEmpty("Cannot delete non empty namespace")
            self._transact(lambda c: c.execute("DELETE FROM namespaces WHERE name = ?", (name,)))
            del self.namespaces[name]

    # Topics.

    def topics_of(self, namespace: str) -> list[TopicMeta]:
        return sorted(
            (t for t in self.topics.values() if t.namespace == namespace), key=lambda t: t.name
        )

    def create_topic(
        self,
        name: str,
        namespace: str,
        partitions: int,
        properties: Mapping[str, str] | None = None,
        *,
        exist_ok: bool = False,
        wait: bool = True,
    ) -> TopicMeta:
        """Record a topic (``partitions`` 0: non-partitioned); returns what is stored.

        With ``exist_ok`` an existing topic is returned as it is (auto-creation racing an
        explicit creation), otherwise :class:`AlreadyExists`. Without ``wait`` the commit
        follows within `DEFERRED_COMMIT_DELAY`, on a greenlet of its own (auto-creation: a
        topic that stored anything is found in storage and recorded again at start-up, so the
        fsync need not delay it).
        """
        if not wait:
            # Nothing below yields without wait, so it needs no lock (holding it would make
            # this wait for the commit of the previous deferred change).
            return self._record_topic(name, namespace, partitions, properties, exist_ok=exist_ok)
        with self._lock:
            return self._record_topic(
                name, namespace, partitions, properties, exist_ok=exist_ok, wait=True
            )

    def _record_topic(
        self,
        name: str,
        namespace: str,
        partitions: int,
        properties: Mapping[str, str] | None,
        *,
        exist_ok: bool,
        wait: bool = False,
    ) -> TopicMeta:
        existing = self.topics.get(name)
        if existing is not None:
            if exist_ok:
                return existing
            raise AlreadyExists("This topic already exists")
        if namespace not in self.namespaces:
            raise NotFound("Namespace does not exist")
        topic = TopicMeta(name, namespace, partitions, dict(properties or {}))
        row = (name, namespace, partitions, _text(topic.properties))

        def insert(connection: sqlite3.Connection) -> object:
            return connection.execute("INSERT INTO topics VALUES (?, ?, ?, ?)", row)

        if wait:
            self._transact(insert)
        else:
            self._defer(insert)
        self.topics[name] = topic
        return topic

    def update_partitions(self, name: str, partitions: int) -> TopicMeta:
        """Set a partitioned topic's partition count (the caller checks it may grow)."""
        with self._lock:
            existing = self.topics.get(name)
            if existing is None or existing.partitions == 0:
                raise NotFound("Partitioned topic does not exist")
            topic = TopicMeta(name, existing.namespace, partitions, existing.properties)
            self._transact(
                lambda c: c.execute(
                    "UPDATE topics SET partitions = ? WHERE name = ?", (partitions, name)
                )
            )
            self.topics[name] = topic
            return topic

    def delete_topic(self, name: str) -> TopicMeta:
        """Forget a topic's metadata; returns what was stored."""
        with self._lock:
            existing = self.topics.get(name)
            if existing is None:
                raise NotFound("Topic not found")
            self._transact(lambda c: c.execute("DELETE FROM topics WHERE name = ?", (name,)))
            del self.topics[name]
            return existing


# One encoder for every record: json.dumps with options builds a new JSONEncoder per call.
_text = json.JSONEncoder(separators=(",", ":"), sort_keys=True).encode


def _document(text: str, kind: type[T]) -> T:
    value = json.loads(text)
    if not isinstance(value, kind):
        raise ValueError(f"expected a JSON {kind.__name__}, got {text[:60]!r}")
    return value
