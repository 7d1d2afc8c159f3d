"""Topic operations as Pulsar's admin API does them, with the official client and plain HTTP.

Terminate, unload, delete (with and without force), skip, reset cursor by time and by id,
expire, peek, examine, subscription management and stats; non-persistent topics' drop rule.
Behaviour follows apache/pulsar PersistentTopicsBase (REST), PersistentTopic#terminate /
#delete, PersistentSubscription (skip, resetCursor, peekNthMessage), the
PersistentMessageExpiryMonitor, and NonPersistentTopic / NonPersistentDispatcher*.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pulsar
import pytest
import requests

from brokerlet import Broker
from brokerlet.admin.rest import AdminApp, AdminContext
from brokerlet.admin.routes import all_routes
from brokerlet.testing.rawclient import RawClient
from brokerlet.testing.waiting import wait_until
from brokerlet.topicops import TopicOpError
from brokerlet.transport.protocol import PROTOCOL_VERSION, pb

T = pb.BaseCommand
HTTP_TIMEOUT = 10


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    with Broker(port=0) as running:
        yield running


def url(broker: Broker, topic: str, path: str = "") -> str:
    domain, rest = topic.split("://")
    return f"{broker.web_service_url}/admin/v2/{domain}/{rest}{path}"


def get(broker: Broker, topic: str, path: str) -> requests.Response:
    return requests.get(url(broker, topic, path), timeout=HTTP_TIMEOUT)


def post(broker: Broker, topic: str, path: str, **kwargs: Any) -> requests.Response:
    return requests.post(url(broker, topic, path), timeout=HTTP_TIMEOUT, **kwargs)


def put(broker: Broker, topic: str, path: str, **kwargs: Any) -> requests.Response:
    return requests.put(url(broker, topic, path), timeout=HTTP_TIMEOUT, **kwargs)


def stats(broker: Broker, topic: str) -> dict[str, Any]:
    response = get(broker, topic, "/stats")
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def backlog(broker: Broker, topic: str, subscription: str) -> int:
    return int(stats(broker, topic)["subscriptions"][subscription]["msgBacklog"])


def produce(client: pulsar.Client, topic: str, count: int, prefix: str = "m") -> list[Any]:
    producer = client.create_producer(topic, batching_enabled=False)
    ids = [producer.send(f"{prefix}{i}".encode(), properties={"i": str(i)}) for i in range(count)]
    producer.close()
    return ids


def subscription_at_earliest(client: pulsar.Client, topic: str, name: str) -> pulsar.Consumer:
    return client.subscribe(
        topic, name, initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=1
    )


# Terminate.


def test_terminate_refuses_later_sends_and_producers(
    broker: Broker, client: pulsar.Client, topic: str
) -> None:
    producer = client.create_producer(topic, batching_enabled=False)
    last = None
    for i in range(3):
        last = producer.send(f"m{i}".encode())
    response = post(broker, topic, "/terminate")
    assert response.status_code == 200, response.text
    assert response.json() == {
        "ledgerId": last.ledger_id(),
        "entryId": last.entry_id(),
        "partitionIndex": -1,
    }
    # PersistentTopic#terminate disconnects producers; their reconnect is refused.
    with pytest.raises(pulsar.TopicTerminated):
        producer.send(b"after")
    with pytest.raises(pulsar.TopicTerminated):
        client.create_producer(topic)
    # Terminating again answers the same last message id.
    assert broker.terminate_topic(topic) == (last.ledger_id(), last.entry_id())
    assert stats(broker, topic)["msgInCounter"] == 3


def test_terminated_topic_still_delivers_what_it_has(
    broker: Broker, client: pulsar.Client, topic: str
) -> None:
    consumer = subscription_at_earliest(client, topic, "reader")
    produce(client, topic, 2)
    broker.terminate_topic(topic)
    got = [consumer.receive(5000).data() for _ in range(2)]
    assert got == [b"m0", b"m1"]


def test_terminating_a_topic_leaves_its_neighbours_as_they_were(
    broker: Broker, client: pulsar.Client, topic: str
) -> None:
    # Topics and dispatchers share one handler table per class (actors.messages.Handlers);
    # a terminated topic, its subscriptions and a non-persistent topic each run their own
    # copy of it. Were the class's changed, every other topic would refuse SENDs.
    fleeting = client.create_producer(topic.replace("persistent:", "non-persistent:"))
    fleeting.send(b"dropped")  # no subscription: the non-persistent rule drops it
    neighbour = f"{topic}-neighbour"
    consumer = subscription_at_earliest(client, neighbour, "sub")
    producer = client.create_producer(neighbour, batching_enabled=False)
    producer.send(b"before")
    ended = subscription_at_earliest(client, topic, "sub")
    produce(client, topic, 1)
    broker.terminate_topic(topic)
    ended.acknowledge(ended.receive(5000))  # its dispatcher checks the end at each ACK now
    producer.send(b"after")
    client.create_producer(neighbour).close()
    got = [consumer.receive(5000) for _ in range(2)]
    assert [message.data() for message in got] == [b"before", b"after"]
    for message in got:
        consumer.acknowledge(message)
    wait_until(lambda: backlog(broker, neighbour, "sub") == 0, message="the ACKs settled")
    with pytest.raises(pulsar.TopicTerminated):
        client.create_producer(topic)


def _connect(client: RawClient, protocol_version: int) -> None:
    client.send_command(
        T(
            type=T.CONNECT,
            connect=pb.CommandConnect(
                client_version="topic-ops-test", protocol_version=protocol_version
            ),
        )
    )
    client.expect(T.CONNECTED)


def test_reached_end_of_topic_only_to_clients_that_know_it(broker: Broker, topic: str) -> None:
    # Consumer#reachedEndOfTopic sends REACHED_END_OF_TOPIC to protocol v9+ only.
    with RawClient(broker.address) as new, RawClient(broker.address) as old:
        _connect(new, PROTOCOL_VERSION)
        _connect(old, 8)
        new.create_producer(topic, 1)
        entry = new.produce(1, 0, b"only")
        new.subscribe(topic, "sub", 1, sub_type=pb.CommandSubscribe.Shared)
        old.subscribe(topic, "sub", 2, sub_type=pb.CommandSubscribe.Shared)
        new.flow(1, 10)
        new.receive(1, 1)
        broker.terminate_topic(topic)
        assert new.expect(T.CLOSE_PRODUCER).close_producer.producer_id == 1
        new.ack(1, [entry], broker.last_message_id(topic)["ledgerId"])
        end = new.expect(T.REACHED_END_OF_TOPIC)
        assert end.type == T.REACHED_END_OF_TOPIC
        # Both consumers were told at once; the old client's PONG comes after anything its
        # connection sent for it, and nothing came.
        old.ping()


def test_reached_end_of_topic_is_never_sent_to_the_cpp_client(broker: Broker, topic: str) -> None:
    # pulsar-client-cpp 4.2.0's ClientConnection closes the connection on the command
    # (its switch has no case for it), so the official Python client must never get it.
    with RawClient(broker.address) as java, RawClient(broker.address) as cpp:
        _connect(java, PROTOCOL_VERSION)
        cpp.send_command(
            T(
                type=T.CONNECT,
                connect=pb.CommandConnect(client_version="Pulsar-CPP-v4.2.0", protocol_version=20),
            )
        )
        cpp.expect(T.CONNECTED)
        java.subscribe(topic, "sub", 1, sub_type=pb.CommandSubscribe.Shared)
        cpp.subscribe(topic, "sub", 2, sub_type=pb.CommandSubscribe.Shared)
        broker.terminate_topic(topic)  # empty: the end is reached at once
        java.expect(T.REACHED_END_OF_TOPIC)
        cpp.ping()


def test_official_consumer_stays_connected_at_the_end_of_a_terminated_topic(
    broker: Broker, client: pulsar.Client, topic: str
) -> None:
    consumer = subscription_at_earliest(client, topic, "sub")
    produce(client, topic, 1)
    broker.terminate_topic(topic)
    consumer.acknowledge(consumer.receive(5000))
    wait_until(
        lambda: backlog(broker, topic, "sub"),
        predicate=lambda value: value == 0,
        message="the acknowledgement",
    )
    consumers = stats(broker, topic)["subscriptions"]["sub"]["consumers"]
    assert len(consumers) == 1
    first_address = consumers[0]["address"]
    with pytest.raises(pulsar.Timeout):
        consumer.receive(300)
    # Still the same connection: it was not dropped and re-made.
    assert [c["address"] for c in stats(broker, topic)["subscriptions"]["sub"]["consumers"]] == [
        first_address
    ]


def test_terminated_state_survives_a_restart(tmp_path: Any) -> None:
    topic = "persistent://public/default/terminated-on-disk"
    with Broker(port=0, storage="disk", data_dir=str(tmp_path)) as first:
        client = pulsar.Client(first.service_url)
        produce(client, topic, 2)
        first.terminate_topic(topic)
        client.close()
    with Broker(port=0, storage="disk", data_dir=str(tmp_path)) as second:
        client = pulsar.Client(second.service_url)
        try:
            with pytest.raises(pulsar.TopicTerminated):
                client.create_producer(topic)
            assert second.internal_stats(topic)["state"] == "Terminated"
        finally:
            client.close()


# Unload.


def test_unload_closes_producers_and_consumers_and_they_reconnect(
    broker: Broker, client: pulsar.Client, topic: str
) -> None:
    producer = client.create_producer(topic, batching_enabled=False)
    consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared)
    producer.send(b"before")
    assert consumer.receive(5000).data() == b"before"  # not acknowledged
    response = put(broker, topic, "/unload")
    assert response.status_code == 204, response.text
    producer.send(b"after")  # the client reconnected
    got = {consumer.receive(5000).data(), consumer.receive(5000).data()}
    # The unacknowledged message comes again after the reconnect, as after a Pulsar unload.
    assert got == {b"before", b"after"}


def test_unload_sends_broker_initiated_closes(broker: Broker, topic: str) -> None:
    with RawClient(broker.address) as raw:
        raw.handshake()
        raw.create_producer(topic, 7)
        raw.subscribe(topic, "sub", 9)
        broker.unload_topic(topic)
        frames = {raw.recv_frame().command.type for _ in range(2)}
        assert frames == {T.CLOSE_PRODUCER, T.CLOSE_CONSUMER}


def test_unload_of_a_missing_topic_is_404(broker: Broker) -> None:
    response = put(broker, "persistent://public/default/never-made", "/unload")
    assert response.status_code == 404
    assert response.json() == {"reason": "Topic persistent://public/default/never-made not found"}


# Delete.


def respond(
    broker: Broker, routes: list[Any], context: AdminContext, method: str, path: str, query: str
) -> tuple[int, Any]:
    """One request to an admin app made of ``routes``: (status, parsed JSON body or None)."""
    environ = {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "QUERY_STRING": query,
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "80",
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(),
    }
    app = AdminApp(routes, context)
    reply = broker._call(lambda _ref: app.respond(environ))
    body = reply.body
    if isinstance(body, bytes):
        body = json.loads(body) if body else None
    return reply.status, body


def delete(broker: Broker, topic: str, query: str = "") -> tuple[int, Any]:
    """DELETE /{topic} (issue 12a's route) through the admin app."""
    domain, rest = topic.split("://")
    context = AdminContext(broker=broker._broker_actor, metadata=broker.metadata)
    return respond(broker, all_routes(), context, "DELETE", f"/admin/v2/{domain}/{rest}", query)


def test_delete_without_force_is_refused_while_clients_are_connected(
    broker: Broker, client: pulsar.Client, topic: str
) -> None:
    producer = client.create_producer(topic)
    assert delete(broker, topic) == (412, {"reason": "Topic has active producers/subscriptions"})
    with pytest.raises(TopicOpError) as refused:
        broker.delete_topic(topic)
    assert refused.value.status == 412
    producer.send(b"still works")
    producer.close()
    assert delete(broker, topic) == (204, None)  # nobody connected now
    assert get(broker, topic, "/stats").status_code == 404
    assert delete(broker, topic)[0] == 404


def test_delete_with_force_closes_clients_and_drops_the_data(broker: Broker, topic: str) -> None:
    with RawClient(broker.address) as raw:
        raw.handshake()
        raw.create_producer(topic, 1)
        raw.produce(1, 0, b"gone")
        raw.subscribe(topic, "sub", 2)
        broker.delete_topic(topic, force=True)
        frames = {raw.recv_frame().command.type for _ in range(2)}
        assert frames == {T.CLOSE_PRODUCER, T.CLOSE_CONSUMER}
    assert get(broker, topic, "/stats").status_code == 404
    # A new topic of that name starts empty.
    with RawClient(broker.address) as raw:
        raw.handshake()
        raw.subscribe(topic, "sub", 2)
        assert broker.internal_stats(topic)["numberOfEntries"] == 0


def test_delete_with_force_on_disk_removes_the_files(tmp_path: Any) -> None:
    topic = "persistent://public/default/deleted-on-disk"
    with Broker(port=0, storage="disk", data_dir=str(tmp_path)) as running:
        client = pulsar.Client(running.service_url)
        produce(client, topic, 3)
        client.close()
        running.delete_topic(topic, force=True)
    with Broker(port=0, storage="disk", data_dir=str(tmp_path)) as again:
        assert topic not in again.stats()


# Skip.


def test_skip_acknowledges_the_next_entries(
    broker: Broker, client: pulsar.Client, topic: str
) -> None:
    consumer = client.subscribe(topic, "sub")
    consumer.close()
    produce(client, topic, 5)
    assert backlog(broker, topic, "sub") == 5
    assert post(broker, topic, "/subscription/sub/skip/2").status_code == 204
    assert backlog(broker, topic, "sub") == 3
    peeked = get(broker, topic, "/subscription/sub/position/1")
    assert peeked.content == b"m2"
    assert post(broker, topic, "/subscription/sub/skip_all").status_code == 204
    assert backlog(broker, topic, "sub") == 0


def test_skip_rejects_bad_numbers_and_missing_subscriptions(
    broker: Broker, client: pulsar.Client, topic: str
) -> None:
    produce(client, topic, 1)
    bad = post(broker, topic, "/subscription/sub/skip/many")
    assert bad.status_code == 400
    assert "numMessages" in bad.json()["reason"]
    negative = post(broker, topic, "/subscription/sub/skip/-1")
    assert negative.status_code == 400
    missing = post(broker, topic, "/subscription/nobody/skip/1")
    assert missing.status_code == 404
    assert missing.json()["reason"] == f"Subscription nobody not found for topic {topic}"


# Reset cursor.


def _next_millisecond() -> int:
    now = int(time.time() * 1000)
    while int(time.time() * 1000) == now:
        pass
    return now


def test_reset_cursor_by_time(broker: Broker, client: pulsar.Client, topic: str) -> None:
    # brokerlet drops entries every subscription acknowledged at once (Pulsar drops whole
    # ledgers later): a second subscription keeps them here, so the reset has data to go to.
    broker.create_subscription(topic, "keeps-the-data")
    consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared)
    produce(client, topic, 3, prefix="old")
    boundary = _next_millisecond()
    produce(client, topic, 2, prefix="new")
    for _ in range(5):
        consumer.acknowledge(consumer.receive(5000))
    wait_until(
        lambda: backlog(broker, topic, "sub"),
        predicate=lambda value: value == 0,
        message="every message acknowledged",
    )
    assert post(broker, topic, f"/subscription/sub/resetcursor/{boundary}").status_code == 204
    # The entries published after the time come again (PersistentSubscription#resetCursor).
    assert backlog(broker, topic, "sub") == 2
    assert consumer.receive(5000).data() == b"new0"
    bad = post(broker, topic, "/subscription/sub/resetcursor/yesterday")
    assert bad.status_code == 400
    assert "timestamp" in bad.json()["reason"]


