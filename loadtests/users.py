"""The scenarios' Locust users, on :mod:`brokerlet.locust`: producers and consumers.

Each user has a client (one TCP connection) of its own, as separate applications would.
:class:`brokerlet.locust.PulsarUser` fires the Locust events (``publish``: send to receipt;
``e2e``: send to first delivery, named after the subscription; ``redelivery``; ``duplicate``
as a failure) and keeps the run's delivery books, which the run's context shares
(:attr:`RunContext.tracker`). These users add what the scenarios steer: pacing, the start
signal, a consumer that pauses its socket or rejoins, and the microsecond HDR histograms
(Locust rounds to whole milliseconds).

Import this module only in a process Locust has patched (``loadtests.runner`` imports
Locust first).
"""

from __future__ import annotations

import time
from typing import ClassVar

import gevent
import gevent.event
from locust import User, constant, constant_throughput, task

from brokerlet import Client, ConsumerType, InitialPosition, MessageId
from brokerlet.locust import Message, PulsarError, PulsarUser
from loadtests.context import RunContext
from loadtests.scenarios import Scenario

__all__ = ["ConsumerUser", "ProducerUser", "user_classes"]

_RECEIVE_WAIT_MS = 200  # how long an idle consumer task waits before it looks at its flags
_DRAIN_PER_TASK = 16  # queued messages one consumer task takes before yielding the hub
_PAUSED_CONSUMER_RCVBUF = 16384  # small, so the broker feels a paused reader quickly


class _ScenarioUser(PulsarUser):
    """A PulsarUser whose clients the run closes too, with the scenario's client options."""

    abstract = True
    run_context: ClassVar[RunContext]
    client_options: ClassVar[dict[str, object]] = {"keep_alive_interval_seconds": 0}

    def new_client(self, **options: object) -> Client:
        client = super().new_client(**options)
        self.run_context.clients.append(client)
        return client


class ProducerUser(_ScenarioUser):
    """Publishes the scenario's messages with random keys, at its share of the rate cap."""

    abstract = True

    def on_start(self) -> None:
        context = self.run_context
        scenario = context.scenario
        producer = self.producer(context.topic, max_pending_messages=max(1000, scenario.inflight))
        self.rng.seed(context.seed * 1_000_003 + producer.number)
        self.payload = bytes(scenario.message_size)
        context.user_connected()
        context.publishing.wait()
        if context.publishing_over:
            return
        if scenario.rate:
            # Spread the first sends over one pacing interval, so the producers do not tick
            # in lockstep.
            gevent.sleep(self.rng.random() * scenario.producers * scenario.inflight
                         / scenario.rate)

    @task
    def publish(self) -> None:
        """Send ``inflight`` messages, then wait for their receipts."""
        context = self.run_context
        if context.publishing_over:
            # Idle until Locust stops the users (a stopped user confuses Locust's counts).
            context.finished.wait()
            return
        scenario = context.scenario
        outstanding = [scenario.inflight]
        done = gevent.event.Event()

        def one_done(_error: PulsarError | None, _message_id: MessageId | None) -> None:
            outstanding[0] -= 1
            if outstanding[0] == 0:
                done.set()

        for _ in range(scenario.inflight):
            key = context.key_names[self.rng.randrange(scenario.keys)]
            self.send_async(context.topic, self.payload, key=key, on_done=one_done)
        done.wait()

    def on_receipt(self, topic: str, elapsed_ns: int, error: PulsarError | None) -> None:
        if error is None:
            self.run_context.publish_latency.record_ns(elapsed_ns)
            self.run_context.last_receipt = time.perf_counter()


class ConsumerUser(_ScenarioUser):
    """Receives and acknowledges on one subscription; can pause its socket or rejoin."""

    abstract = True
    wait_time = constant(0)

    def on_start(self) -> None:
        context = self.run_context
        self.slot, self.subscription_name = context.claim_consumer_slot(self)
        self.generation = 0
        self.rejoin_requested = False
        self.rejoins = 0
        self._subscribe()
        context.user_connected()

    def _subscribe(self) -> None:
        context = self.run_context
        scenario = context.scenario
        paused_one = scenario.pause_seconds > 0 and self.slot == 0
        self.client = self.new_client(so_rcvbuf=_PAUSED_CONSUMER_RCVBUF if paused_one else 0)
        self.consumer = self.subscribe(
            context.topic,
            self.subscription_name,
            consumer_type=ConsumerType[scenario.subscription_type],
            consumer_name=f"{self.subscription_name}-c{self.slot}-g{self.generation}",
            receiver_queue_size=scenario.receiver_queue_size,
            initial_position=InitialPosition.Earliest,
        )

    def rejoin(self) -> None:
        """Leave the subscription (unacked messages go to the others) and join as a new
        consumer; done by the consumer's own task, between messages."""
        old = self.client
        try:
            self.consumer.close()
        except PulsarError as error:
            self.run_context.ledger.errors.append(f"consumer {self.slot} failed to leave: {error}")
        old.close()
        self.run_context.clients.remove(old)
        self.clients.remove(old)
        self.generation += 1
        self._subscribe()
        self.rejoins += 1

    @task
    def consume(self) -> None:
        """Take the next message (waiting a little), then what else is queued."""
        if self.rejoin_requested:
            self.rejoin_requested = False
            self.rejoin()
        consumer = self.consumer
        if self.receive(consumer, _RECEIVE_WAIT_MS) is None:
            return
        for _ in range(_DRAIN_PER_TASK):
            if self.receive(consumer, 0) is None:
                return

    def on_delivered(
        self, subscription: str, message: Message, first: bool, elapsed_ns: int
    ) -> None:
        context = self.run_context
        context.delivered_by_slot[self.slot] += 1
        context.last_delivery = time.perf_counter()
        if first:
            context.e2e_latency.record_ns(elapsed_ns)
            context.e2e_by_subscription[subscription].record_ns(elapsed_ns)


def user_classes(context: RunContext) -> list[type[User]]:
    """The run's producer and consumer classes, with fixed counts and pacing from the scenario.

    Each producer runs ``rate / producers / inflight`` tasks per second (or back to back
    when the rate is unlimited).
    """
    scenario: Scenario = context.scenario
    if scenario.rate:
        pacing = constant_throughput(scenario.rate / scenario.producers / scenario.inflight)
    else:
        pacing = constant(0)
    producer = type("Producer", (ProducerUser,), {
        "fixed_count": scenario.producers, "wait_time": pacing, "run_context": context,
        "abstract": False,
    })
    consumer = type("Consumer", (ConsumerUser,), {
        "fixed_count": scenario.consumers, "run_context": context, "abstract": False,
    })
    return [consumer, producer]
