"""Topic deletion (with and without force), GET_TOPICS_OF_NAMESPACE on the wire, metadata
surviving a restart of ``brokerlet serve``, and concurrent create/delete staying consistent.

Deletion follows ``PersistentTopicsBase#internalDeleteTopic``: without ``force`` a topic with
connected producers or consumers is refused (412 ``Topic has active
producers/subscriptions``); with it the broker closes them first (CLOSE_PRODUCER /
CLOSE_CONSUMER), and clients reconnect.
"""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import gevent
import gevent.event
import gevent.socket
import pulsar
import pytest
import requests

from brokerlet import Broker, Client
from brokerlet.actors.broker import BrokerActor
from brokerlet.metadata import TopicName
from brokerlet.metadata.topics import exists
from brokerlet.testing.process import BrokerletProcess
from brokerlet.testing.rawclient import RawClient
from brokerlet.testing.waiting import wait_until
from brokerlet.transport.protocol import pb
from tests.producer_frames import raw_producer

T = pb.BaseCommand
_names = itertools.count()


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    with Broker(port=0) as running:
        yield running


@pytest.fixture
def web(broker: Broker) -> str:
    assert broker.web_service_url is not None
    return broker.web_service_url


def local_name() -> str:
    return f"public/default/life-{next(_names)}"


def test_delete_without_force_refuses_a_topic_with_a_producer(broker: Broker, web: str) -> None:
    local = local_name()
    raw = RawClient(broker.address)
    try:
        raw.handshake()
        raw.create_producer(f"persistent://{local}", 1)

        reply = requests.delete(f"{web}/admin/v2/persistent/{local}", timeout=10)

        assert reply.status_code == 412
        assert reply.json() == {"reason": "Topic has active producers/subscriptions"}
        raw.produce(1, 0, b"still there")  # untouched
    finally:
        raw.close()


def test_delete_with_force_closes_producers_and_consumers_first(broker: Broker, web: str) -> None:
    local = local_name()
    topic = f"persistent://{local}"
    raw = RawClient(broker.address)
    try:
        raw.handshake()
        raw.create_producer(topic, 1)
        raw.subscribe(topic, "sub", 7)
        raw.produce(1, 0, b"gone soon")

        reply = requests.delete(f"{web}/admin/v2/persistent/{local}?force=true", timeout=10)

        assert reply.status_code == 204
        frames = [raw.recv_frame().command for _ in range(2)]
        closed = {
            (
                c.type,
                c.close_producer.producer_id
                if c.type == T.CLOSE_PRODUCER
                else c.close_consumer.consumer_id,
            )
            for c in frames
        }
        assert closed == {(T.CLOSE_PRODUCER, 1), (T.CLOSE_CONSUMER, 7)}
        assert broker.topic_stats(topic) is None
        assert (
            topic
            not in requests.get(f"{web}/admin/v2/persistent/public/default", timeout=10).json()
        )
    finally:
        raw.close()


def test_official_clients_reconnect_after_a_forced_delete(broker: Broker, web: str) -> None:
    local = local_name()
    topic = f"persistent://{local}"
    client = pulsar.Client(broker.service_url, operation_timeout_seconds=5)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        consumer = client.subscribe(topic, "sub")
        producer.send(b"before")
        assert consumer.receive(5000).data() == b"before"

        assert requests.delete(f"{web}/admin/v2/persistent/{local}?force=true", timeout=10).ok

        # Both reconnect; auto-creation brings the (new, empty) topic back.
        def resent() -> bytes | None:
            producer.send(b"after")
            try:
                return bytes(consumer.receive(500).data())
            except pulsar.Timeout:
                return None

        received = wait_until(resent, message="a message through the recreated topic", timeout=15)
        assert received == b"after"
    finally:
        client.close()


def test_deleting_a_partitioned_topic_with_consumers(broker: Broker, web: str) -> None:
    local = local_name()
    topic = f"persistent://{local}"
    assert requests.put(f"{web}/admin/v2/persistent/{local}/partitions", json=2, timeout=10).ok
    raw = RawClient(broker.address)
    try:
        raw.handshake()
        raw.subscribe(f"{topic}-partition-1", "sub", 3)

        refused = requests.delete(f"{web}/admin/v2/persistent/{local}/partitions", timeout=10)
        forced = requests.delete(
            f"{web}/admin/v2/persistent/{local}/partitions?force=true", timeout=10
        )

        assert refused.status_code == 412
        assert forced.status_code == 204
        assert raw.expect(T.CLOSE_CONSUMER).close_consumer.consumer_id == 3
        meta = requests.get(f"{web}/admin/v2/persistent/{local}/partitions", timeout=10).json()
        assert meta["partitions"] == 0
    finally:
        raw.close()