def test_reset_cursor_by_message_id(broker: Broker, client: pulsar.Client, topic: str) -> None:
    client.subscribe(topic, "sub").close()
    broker.create_subscription(topic, "keeps-the-data")  # see test_reset_cursor_by_time
    ids = produce(client, topic, 4)
    broker.skip_all(topic, "sub")
    body = {"ledgerId": ids[1].ledger_id(), "entryId": ids[1].entry_id()}
    response = post(broker, topic, "/subscription/sub/resetcursor", json=body)
    assert response.status_code == 204, response.text
    assert backlog(broker, topic, "sub") == 3
    excluded = {**body, "isExcluded": True}
    assert post(broker, topic, "/subscription/sub/resetcursor", json=excluded).status_code == 204
    assert backlog(broker, topic, "sub") == 2
    wrong = post(broker, topic, "/subscription/sub/resetcursor", json={"ledgerId": "x"})
    assert wrong.status_code == 400
    assert "ledgerId" in wrong.json()["reason"]


# Expire.


def test_expire_messages_older_than_a_time(
    broker: Broker, client: pulsar.Client, topic: str
) -> None:
    client.subscribe(topic, "sub").close()
    produce(client, topic, 3)
    assert post(broker, topic, "/subscription/sub/expireMessages/3600").status_code == 204
    assert backlog(broker, topic, "sub") == 3  # nothing is an hour old
    _next_millisecond()
    assert post(broker, topic, "/subscription/sub/expireMessages/0").status_code == 204
    assert backlog(broker, topic, "sub") == 0
    sub = stats(broker, topic)["subscriptions"]["sub"]
    assert sub["totalMsgExpired"] == 3
    assert sub["lastExpireTimestamp"] > 0
    assert post(broker, topic, "/subscription/sub/expireMessages/soon").status_code == 400


