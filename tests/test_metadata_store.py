"""The metadata store: defaults, persistence, atomic changes, refusing bad files."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import gevent
import pytest

from brokerlet.metadata import AlreadyExists, MetadataError, MetadataStore, NotEmpty, NotFound
from brokerlet.metadata.schema import MIGRATIONS
from brokerlet.metadata.store import FILE_NAME
from brokerlet.storage._worker import real_lock
from brokerlet.testing.waiting import wait_until

WAIT = 10.0  # seconds a test waits for what must happen


def test_public_and_public_default_exist_at_start() -> None:
    store = MetadataStore(None)

    assert store.tenants["public"] == {"adminRoles": [], "allowedClusters": ["standalone"]}
    assert store.namespaces_of("public") == ["public/default"]


def test_the_cluster_name_is_the_default_tenants_cluster() -> None:
    store = MetadataStore(None, cluster="east")

    assert store.tenants["public"]["allowedClusters"] == ["east"]


def test_everything_survives_reopening_the_file(tmp_path: Path) -> None:
    store = MetadataStore.in_directory(str(tmp_path))
    store.create_tenant("acme", {"adminRoles": ["ops"], "allowedClusters": ["standalone"]})
    store.create_namespace("acme/billing", {"message_ttl_in_seconds": 60})
    store.create_topic("persistent://acme/billing/invoices", "acme/billing", 4, {"k": "v"})
    store.update_partitions("persistent://acme/billing/invoices", 6)
    store.close()

    reopened = MetadataStore.in_directory(str(tmp_path))

    assert reopened.tenants["acme"]["adminRoles"] == ["ops"]
    assert reopened.namespaces["acme/billing"] == {"message_ttl_in_seconds": 60}
    topic = reopened.topics["persistent://acme/billing/invoices"]
    assert (topic.partitions, dict(topic.properties)) == (6, {"k": "v"})


def test_deleting_the_default_namespace_lasts_only_until_restart(tmp_path: Path) -> None:
    # Pulsar standalone recreates public/default at every start; so do we.
    store = MetadataStore.in_directory(str(tmp_path))
    store.delete_namespace("public/default")
    store.close()

    assert "public/default" in MetadataStore.in_directory(str(tmp_path)).namespaces


def test_a_refused_change_writes_nothing(tmp_path: Path) -> None:
    store = MetadataStore.in_directory(str(tmp_path))

    def refuse(policies: dict[str, object]) -> dict[str, object]:
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        store.update_policies("public/default", refuse)
    with pytest.raises(AlreadyExists):
        store.create_tenant("public", {})
    with pytest.raises(NotFound):
        store.create_namespace("ghost/ns", {})
    store.close()

    reopened = MetadataStore.in_directory(str(tmp_path))
    assert reopened.namespaces["public/default"] == {}
    assert "ghost" not in reopened.tenants


def test_a_failing_transaction_is_rolled_back(tmp_path: Path) -> None:
    store = MetadataStore.in_directory(str(tmp_path))

    def half(connection: sqlite3.Connection) -> None:
        connection.execute("INSERT INTO tenants VALUES ('half', '{}')")
        raise RuntimeError("crash in the middle")

    with pytest.raises(RuntimeError):
        store.write(half)

    assert store.read(lambda c: c.execute("SELECT name FROM tenants").fetchall()) == [("public",)]


def test_non_empty_tenants_and_namespaces_are_not_deleted() -> None:
    store = MetadataStore(None)
    store.create_topic("persistent://public/default/t", "public/default", 0)

    with pytest.raises(NotEmpty):
        store.delete_tenant("public")
    with pytest.raises(NotEmpty):
        store.delete_namespace("public/default")


def test_disk_writes_run_on_the_thread_pool_not_the_event_loop(tmp_path: Path) -> None:
    store = MetadataStore.in_directory(str(tmp_path))
    hub_free = real_lock()  # a real lock: it blocks the pool's thread, as an fsync would
    hub_free.acquire()
    other = gevent.spawn(hub_free.release)  # runs only if the hub is free during the write

    def slow(connection: sqlite3.Connection) -> None:
        assert hub_free.acquire(True, WAIT), "the hub was blocked while the transaction ran"
        connection.execute("INSERT INTO tenants VALUES ('slow', '{}')")

    store.write(slow)
    assert other.dead


def _stored_topics(tmp_path: Path) -> list[str]:
    with sqlite3.connect(tmp_path / FILE_NAME) as other:
        return [name for (name,) in other.execute("SELECT name FROM topics ORDER BY name")]


def test_an_auto_created_topic_is_committed_without_the_creator_waiting(tmp_path: Path) -> None:
    # Auto-creation on a first PRODUCER must not put a metadata fsync on the client's path;
    # the row follows on a greenlet of its own, in order with every later change.
    store = MetadataStore(str(tmp_path / FILE_NAME), deferred_commit_delay=0.05)
    others_ran: list[int] = []
    gevent.spawn(others_ran.append, 1)  # runs only if the creator yields to the hub
    store.create_topic("persistent://public/default/a", "public/default", 0, wait=False)
    assert others_ran == [], "the creator waited for the commit"
    assert "persistent://public/default/a" in store.topics
    assert _stored_topics(tmp_path) == []

    stored = wait_until(lambda: _stored_topics(tmp_path), message="the deferred commit")
    assert stored == ["persistent://public/default/a"]

    # A change made before the deferred commit ran goes after it, in the same transaction.
    store.create_topic("persistent://public/default/b", "public/default", 0, wait=False)
    store.delete_topic("persistent://public/default/b")
    store.create_topic("persistent://public/default/c", "public/default", 0, wait=False)
    store.close()  # commits what is still deferred
    assert _stored_topics(tmp_path) == [
        "persistent://public/default/a",
        "persistent://public/default/c",
    ]


def test_topics_auto_created_within_the_delay_share_one_commit(tmp_path: Path) -> None:
    # Each commit fsyncs: one per auto-created topic would land on the requests that follow
    # each creation (a test suite's subscribe and sends).
    store = MetadataStore(str(tmp_path / FILE_NAME), deferred_commit_delay=0.5)
    commits: list[str] = []
    store._connection.set_trace_callback(
        lambda statement: commits.append(statement) if statement == "COMMIT" else None
    )
    names = [f"persistent://public/default/t{index}" for index in range(5)]
    for name in names:
        store.create_topic(name, "public/default", 0, wait=False)
        gevent.idle()  # the hub runs between creations, as between a test suite's requests
    assert _stored_topics(tmp_path) == []
    assert wait_until(lambda: _stored_topics(tmp_path), message="the deferred commit") == names
    assert commits == ["COMMIT"]
    # A waited change commits what is deferred first, without waiting for the delay.
    store.create_topic("persistent://public/default/later", "public/default", 0, wait=False)
    store.create_tenant("waited", {})
    assert "persistent://public/default/later" in _stored_topics(tmp_path)
    assert commits == ["COMMIT", "COMMIT"]
    store.close()


def test_a_corrupt_file_stops_start_up_with_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / FILE_NAME).write_bytes(b"this is not sqlite" * 100)

    with pytest.raises(MetadataError, match=r"corrupt or not an SQLite database"):
        MetadataStore.in_directory(str(tmp_path))


def test_a_foreign_sqlite_file_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE other (x)")

    with pytest.raises(MetadataError, match="not a brokerlet metadata database"):
        MetadataStore.in_directory(str(tmp_path))
    with sqlite3.connect(path) as connection:
        tables = connection.execute("SELECT name FROM sqlite_master").fetchall()
    assert tables == [("other",)]


def test_a_newer_schema_version_is_refused(tmp_path: Path) -> None:
    MetadataStore.in_directory(str(tmp_path)).close()
    with sqlite3.connect(tmp_path / FILE_NAME) as connection:
        connection.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")

    with pytest.raises(MetadataError, match="written by a newer brokerlet"):
        MetadataStore.in_directory(str(tmp_path))


def test_an_unreadable_row_is_refused(tmp_path: Path) -> None:
    MetadataStore.in_directory(str(tmp_path)).close()
    with sqlite3.connect(tmp_path / FILE_NAME) as connection:
        connection.execute("UPDATE tenants SET info = '{broken' WHERE name = 'public'")

    with pytest.raises(MetadataError, match="unreadable metadata"):
        MetadataStore.in_directory(str(tmp_path))
