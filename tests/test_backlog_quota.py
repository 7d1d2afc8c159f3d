"""Backlog quotas (issue 14) with the official client: each policy does what Pulsar does.

Pulsar: BacklogQuotaManager (periodic check; disconnectProducers for the producer policies,
dropBacklogForSizeLimit / dropBacklogForTimeLimit for eviction) and ServerCnx#handleProducer
(ProducerBlockedQuotaExceededError for producer_request_hold, ...Exception for
producer_exception).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pulsar
import pytest

from brokerlet import Broker
from brokerlet.actors.messages import BacklogQuotaReport
from brokerlet.actors.topic import TopicActor
from brokerlet.storage import MemoryLedger
from brokerlet.storage.backlog_quota import BacklogQuota, QuotaService
from brokerlet.testing.waiting import wait_until
from tests.datarules import admin, await_passes, broker_factory, client_for, drain, stats
from tests.test_message_ttl import entry_published_at

make_broker = pytest.fixture(params=["memory", "disk"])(broker_factory)

LIMIT = 10_240


def set_quota(broker: Broker, policy: str) -> None:
    # Set after the backlog is written: a check in the middle of filling would refuse the
    # rest of it (rightly), which is not what these tests look at.
    answer = admin(
        broker,
        "POST",
        "namespaces/public/default/backlogQuota?backlogQuotaType=destination_storage",
        {"limitSize": LIMIT, "policy": policy},
    )
    assert answer.status_code == 204, answer.text


def fill(client: pulsar.Client, topic: str) -> pulsar.Producer:
    producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=2000)
    for _ in range(20):
        producer.send(b"x" * 1024)
    return producer


def wait_until_flagged(broker: Broker, topic: str) -> None:
    wait_until(
        lambda: stats(broker, topic)["backlogQuotaExceeded"],
        predicate=lambda value: value == "destination_storage",
        message="the quota check to flag the topic",
    )


def wait_until_no_producers(broker: Broker, topic: str) -> None:
    wait_until(
        lambda: stats(broker, topic)["publishers"],
        predicate=lambda publishers: not publishers,
        message="the check to disconnect the producers",
    )


def assert_welcome_once_drained(
    broker: Broker, client: pulsar.Client, topic: str, sub: pulsar.Consumer
) -> None:
    """Consumed below the limit: producers are welcome again."""
    assert len(drain(sub)) >= 20
    wait_until(
        lambda: stats(broker, topic)["backlogSize"],
        predicate=lambda size: size == 0,
        message="the acks to empty the backlog",
    )
    client.create_producer(topic).send(b"after")


def test_producer_exception_refuses_sends_and_new_producers(
    make_broker: Callable[..., Broker],
) -> None:
    topic = "persistent://public/default/quota-exception"
    broker = make_broker(backlog_quota_check_interval_in_seconds=0.1)
    client = client_for(broker)
    try:
        sub = client.subscribe(topic, "slow", initial_position=pulsar.InitialPosition.Earliest)
        producer = fill(client, topic)
        set_quota(broker, "producer_exception")
        wait_until_flagged(broker, topic)
        assert stats(broker, topic)["backlogQuotaLimitSize"] == LIMIT
        # The check disconnected the producer; its reconnection is refused, and the client
        # fails the send with the quota error.
        wait_until_no_producers(broker, topic)
        with pytest.raises(pulsar.ProducerBlockedQuotaExceededException):
            producer.send(b"more")
        with pytest.raises(pulsar.ProducerBlockedQuotaExceededException):
            client.create_producer(topic)
        # Consumed below the limit: producers are welcome again.
        assert_welcome_once_drained(broker, client, topic, sub)
    finally:
        client.close()


def test_producer_request_hold_holds_sends_until_the_backlog_drains(
    make_broker: Callable[..., Broker],
) -> None:
    topic = "persistent://public/default/quota-hold"
    broker = make_broker(backlog_quota_check_interval_in_seconds=0.1)
    client = client_for(broker)
    try:
        sub = client.subscribe(topic, "slow", initial_position=pulsar.InitialPosition.Earliest)
        producer = fill(client, topic)
        set_quota(broker, "producer_request_hold")
        wait_until_flagged(broker, topic)
        with pytest.raises(pulsar.ProducerBlockedQuotaExceededError):
            client.create_producer(topic)
        wait_until_no_producers(broker, topic)
        # A held send waits, then times out (send_timeout_millis=2000) as Pulsar's clients do.
        started = time.monotonic()
        with pytest.raises(pulsar.Timeout):
            producer.send(b"held")
        assert time.monotonic() - started >= 1.5
        # Consumed below the limit: a producer is accepted again (the held one reconnects
        # on its own back-off schedule).
        assert_welcome_once_drained(broker, client, topic, sub)
    finally:
        client.close()


def test_consumer_backlog_eviction_moves_the_slowest_subscription(
    make_broker: Callable[..., Broker],
) -> None:
    topic = "persistent://public/default/quota-eviction"
    broker = make_broker(backlog_quota_check_interval_in_seconds=0.1)
    client = client_for(broker)
    try:
        slow = client.subscribe(topic, "slow", initial_position=pulsar.InitialPosition.Earliest)
        fast = client.subscribe(topic, "fast", initial_position=pulsar.InitialPosition.Earliest)
        producer = fill(client, topic)
        assert len(drain(fast)) == 20
        set_quota(broker, "consumer_backlog_eviction")

        def evicted() -> bool:
            return 0 < stats(broker, topic)["subscriptions"]["slow"]["msgBacklog"] < 20

        wait_until(evicted, message="eviction of the slow subscription")
        current = stats(broker, topic)
        assert current["backlogSize"] <= LIMIT * 0.9
        assert current["subscriptions"]["slow"]["totalMsgExpired"] == 0  # evicted, not expired
        producer.send(b"still accepted")  # eviction never blocks producers
        slow.close()
        # The subscription resumes after the evicted entries, ending with the newest.
        again = client.subscribe(topic, "slow")
        received = [m.data() for m in drain(again)]
        assert 0 < len(received) < 21
        assert received[-1] == b"still accepted"
    finally:
        client.close()


def test_message_age_quota_and_the_eviction_points() -> None:
    ledger = MemoryLedger(1)
    ledger.append([entry_published_at(1_000 * i) for i in range(100)], lambda _: None)
    ledger.consumed_up_to = 9  # the slowest subscription is at entry 10 (published at 10 s)
    quotas = (BacklogQuota(-1, -1), BacklogQuota(-1, 30, "consumer_backlog_eviction"))
    service = QuotaService(lambda: [], lambda _: quotas, 60, clock=lambda: 100_000)
    state, evict = service.check("t", ledger, 9)
    assert (state.exceeded, state.oldest_age_s) == ("message_age", 90)
    # dropBacklogForTimeLimit: up to the newest entry older than 30 s (published < 70 s).
    assert evict == 69
    # Size: keep at most 90% of the limit after the new mark-delete.
    size = ledger.bytes_from(0) // 100
    quotas = (BacklogQuota(20 * size, -1, "consumer_backlog_eviction"), BacklogQuota())
    state, evict = service.check("t", ledger, 9)
    assert state.exceeded == "destination_storage"
    assert ledger.bytes_from(evict + 1) <= 18 * size < ledger.bytes_from(evict)
    # Under both limits: nothing.
    quotas = (BacklogQuota(10**9), BacklogQuota(-1, 10**6))
    assert service.check("t", ledger, 9)[0].exceeded is None


def test_an_unchanged_state_is_told_once_and_an_exceeded_one_at_every_check(
    make_broker: Callable[..., Broker], monkeypatch: pytest.MonkeyPatch
) -> None:
    # BrokerActor._report_quota: telling every open topic its unchanged state at every check
    # woke each topic's actor (8,000 runs a minute with 8,000 open topics). An exceeded state
    # is told at every check: the topic acts on it (and may reset its own copy).
    told: list[str | None] = []
    handle = TopicActor.HANDLERS[BacklogQuotaReport]

    def counted(actor: TopicActor, message: BacklogQuotaReport) -> None:
        told.append(message.state.exceeded)
        handle(actor, message)

    monkeypatch.setitem(TopicActor.HANDLERS, BacklogQuotaReport, counted)
    topic = "persistent://public/default/quota-told"
    broker = make_broker(backlog_quota_check_interval_in_seconds=0.05)
    client = client_for(broker)
    try:
        sub = client.subscribe(topic, "slow", initial_position=pulsar.InitialPosition.Earliest)
        await_passes(broker, "quotas", 3)  # no backlog: the same state at each check
        assert told == [None]
        fill(client, topic)
        set_quota(broker, "producer_exception")
        wait_until_flagged(broker, topic)
        flagged = told.count("destination_storage")
        await_passes(broker, "quotas", 3)
        assert told.count("destination_storage") >= flagged + 2
        assert_welcome_once_drained(broker, client, topic, sub)
    finally:
        client.close()