def test_expire_on_every_subscription(broker: Broker, client: pulsar.Client, topic: str) -> None:
    for name in ("a", "b"):
        client.subscribe(topic, name).close()
    produce(client, topic, 2)
    _next_millisecond()
    assert post(broker, topic, "/all_subscription/expireMessages/0").status_code == 204
    assert [backlog(broker, topic, n) for n in ("a", "b")] == [0, 0]


# Peek, examine, get by id.


def test_peek_answers_the_payload_with_pulsars_headers(
    broker: Broker, client: pulsar.Client, topic: str
) -> None:
    client.subscribe(topic, "sub").close()
    producer = client.create_producer(topic, batching_enabled=False, producer_name="peeker")
    first = producer.send(b"hello", properties={"colour": "red"}, partition_key="k1")
    producer.send(b"world")
    response = get(broker, topic, "/subscription/sub/position/1")
    assert response.status_code == 200
    assert response.content == b"hello"
    headers = response.headers
    assert headers["X-Pulsar-Message-ID"] == f"{first.ledger_id()}:{first.entry_id()}"
    assert headers["X-Pulsar-producer-name"] == "peeker"
    assert headers["X-Pulsar-partition-key"] == "k1"
    assert headers["X-Pulsar-PROPERTY-colour"] == "red"
    assert headers["X-Pulsar-sequence-id"] == "0"
    assert "X-Pulsar-publish-time" in headers
    assert get(broker, topic, "/subscription/sub/position/2").content == b"world"
    assert get(broker, topic, "/subscription/sub/position/3").status_code == 404
    assert get(broker, topic, "/subscription/sub/position/0").status_code == 400
    by_id = get(broker, topic, f"/ledger/{first.ledger_id()}/entry/{first.entry_id()}")
    assert by_id.content == b"hello"
    latest = get(broker, topic, "/examinemessage?initialPosition=latest&messagePosition=1")
    assert latest.content == b"world"
    earliest = get(broker, topic, "/examinemessage?initialPosition=earliest&messagePosition=1")
    assert earliest.content == b"hello"
    assert get(broker, topic, "/examinemessage?initialPosition=middle").status_code == 400


