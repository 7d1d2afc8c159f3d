"""Locust users on brokerlet's gevent-native client: producers and consumers.

Each user has a client (one TCP connection) of its own, as separate applications would.
Every send fires one Locust ``request`` event of type ``publish`` (send to receipt) and every
first delivery one of type ``e2e`` (publish timestamp in the body to the consumer's receive),
named after the topic and the subscription. Duplicates are fired as failures of type
``duplicate``, redeliveries as ``redelivery``. The same latencies go, in microseconds, into
the run's HDR histograms, because Locust rounds to whole milliseconds.

Import this module only in a process Locust has patched (``loadtests.runner`` imports
Locust first).
"""

from __future__ import annotations

import random
import time
from typing import ClassVar

import gevent
import gevent.event
from locust import User, constant, constant_throughput, task

from brokerlet.client import (
    AlreadyClosed,
    Consumer,
    ConsumerType,
    InitialPosition,
    Message,
    MessageId,
    Producer,
    PulsarError,
    SendCallback,
    Timeout,
)
from loadtests.context import RunContext
from loadtests.payload import pack, unpack
from loadtests.scenarios import Scenario

__all__ = ["ConsumerUser", "DuplicateDeliveryError", "ProducerUser", "user_classes"]

_RECEIVE_WAIT_MS = 200  # how long an idle consumer task waits before it looks at its flags
_DRAIN_PER_TASK = 16  # queued messages one consumer task takes before yielding the hub
_PAUSED_CONSUMER_RCVBUF = 16384  # small, so the broker feels a paused reader quickly


class DuplicateDeliveryError(Exception):
    """A message handed to a subscription again without a redelivery count."""


class ProducerUser(User):
    """Publishes the scenario's messages with random keys, at its share of the rate cap."""

    abstract = True
    run_context: ClassVar[RunContext]

    def on_start(self) -> None:
        context = self.run_context
        scenario = context.scenario
        self.number = context.ledger.new_producer()
        self.random = random.Random(context.seed * 1_000_003 + self.number)
        self.sequence = 0
        self.client = context.new_client()
        self.producer: Producer = self.client.create_producer(
            context.topic,
            max_pending_messages=max(1000, scenario.inflight),
            block_if_queue_full=True,
        )
        context.user_connected()
        context.publishing.wait()
        if context.publishing_over:
            return
        if scenario.rate:
            # Spread the first sends over one pacing interval, so the producers do not tick
            # in lockstep.
            gevent.sleep(self.random.random() * scenario.producers * scenario.inflight
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
        ledger = context.ledger
        outstanding = [scenario.inflight]
        done = gevent.event.Event()
        for _ in range(scenario.inflight):
            sequence = self.sequence
            self.sequence += 1
            key = self.random.randrange(scenario.keys)
            sent_ns = time.perf_counter_ns()
            body = pack(self.number, key, sequence, sent_ns, scenario.message_size)
            ledger.sending(self.number, sequence)
            self.producer.send_async(
                body, self._on_outcome(sequence, sent_ns, outstanding, done),
                partition_key=context.key_names[key],
            )
        done.wait()

    def _on_outcome(
        self, sequence: int, sent_ns: int, outstanding: list[int], done: gevent.event.Event
    ) -> SendCallback:
        context = self.run_context

        def on_outcome(error: PulsarError | None, _message_id: MessageId | None) -> None:
            elapsed_ns = time.perf_counter_ns() - sent_ns
            if error is None:
                context.ledger.receipted_send(self.number, sequence)
                context.publish_latency.record_ns(elapsed_ns)
                context.last_receipt = time.perf_counter()
            else:
                context.ledger.failed_send(self.number, sequence)
            context.fire_request(
                request_type="publish", name=context.topic, response_time=elapsed_ns / 1e6,
                response_length=context.scenario.message_size, exception=error, context={},
            )
            outstanding[0] -= 1
            if outstanding[0] == 0:
                done.set()
            if context.publishing_over:
                context.check_caught_up()

        return on_outcome


class ConsumerUser(User):
    """Receives and acknowledges on one subscription; can pause its socket or rejoin."""

    abstract = True
    wait_time = constant(0)
    run_context: ClassVar[RunContext]

    def on_start(self) -> None:
        context = self.run_context
        self.slot, self.subscription = context.claim_consumer_slot(self)
        self.generation = 0
        self.rejoin_requested = False
        self.rejoins = 0
        self._subscribe()
        context.user_connected()

    def _subscribe(self) -> None:
        context = self.run_context
        scenario = context.scenario
        paused_one = scenario.pause_seconds > 0 and self.slot == 0
        self.client = context.new_client(so_rcvbuf=_PAUSED_CONSUMER_RCVBUF if paused_one else 0)
        self.consumer: Consumer = self.client.subscribe(
            context.topic,
            self.subscription,
            consumer_type=ConsumerType[scenario.subscription_type],
            consumer_name=f"{self.subscription}-c{self.slot}-g{self.generation}",
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
        try:
            message = consumer.receive(timeout_millis=_RECEIVE_WAIT_MS)
        except (Timeout, AlreadyClosed):
            return
        self._handle(message)
        for _ in range(_DRAIN_PER_TASK):
            try:
                message = consumer.receive(timeout_millis=0)
            except (Timeout, AlreadyClosed):
                return
            self._handle(message)

    def _handle(self, message: Message) -> None:
        context = self.run_context
        now_ns = time.perf_counter_ns()
        body = message.data()
        producer, key, sequence, sent_ns = unpack(body)
        redelivery_count = message.redelivery_count()
        first = context.ledger.delivered(self.subscription, producer, key, sequence,
                                         redelivery_count)
        self.consumer.acknowledge(message)
        context.delivered_by_slot[self.slot] += 1
        context.last_delivery = time.perf_counter()
        if first:
            elapsed_ns = now_ns - sent_ns
            context.e2e_latency.record_ns(elapsed_ns)
            context.e2e_by_subscription[self.subscription].record_ns(elapsed_ns)
            context.fire_request(
                request_type="e2e", name=self.subscription, response_time=elapsed_ns / 1e6,
                response_length=len(body), exception=None, context={},
            )
            if context.publishing_over:
                context.check_caught_up()
        elif redelivery_count > 0:
            context.fire_request(
                request_type="redelivery", name=self.subscription, response_time=0,
                response_length=len(body), exception=None, context={},
            )
        else:
            context.fire_request(
                request_type="duplicate", name=self.subscription, response_time=0,
                response_length=len(body), context={},
                exception=DuplicateDeliveryError(f"p{producer}#{sequence} delivered again"),
            )


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