# GET_TOPICS_OF_NAMESPACE on the wire.


def get_topics(
    raw: RawClient, mode: int, pattern: str = "", topics_hash: str | None = None
) -> pb.CommandGetTopicsOfNamespaceResponse:
    request = pb.CommandGetTopicsOfNamespace(request_id=99, namespace="public/listing", mode=mode)  # type: ignore[arg-type]
    if pattern:
        request.topics_pattern = pattern
    if topics_hash is not None:
        request.topics_hash = topics_hash
    raw.send_command(T(type=T.GET_TOPICS_OF_NAMESPACE, get_topics_of_namespace=request))
    return raw.expect(T.GET_TOPICS_OF_NAMESPACE_RESPONSE).get_topics_of_namespace_response


def test_get_topics_of_namespace_by_mode_pattern_and_hash(broker: Broker, web: str) -> None:
    requests.put(f"{web}/admin/v2/namespaces/public/listing", timeout=10)
    requests.put(f"{web}/admin/v2/persistent/public/listing/alpha", timeout=10)
    requests.put(f"{web}/admin/v2/persistent/public/listing/beta/partitions", json=2, timeout=10)
    requests.put(f"{web}/admin/v2/non-persistent/public/listing/gamma", timeout=10)
    mode = pb.CommandGetTopicsOfNamespace
    raw = RawClient(broker.address)
    try:
        raw.handshake()
        persistent = get_topics(raw, mode.PERSISTENT)
        volatile = get_topics(raw, mode.NON_PERSISTENT)
        every = get_topics(raw, mode.ALL)
        filtered = get_topics(raw, mode.ALL, pattern="persistent://public/listing/b.*")
        same = get_topics(raw, mode.PERSISTENT, topics_hash=persistent.topics_hash)
    finally:
        raw.close()

    assert list(persistent.topics) == [
        "persistent://public/listing/alpha",
        "persistent://public/listing/beta-partition-0",
        "persistent://public/listing/beta-partition-1",
    ]
    assert not persistent.filtered
    assert list(volatile.topics) == ["non-persistent://public/listing/gamma"]
    assert len(every.topics) == 4
    assert filtered.filtered
    assert list(filtered.topics) == [
        "persistent://public/listing/beta-partition-0",
        "persistent://public/listing/beta-partition-1",
    ]
    assert (same.changed, list(same.topics)) == (False, [])


def test_partitioned_metadata_and_lookup_refusals_on_the_wire(broker: Broker) -> None:
    raw = RawClient(broker.address)
    try:
        raw.handshake()
        raw.send_command(
            T(
                type=T.PARTITIONED_METADATA,
                partitioned_metadata=pb.CommandPartitionedTopicMetadata(
                    topic="persistent://ghost/ns/t", request_id=1
                ),
            )
        )
        metadata = raw.expect(T.PARTITIONED_METADATA_RESPONSE).partitioned_metadata_response
        raw.send_command(
            T(
                type=T.LOOKUP,
                lookup=pb.CommandLookupTopic(topic="persistent://ghost/ns/t", request_id=2),
            )
        )
        lookup = raw.expect(T.LOOKUP_RESPONSE).lookup_response
        raw.send_command(
            T(
                type=T.LOOKUP,
                lookup=pb.CommandLookupTopic(
                    topic="persistent://public/default/t",
                    request_id=3,
                    advertised_listener_name="nope",
                ),
            )
        )
        listener = raw.expect(T.LOOKUP_RESPONSE).lookup_response
    finally:
        raw.close()

    assert (metadata.response, metadata.error) == (metadata.Failed, pb.TopicNotFound)
    # TopicLookupBase: a namespace without policies fails the lookup with MetadataError.
    assert (lookup.response, lookup.error) == (lookup.Failed, pb.MetadataError)
    assert (listener.response, listener.error) == (listener.Failed, pb.ServiceNotReady)
    assert listener.message == "the broker do not have nope listener"


class _Hold:
    """Keeps the broker actor busy until the test lets it go."""