# Subscriptions.


def test_create_list_and_delete_subscriptions(
    broker: Broker, client: pulsar.Client, topic: str
) -> None:
    ids = produce(client, topic, 3)
    assert put(broker, topic, "/subscription/latest").status_code == 204
    body = {"ledgerId": ids[1].ledger_id(), "entryId": ids[1].entry_id()}
    assert put(broker, topic, "/subscription/at-id", json=body).status_code == 204
    broker.create_subscription(topic, "from-start", "earliest")
    again = put(broker, topic, "/subscription/latest")
    assert again.status_code == 409
    assert again.json()["reason"] == "Subscription already exists for topic"
    names = get(broker, topic, "/subscriptions").json()
    assert names == ["at-id", "from-start", "latest"]
    assert [backlog(broker, topic, n) for n in names] == [2, 3, 0]

    consumer = client.subscribe(topic, "latest")
    busy = requests.delete(url(broker, topic, "/subscription/latest"), timeout=HTTP_TIMEOUT)
    assert busy.status_code == 412
    forced = requests.delete(
        url(broker, topic, "/subscription/at-id?force=true"), timeout=HTTP_TIMEOUT
    )
    assert forced.status_code == 204
    assert "at-id" not in get(broker, topic, "/subscriptions").json()
    consumer.close()
    gone = requests.delete(url(broker, topic, "/subscription/nope"), timeout=HTTP_TIMEOUT)
    assert gone.status_code == 404


