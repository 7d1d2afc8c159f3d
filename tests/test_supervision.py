"""Supervision (issue 10): an actor that fails is replaced and its clients reconnect.

For each actor kind a fault is injected into one of its handlers (a wrapper that raises once,
installed before the actor is made, since actors bind their handlers when they start). Then
the topic, the subscription and the other connections work again within a second, and every
receipted message is still delivered.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pulsar
import pytest
import requests

from brokerlet import Broker
from brokerlet.actors.connection import ConnectionActor
from brokerlet.actors.dispatcher import Dispatcher
from brokerlet.actors.messages import Ack, Append
from brokerlet.actors.supervision import restarts
from brokerlet.actors.topic import TopicActor
from brokerlet.testing.rawclient import RawClient
from brokerlet.transport.protocol import Frame, pb

T = pb.BaseCommand
TOPIC = "persistent://public/default/supervised"
OTHER = "persistent://public/default/bystander"
RECOVERY = 1.0
"""Seconds within which a topic or subscription must serve again after a failure."""

R = TypeVar("R")


class Fault:
    """Makes a handler raise once, on the first call that ``when`` accepts."""

    def __init__(self) -> None:
        self.fired = False

    def inject(
        self, monkeypatch: pytest.MonkeyPatch, cls: type, name: str, when: Callable[[Any], bool]
    ) -> None:
        """Into a handler the actor looks up by name per message (the connection's)."""
        wrapped = self._wrap(getattr(cls, name), f"{cls.__name__}.{name}", when)
        monkeypatch.setattr(cls, name, wrapped)

    def inject_handler(
        self, monkeypatch: pytest.MonkeyPatch, cls: Any, kind: type, when: Callable[[Any], bool]
    ) -> None:
        """Into an entry of a class's handler table (the topic's and the dispatcher's)."""
        wrapped = self._wrap(cls.HANDLERS[kind], f"{cls.__name__}'s {kind.__name__}", when)
        monkeypatch.setitem(cls.HANDLERS, kind, wrapped)

    def _wrap(
        self, original: Callable[[Any, Any], Any], where: str, when: Callable[[Any], bool]
    ) -> Callable[[Any, Any], Any]:
        def handler(actor: Any, message: Any) -> Any:
            if not self.fired and when(message):
                self.fired = True
                raise RuntimeError(f"injected fault in {where}")
            return original(actor, message)

        return handler


@pytest.fixture
def broker() -> Iterator[Broker]:
    with Broker(port=0) as running:
        yield running


def within(seconds: float, attempt: Callable[[], R]) -> R:
    """Retry ``attempt`` (a failed one raises) until it succeeds or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return attempt()
        except (AssertionError, TimeoutError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def frames_until(client: RawClient, kinds: set[int]) -> list[Frame]:
    """Read frames until one of each type in ``kinds`` has arrived."""
    seen: list[Frame] = []
    missing = set(kinds)
    while missing:
        frame = client.recv_frame()
        seen.append(frame)
        missing.discard(frame.command.type)
    return seen


def metric(broker: Broker, kind: str) -> float:
    assert broker.web_service_url is not None
    text = requests.get(f"{broker.web_service_url}/metrics", timeout=5).text
    line = f'brokerlet_actor_restarts_total{{kind="{kind}"}} '
    values = [float(row[len(line) :]) for row in text.splitlines() if row.startswith(line)]
    assert len(values) == 1, text
    return values[0]


class Bystander:
    """A good connection on another topic: it must not notice any failure."""

    def __init__(self, broker: Broker) -> None:
        self.client = RawClient(broker.address)
        self.client.handshake()
        self.client.create_producer(OTHER, 1)
        self.client.subscribe(OTHER, "bystander", 1)
        self.sent = 0

    def check(self) -> None:
        self.client.ping()
        self.client.produce(1, self.sent, b"bystander")
        self.sent += 1
        self.client.flow(1, 1)
        assert self.client.receive(1, 1)[0].payload == b"bystander"


def resubscribe(client: RawClient, subscription: str, sub_type: int) -> None:
    within(RECOVERY, lambda: client.subscribe(TOPIC, subscription, 1, sub_type=sub_type))


@pytest.mark.parametrize("storage", ["memory", "disk"])
def test_a_failed_topic_is_reopened_with_its_data_and_cursors(
    storage: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="brokerlet")
    fault = Fault()
    fault.inject_handler(monkeypatch, TopicActor, Append, lambda _m: True)
    fault.fired = True  # armed below, once the topic holds data
    before = restarts()
    with (
        Broker(port=0, storage=storage, data_dir=str(tmp_path)) as broker,
        RawClient(broker.address) as client,
    ):
        bystander = Bystander(broker)
        client.handshake()
        client.create_producer(TOPIC, 1)
        client.subscribe(TOPIC, "s", 1, sub_type=pb.CommandSubscribe.Shared)
        stored = [f"m-{i}".encode() for i in range(3)]
        for i, payload in enumerate(stored):
            client.produce(1, i, payload)
        client.flow(1, 1)
        first = client.receive(1, 1)[0]
        client.ack(1, [first.entry_id], first.ledger_id)
        client.ping()
        fault.fired = False

        client.send_raw(client.send_frame(1, 3, b"never receipted"))
        closes = frames_until(client, {T.CLOSE_PRODUCER, T.CLOSE_CONSUMER})
        assert T.SEND_RECEIPT not in [f.command.type for f in closes]
        failed_at = time.monotonic()

        within(RECOVERY, lambda: client.create_producer(TOPIC, 2))
        resubscribe(client, "s", pb.CommandSubscribe.Shared)
        assert time.monotonic() - failed_at < RECOVERY
        client.produce(2, 4, b"after")
        client.flow(1, 10)
        # The acked entry stays acked; the unacked and the new one are delivered.
        assert [m.payload for m in client.receive(1, 3)] == [*stored[1:], b"after"]
        bystander.check()
        assert restarts()["topic"] == before["topic"] + 1
        assert metric(broker, "topic") >= 1
    failures = [r for r in caplog.records if "failed; it is replaced" in r.getMessage()]
    assert len(failures) == 1, "logged once"
    assert failures[0].exc_info is not None, "with its traceback"


def test_a_failed_dispatcher_restarts_from_its_cursor(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    fault = Fault()
    fault.inject_handler(
        monkeypatch, Dispatcher, Ack, lambda m: any(e == 1 for _, e in m.positions)
    )
    before = restarts()
    with RawClient(broker.address) as client, RawClient(broker.address) as other:
        bystander = Bystander(broker)
        client.handshake()
        other.handshake()
        client.subscribe(TOPIC, "s", 1, sub_type=pb.CommandSubscribe.Shared)
        other.subscribe(TOPIC, "unaffected", 1)
        client.create_producer(TOPIC, 1)
        stored = [f"m-{i}".encode() for i in range(3)]
        for i, payload in enumerate(stored):
            client.produce(1, i, payload)
        client.flow(1, 3)
        got = client.receive(1, 3)
        client.ack(1, [got[0].entry_id], got[0].ledger_id)
        client.ack(1, [got[1].entry_id], got[1].ledger_id)  # this one fails the dispatcher
        frames_until(client, {T.CLOSE_CONSUMER})
        failed_at = time.monotonic()

        resubscribe(client, "s", pb.CommandSubscribe.Shared)
        client.flow(1, 10)
        # Entry 0 was acked before the failure; 1 (its ack lost with it) and 2 come again.
        assert [m.payload for m in client.receive(1, 2)] == stored[1:]
        assert time.monotonic() - failed_at < RECOVERY + 1
        client.produce(1, 3, b"after")
        assert client.receive(1, 1)[0].payload == b"after"
        other.flow(1, 10)
        assert [m.payload for m in other.receive(1, 4)] == [*stored, b"after"]
        bystander.check()
    assert restarts()["dispatcher"] == before["dispatcher"] + 1


def test_a_failed_connection_releases_its_producers_and_consumers(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    fault = Fault()
    fault.inject(monkeypatch, ConnectionActor, "_ping", lambda _m: True)
    fault.fired = True
    before = restarts()
    bystander = Bystander(broker)
    with RawClient(broker.address) as bad:
        bad.handshake()
        bad.create_producer(TOPIC, 1)
        bad.subscribe(TOPIC, "exclusive", 1)
        stored = [f"m-{i}".encode() for i in range(3)]
        for i, payload in enumerate(stored):
            bad.produce(1, i, payload)
        fault.fired = False
        bad.send_command(T(type=T.PING, ping=pb.CommandPing()))
        assert bad.wait_closed() == []
    with RawClient(broker.address) as good:
        good.handshake()
        # Its Exclusive consumer was released, or this would be ConsumerBusy.
        resubscribe(good, "exclusive", pb.CommandSubscribe.Exclusive)
        good.create_producer(TOPIC, 1)
        good.produce(1, 3, b"after")
        good.flow(1, 10)
        assert [m.payload for m in good.receive(1, 4)] == [*stored, b"after"]
    bystander.check()
    assert restarts()["connection"] == before["connection"] + 1


def test_the_official_client_rides_over_a_topic_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    # CLOSE_PRODUCER / CLOSE_CONSUMER from the broker make the C++ client reconnect and resend
    # what was not receipted (ProducerImpl resends its pending queue), so nothing is lost.
    fault = Fault()
    fault.inject_handler(monkeypatch, TopicActor, Append, lambda _m: True)
    fault.fired = True
    with Broker(port=0) as broker:
        client = pulsar.Client(broker.service_url, operation_timeout_seconds=10)
        try:
            consumer = client.subscribe(TOPIC, "official", consumer_type=pulsar.ConsumerType.Shared)
            producer = client.create_producer(TOPIC, batching_enabled=False)
            for i in range(10):
                producer.send(f"m-{i}".encode())
            fault.fired = False
            began = time.monotonic()
            for i in range(10, 20):
                producer.send(f"m-{i}".encode())  # the first one fails the topic
            assert time.monotonic() - began < 5
            assert fault.fired
            got: set[bytes] = set()
            while len(got) < 20:
                message = consumer.receive(timeout_millis=5000)
                got.add(message.data())
                consumer.acknowledge(message)
            assert got == {f"m-{i}".encode() for i in range(20)}
        finally:
            client.close()