def _holds(monkeypatch: pytest.MonkeyPatch) -> list[gevent.event.Event]:
    """Make the broker actor wait on a _Hold it is told: the events to set, one per hold."""
    holding: list[gevent.event.Event] = []
    handle = BrokerActor.on_receive

    def on_receive(actor: BrokerActor, message: object) -> object:
        if isinstance(message, _Hold):
            released = gevent.event.Event()
            holding.append(released)
            released.wait(30)
            return None
        return handle(actor, message)

    monkeypatch.setattr(BrokerActor, "on_receive", on_receive)
    return holding


def test_lookups_are_answered_while_the_broker_actor_is_busy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # PARTITIONED_METADATA and LOOKUP read the metadata store on the connection: a slow
    # topic operation (a creation on a slow disk, a forced delete) does not hold them up.
    # Only the broker actor changes which topics exist, so a lookup that auto-creates a
    # partitioned topic still goes through it.
    holding = _holds(monkeypatch)
    with Broker(port=0) as broker, RawClient(broker.address) as raw:
        raw.handshake()
        broker._call(lambda ref: ref.tell(_Hold()))
        wait_until(lambda: holding, message="the broker actor never took the hold", timeout=10)
        try:
            raw.send_command(
                T(
                    type=T.PARTITIONED_METADATA,
                    partitioned_metadata=pb.CommandPartitionedTopicMetadata(
                        topic="persistent://public/default/busy", request_id=1
                    ),
                )
            )
            metadata = raw.expect(T.PARTITIONED_METADATA_RESPONSE, timeout=10)
            raw.send_command(
                T(
                    type=T.LOOKUP,
                    lookup=pb.CommandLookupTopic(
                        topic="persistent://public/default/busy", request_id=2
                    ),
                )
            )
            lookup = raw.expect(T.LOOKUP_RESPONSE, timeout=10)
        finally:
            broker._hub.loop.run_callback_threadsafe(holding[0].set)
    response = metadata.partitioned_metadata_response
    assert (response.response, response.partitions) == (response.Success, 0)
    assert lookup.lookup_response.response == lookup.lookup_response.Connect


def test_an_open_topic_is_used_while_the_broker_actor_is_busy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A PRODUCER or SUBSCRIBE on a topic that is open takes it from the broker actor's topic
    # map, which the connections read (actors/connection.py, _topic): only creating,
    # reopening or refusing a topic asks that actor. The connection is made before any topic
    # is open, so it must read the live map, not a copy of it.
    holding = _holds(monkeypatch)
    topic = "persistent://public/default/open-while-busy"
    with Broker(port=0) as broker, RawClient(broker.address) as raw:
        raw.handshake()
        assert raw_producer(raw, topic, 1, "first").type == T.PRODUCER_SUCCESS  # creates it
        broker._call(lambda ref: ref.tell(_Hold()))
        wait_until(lambda: holding, message="the broker actor never took the hold", timeout=10)
        try:
            second = raw_producer(raw, topic, 2, "second")
            raw.send_command(raw.subscribe_command(topic, "s", 1, request_id=7))
            subscribed = raw.expect(T.SUCCESS, timeout=10)
        finally:
            broker._hub.loop.run_callback_threadsafe(holding[0].set)
    assert second.type == T.PRODUCER_SUCCESS
    assert subscribed.success.request_id == 7


# Restart.


def _serve(data_dir: Path) -> BrokerletProcess:
    broker = BrokerletProcess(web_service=True, data_dir=data_dir)
    broker.stop_signal = signal.SIGTERM  # as a service manager stops it
    return broker


def _stop(broker: BrokerletProcess) -> None:
    assert broker.stop(15) == 0, broker.log_tail()  # a clean exit


def test_metadata_survives_a_restart_of_brokerlet_serve(tmp_path: Path) -> None:
    with _serve(tmp_path) as first:
        web = first.start().stats_url
        assert requests.put(f"{web}/admin/v2/tenants/acme", json={}, timeout=10).status_code == 204
        assert requests.put(f"{web}/admin/v2/namespaces/acme/app", timeout=10).status_code == 204
        requests.post(f"{web}/admin/v2/namespaces/acme/app/messageTTL", json=90, timeout=10)
        put = requests.put(
            f"{web}/admin/v2/persistent/acme/app/jobs/partitions", json=3, timeout=10
        )
        assert put.status_code == 204
        _stop(first)

    with _serve(tmp_path) as second:
        web = second.start().stats_url
        assert "acme" in requests.get(f"{web}/admin/v2/tenants", timeout=10).json()
        ttl = requests.get(f"{web}/admin/v2/namespaces/acme/app/messageTTL", timeout=10).json()
        partitions = requests.get(
            f"{web}/admin/v2/persistent/acme/app/jobs/partitions", timeout=10
        ).json()
        _stop(second)

    assert ttl == 90
    assert partitions["partitions"] == 3