# Stats.


def test_stats_internal_stats_and_last_message_id(
    broker: Broker, client: pulsar.Client, topic: str
) -> None:
    client.subscribe(topic, "sub").close()
    ids = produce(client, topic, 2)
    shaped = stats(broker, topic)
    for field in (
        "msgRateIn",
        "averageMsgSize",
        "backlogSize",
        "publishers",
        "deduplicationStatus",
    ):
        assert field in shaped
    assert shaped["subscriptions"]["sub"]["msgBacklog"] == 2
    internal = get(broker, topic, "/internalStats").json()
    assert internal["numberOfEntries"] == 2
    assert internal["lastConfirmedEntry"] == f"{ids[1].ledger_id()}:{ids[1].entry_id()}"
    assert internal["cursors"]["sub"]["markDeletePosition"] == f"{ids[0].ledger_id()}:-1"
    last = get(broker, topic, "/lastMessageId").json()
    assert last == {
        "ledgerId": ids[1].ledger_id(),
        "entryId": ids[1].entry_id(),
        "partitionIndex": -1,
    }
    partitioned = get(broker, topic, "/partitioned-stats?perPartition=true").json()
    assert partitioned["metadata"] == {"partitions": 0}
    assert partitioned["msgInCounter"] == 2


def test_partitioned_stats_aggregate_the_partitions(broker: Broker, client: pulsar.Client) -> None:
    base = "persistent://public/default/partitioned-stats-agg"
    for index, count in ((0, 2), (1, 3)):
        produce(client, f"{base}-partition-{index}", count)

    class Store:  # the metadata store of issue 12a, as far as partitioned-stats needs it
        topics = {base: SimpleNamespace(partitions=2)}

    context = AdminContext(broker=broker._broker_actor, metadata=Store())
    path = "/admin/v2/persistent/public/default/partitioned-stats-agg/partitioned-stats"

    def fetch(query: str) -> dict[str, Any]:
        status, body = respond(broker, all_routes(), context, "GET", path, query)
        assert status == 200, body
        result: dict[str, Any] = body
        return result

    merged = fetch("perPartition=true")
    assert merged["metadata"] == {"partitions": 2}
    assert merged["msgInCounter"] == 5
    assert sorted(merged["partitions"]) == [f"{base}-partition-0", f"{base}-partition-1"]
    assert merged["partitions"][f"{base}-partition-1"]["msgInCounter"] == 3
    assert fetch("perPartition=false")["partitions"] == {}


def test_broker_stats_topics_nest_namespace_bundle_domain_topic(
    broker: Broker, client: pulsar.Client, topic: str
) -> None:
    produce(client, topic, 1)
    response = requests.get(
        f"{broker.web_service_url}/admin/v2/broker-stats/topics", timeout=HTTP_TIMEOUT
    )
    assert response.status_code == 200
    nested = response.json()
    bundles = nested["public/default"]
    assert list(bundles) == ["0x00000000_0xffffffff"]
    assert bundles["0x00000000_0xffffffff"]["persistent"][topic]["msgInCounter"] == 1


def test_unknown_topic_is_404_for_every_read(broker: Broker) -> None:
    missing = "persistent://public/default/no-such-topic"
    for path in ("/stats", "/internalStats", "/lastMessageId", "/subscriptions"):
        response = get(broker, missing, path)
        assert response.status_code == 404
        assert response.json() == {"reason": f"Topic {missing} not found"}


# Non-persistent topics.


def test_non_persistent_messages_with_no_consumer_are_dropped(
    broker: Broker, client: pulsar.Client
) -> None:
    topic = "non-persistent://public/default/np-dropped"
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"nobody listens")  # no subscription: gone
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    producer.send(b"heard")
    assert consumer.receive(5000).data() == b"heard"
    sub = stats(broker, topic)["subscriptions"]["sub"]
    assert sub["msgBacklog"] == 0
    assert sub["msgDropCount"] == 0
    assert get(broker, topic, "/subscription/sub/position/1").status_code == 405