def test_a_corrupt_metadata_file_stops_brokerlet_serve(tmp_path: Path) -> None:
    with _serve(tmp_path) as first:
        first.start()
        _stop(first)
    (tmp_path / "metadata.db").write_bytes(b"garbage" * 1000)
    for extra in ("metadata.db-wal", "metadata.db-shm"):
        (tmp_path / extra).unlink(missing_ok=True)

    with _serve(tmp_path) as second:
        with pytest.raises(RuntimeError, match="did not become ready"):
            second.start(timeout=20)
        exit_code = second.stop()
        output = second.log_tail()

    assert exit_code != 0
    assert "brokerlet: cannot use the metadata store" in output
    assert "corrupt" in output


def test_disk_topics_and_their_metadata_are_deleted_together(tmp_path: Path) -> None:
    with Broker(port=0, storage="disk", data_dir=str(tmp_path)) as disk:
        web = disk.web_service_url
        client = pulsar.Client(disk.service_url, operation_timeout_seconds=5)
        try:
            client.create_producer("persistent://public/default/kept").send(b"x")
        finally:
            client.close()
        assert requests.delete(f"{web}/admin/v2/persistent/public/default/kept", timeout=10).ok
    with Broker(port=0, storage="disk", data_dir=str(tmp_path)) as again:
        listed = requests.get(
            f"{again.web_service_url}/admin/v2/persistent/public/default", timeout=10
        )
        assert listed.json() == []
        assert again.stats() == {}


# Concurrency.


def _http(address: tuple[str, int], method: str, path: str) -> int:
    """One HTTP/1.0 request over a gevent socket (the test's greenlets must not block the hub);
    returns the status. The admin server closes every connection after its answer."""
    sock = gevent.socket.create_connection(address, timeout=10)
    try:
        sock.sendall(f"{method} {path} HTTP/1.0\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    finally:
        sock.close()
    return int(answer.split(b" ", 2)[1])


def test_concurrent_create_and_delete_over_http_and_the_protocol_stay_consistent(
    broker: Broker, web: str
) -> None:
    """Many greenlets create, use and delete the same few topics at once, over both paths.

    Afterwards the listing is exactly the metadata and every live topic has metadata: the
    broker actor serialises the two paths.
    """
    address = (web.split("//")[1].split(":", maxsplit=1)[0], int(web.rsplit(":", 1)[1]))
    topics = [f"public/default/race-{next(_names)}" for _ in range(3)]
    statuses: list[int] = []
    client = Client(broker.service_url, operation_timeout_seconds=10)

    def http_worker(seed: int) -> None:
        for i in range(10):
            path = f"/admin/v2/persistent/{topics[(seed + i) % len(topics)]}"
            if (seed + i) % 2:
                statuses.append(_http(address, "PUT", path))
            else:
                statuses.append(_http(address, "DELETE", f"{path}?force=true"))

    def protocol_worker(seed: int) -> None:
        for i in range(8):
            local = topics[(seed + i) % len(topics)]
            try:
                producer = client.create_producer(f"persistent://{local}")
                producer.close()
            except Exception:  # closed or refused by a concurrent forced delete: allowed
                continue

    workers = [gevent.spawn(http_worker, n) for n in range(20)]
    workers += [gevent.spawn(protocol_worker, n) for n in range(10)]
    try:
        gevent.joinall(workers, timeout=45, raise_error=True)
        assert all(w.dead for w in workers), "a worker hung"
    finally:
        client.close()

    assert set(statuses) <= {204, 404, 409}, statuses
    listed = set(requests.get(f"{web}/admin/v2/persistent/public/default", timeout=10).json())
    live = set(broker.stats())
    store = broker.metadata
    assert store is not None
    for local in topics:
        name = f"persistent://{local}"
        in_store = exists(store, TopicName.parse(name))
        assert (name in listed) == in_store, name
        if name in live:
            assert in_store, f"{name} is served but has no metadata"


def test_a_bad_listener_setting_stops_brokerlet_serve_with_the_key(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "brokerlet",
            "serve",
            "--port",
            "0",
            "--data-dir",
            str(tmp_path),
            "--advertised-listeners",
            "oops",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )

    assert done.returncode == 2
    assert "brokerlet: bad setting: advertised_listeners = 'oops'" in done.stderr