def test_non_persistent_drops_what_no_consumer_has_permits_for(broker: Broker) -> None:
    topic = "non-persistent://public/default/np-no-permits"
    with RawClient(broker.address) as raw:
        raw.handshake()
        raw.create_producer(topic, 1)
        raw.subscribe(topic, "sub", 2, sub_type=pb.CommandSubscribe.Shared)
        for sequence in range(3):  # the consumer has no permits: each is dropped, counted
            raw.produce(1, sequence, f"d{sequence}".encode())
        assert stats(broker, topic)["subscriptions"]["sub"]["msgDropCount"] == 3
        assert stats(broker, topic)["msgDropCount"] == 3
        raw.flow(2, 10)
        wait_until(
            lambda: stats(broker, topic)["subscriptions"]["sub"]["consumers"][0][
                "availablePermits"
            ],
            predicate=lambda value: value == 10,
            message="the permits to arrive",
        )
        entry = raw.produce(1, 3, b"kept")
        assert [m.payload for m in raw.receive(2, 1)] == [b"kept"]
        # The dropped entries count as acknowledged: one ack moves the cursor past them all.
        ledger_id = broker.last_message_id(topic)["ledgerId"]
        raw.ack(2, [entry], ledger_id)
        wait_until(
            lambda: broker.internal_stats(topic)["cursors"]["sub"]["markDeletePosition"],
            predicate=lambda value: value == f"{ledger_id}:{entry}",
            message="the mark-delete position to pass the dropped entries",
        )


def test_non_persistent_does_not_redeliver_after_a_consumer_leaves(
    broker: Broker, client: pulsar.Client
) -> None:
    topic = "non-persistent://public/default/np-no-redelivery"
    first = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared)
    second = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared)
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"once")
    receivers = [first, second]
    got = None
    deadline = time.monotonic() + 5
    while got is None and time.monotonic() < deadline:
        for consumer in receivers:
            try:
                got = consumer.receive(50)
                holder = consumer
                break
            except pulsar.Timeout:
                continue
    assert got is not None
    assert got.data() == b"once"
    other = second if holder is first else first
    holder.close()  # unacknowledged: Pulsar's non-persistent dispatchers do not redeliver
    producer.send(b"next")
    assert other.receive(5000).data() == b"next"
    assert stats(broker, topic)["storageSize"] == 0


def test_malformed_bodies_and_unknown_subscriptions_change_nothing(
    broker: Broker, client: pulsar.Client, topic: str
) -> None:
    client.subscribe(topic, "sub").close()
    produce(client, topic, 2)
    malformed = post(
        broker,
        topic,
        "/subscription/sub/resetcursor",
        data=b"{not json",
        headers={"Content-Type": "application/json"},
    )
    assert malformed.status_code == 400
    assert "JSON" in malformed.json()["reason"]
    assert put(broker, topic, "/subscription/x", json=[1, 2]).status_code == 400
    assert post(broker, topic, "/subscription/sub/expireMessages/-5").status_code == 400
    assert get(broker, topic, "/ledger/one/entry/0").status_code == 400
    for path in ("/subscription/ghost/skip_all", "/subscription/ghost/resetcursor/0"):
        response = post(broker, topic, path)
        assert response.status_code == 404
        assert response.json()["reason"] == f"Subscription ghost not found for topic {topic}"
    assert get(broker, topic, "/subscriptions").json() == ["sub"]
    assert backlog(broker, topic, "sub") == 2


def test_official_clients_reconnect_after_a_forced_delete(
    broker: Broker, client: pulsar.Client, topic: str
) -> None:
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"old")
    broker.delete_topic(topic, force=True)
    # The producer was closed by the broker; it reconnects and the topic is created afresh,
    # as on a Pulsar broker with topic auto-creation on.
    producer.send(b"new")
    assert stats(broker, topic)["msgInCounter"] == 1


def test_a_reader_continues_where_it_was_after_an_unload(
    broker: Broker, client: pulsar.Client, topic: str
) -> None:
    produce(client, topic, 4)
    reader = client.create_reader(topic, pulsar.MessageId.earliest, receiver_queue_size=1)
    assert [reader.read_next(5000).data() for _ in range(2)] == [b"m0", b"m1"]
    broker.unload_topic(topic)
    # A reader's subscription is non-durable: unload drops it, and the reader subscribes
    # again from the last message it read.
    assert [reader.read_next(5000).data() for _ in range(2)] == [b"m2", b"m3"]


def test_operations_reach_a_stored_subscription_after_a_restart(tmp_path: Any) -> None:
    topic = "persistent://public/default/stored-subscription"
    with Broker(port=0, storage="disk", data_dir=str(tmp_path)) as first:
        client = pulsar.Client(first.service_url)
        client.subscribe(topic, "sub").close()
        produce(client, topic, 4)
        client.close()
    with Broker(port=0, storage="disk", data_dir=str(tmp_path)) as second:
        # No consumer came back: the subscription is only a stored cursor until now.
        assert second.subscriptions(topic) == ["sub"]
        assert post(second, topic, "/subscription/sub/skip/3").status_code == 204
        assert backlog(second, topic, "sub") == 1
        assert get(second, topic, "/subscription/sub/position/1").content == b"m3"


def test_operations_reopen_a_stored_topic_closed_while_idle(tmp_path: Any) -> None:
    topic = "persistent://public/default/idle-then-examined"
    with Broker(port=0, storage="disk", data_dir=str(tmp_path)) as running:
        client = pulsar.Client(running.service_url)
        produce(client, topic, 2)
        client.close()
        closed = running.close_idle_topics()
        assert topic in closed
        latest = get(running, topic, "/examinemessage?initialPosition=latest&messagePosition=1")
        assert latest.content == b"m1"
        assert running.last_message_id(topic)["entryId"] == 1


def test_partitioned_stats_of_a_partitioned_topic_made_over_rest(
    broker: Broker, client: pulsar.Client
) -> None:
    topic = "persistent://public/default/rest-partitioned-stats"
    created = put(broker, topic, "/partitions", json=2)
    assert created.status_code == 204, created.text
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(6):
        producer.send(f"p{i}".encode())
    merged = get(broker, topic, "/partitioned-stats?perPartition=true").json()
    assert merged["metadata"] == {"partitions": 2}
    assert merged["msgInCounter"] == 6
    assert sorted(merged["partitions"]) == [f"{topic}-partition-0", f"{topic}-partition-1"]
    assert get(broker, topic, "/partitioned-stats?perPartition=false").json()["partitions"] == {}
    refused = post(broker, topic, "/terminate")
    assert refused.status_code == 405
    assert put(broker, topic, "/unload").status_code == 204
    producer.send(b"after unload")  # every partition's producer reconnected
