"""Locust users for any Pulsar-compatible broker (brokerlet, Apache Pulsar, ...).

The official ``pulsar-client`` is C++ and blocks gevent's hub, so it cannot drive load from
Locust; :class:`PulsarUser` uses brokerlet's gevent-native client instead, one client (one
TCP connection) per user, as separate applications would have. Point it at a broker with
``--host pulsar://host:6650``::

    from locust import constant_throughput, task
    from brokerlet.locust import PulsarUser

    class Orders(PulsarUser):
        wait_time = constant_throughput(100)

        def on_start(self):
            self.consumer = self.subscribe("orders", "billing")

        @task
        def place_order(self):
            self.send("orders", b"order", key=f"customer-{self.rng.randrange(50)}")
            self.receive(self.consumer)

What it reports, as Locust request events, with response times in milliseconds carrying
microseconds (``elapsed_ns / 1e6``):

========================  ========================================================  =======
request type              what                                                      name
========================  ========================================================  =======
``publish``               send to receipt (a failure carries the error)            topic
``e2e``                   a message's first delivery, from its send                subscription
``redelivery``            a delivery the broker marked as redelivered (time 0)     subscription
``duplicate`` (failure)   a message handed over again without a redelivery count   subscription
``receive``               a message not sent by this process (time 0)              subscription
========================  ========================================================  =======

**Delivery verdict.** Every message a :class:`PulsarUser` sends carries one property,
``brokerlet-track`` (``run:producer:sequence:sent_ns``), so any payload works. Consumers of
the same process check it against the books (:class:`~brokerlet.delivery.Ledger`): every
receipted message reached every subscription (else *lost*), none twice without a redelivery
count (*duplicated*), and per producer and key in order for Key_Shared, Failover and
Exclusive subscriptions (*out of order*). :func:`delivery_tracker` gives any scenario the
books and :meth:`DeliveryTracker.verdict`. When the test stops, publishing stops first and
consumers get ``--pulsar-drain-seconds`` (10) to catch up; then the verdict is logged and a
failed one makes Locust exit with 1 (``--pulsar-no-verdict`` turns that off). With
distributed Locust each process judges the messages its own producers sent.

Timings: ``sent_ns`` is ``time.time_ns()``, so end-to-end latency holds across processes
of one machine (or with synchronised clocks).
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Callable
from typing import Any, ClassVar

import gevent
import gevent.event
from locust import User, constant, events, task
from locust.env import Environment
from locust.exception import LocustError

# The client's names; Message and PulsarError are re-exported for the hooks' signatures.
from brokerlet.client import (
    AlreadyClosed,
    Client,
    Consumer,
    ConsumerType,
    InitialPosition,
    Message,
    MessageId,
    Producer,
    PulsarError,
    Timeout,
)
from brokerlet.delivery import Ledger, Verdict

__all__ = [
    "TRACK_PROPERTY",
    "DeliveryTracker",
    "DuplicateDeliveryError",
    "Message",
    "PulsarConsumerUser",
    "PulsarError",
    "PulsarProducerUser",
    "PulsarUser",
    "TrackedProducer",
    "delivery_tracker",
    "install_tracker",
]

log = logging.getLogger(__name__)

TRACK_PROPERTY = "brokerlet-track"
ORDERED_TYPES = frozenset({"KeyShared", "Key_Shared", "Failover", "Exclusive"})
_DEFAULT_DRAIN_SECONDS = 10.0
_TRACKER_ATTRIBUTE = "brokerlet_delivery_tracker"

SendDone = Callable[[PulsarError | None, MessageId | None], None]


class DuplicateDeliveryError(Exception):
    """A message handed to a subscription again without a redelivery count."""


# -- the books of one Locust process ------------------------------------------------------


class DeliveryTracker:
    """What this process's producers sent and its consumers received, and the verdict.

    Args:
        ledger: the books to keep; by default an empty ledger that subscriptions join as
            consumers subscribe.
        drain_seconds: how long consumers may catch up when the test stops.
        auto_verdict: stop publishing, drain, log the verdict and set the exit code when
            the test stops (a runner that steers the run itself turns it off).
    """

    def __init__(
        self,
        ledger: Ledger | None = None,
        *,
        drain_seconds: float = _DEFAULT_DRAIN_SECONDS,
        auto_verdict: bool = True,
    ) -> None:
        self.ledger = ledger if ledger is not None else Ledger([], ordered=False)
        self.run_id = uuid.uuid4().hex[:8]
        self.drain_seconds = drain_seconds
        self.auto_verdict = auto_verdict
        self.publishing_over = False
        self.caught_up = gevent.event.Event()
        self.finished = gevent.event.Event()  # the run is over; Locust stops users next
        self.foreign = 0  # deliveries of messages this process did not send
        self._keys: dict[str, int] = {}

    def key_number(self, key: str | None) -> int:
        """A small number for a key (the books are per producer and key number)."""
        if key is None:
            return 0
        number = self._keys.get(key)
        if number is None:
            number = self._keys[key] = len(self._keys) + 1
        return number

    def add_subscription(self, name: str, subscription_type: str) -> None:
        """Keep books for a subscription; per-key order is checked for ordered types."""
        self.ledger.add_subscription(name, ordered=subscription_type in ORDERED_TYPES)

    def stop_publishing(self) -> None:
        """End publishing; sends from now on wait for the end of the run instead."""
        self.publishing_over = True
        self.check_caught_up()

    def check_caught_up(self) -> None:
        """Set :attr:`caught_up` once publishing is over and every subscription has it all."""
        if self.publishing_over and self.ledger.caught_up():
            self.caught_up.set()

    def verdict(self) -> Verdict:
        """Check every message against every subscription (see :class:`Verdict`)."""
        return self.ledger.verdict()

    # Locust hooks (auto_verdict).

    def _on_test_stopping(self, environment: Environment, **_kwargs: object) -> None:
        if not self.auto_verdict or self.publishing_over:
            return
        self.stop_publishing()
        if self.ledger.subscriptions and not self.caught_up.wait(self.drain_seconds):
            log.warning(
                "consumers did not catch up within %.0f s of the end of publishing",
                self.drain_seconds,
            )

    def _on_quitting(self, environment: Environment, **_kwargs: object) -> None:
        self.finished.set()
        if not self.auto_verdict or not self.ledger.subscriptions or not self.ledger.sent:
            return
        verdict = self.verdict()
        log.info(
            "delivery verdict: %s; sent %d, receipted %d, lost %d, duplicates %d, "
            "redelivered %d, out of order %d",
            "PASS" if verdict.passed else "FAIL",
            verdict.sent,
            verdict.published,
            verdict.in_flight,
            verdict.duplicates,
            verdict.redelivered,
            verdict.order_violations,
        )
        if not verdict.passed:
            for violation in verdict.violations:
                log.error("delivery verdict: %s", violation)
            check = True
            if environment.parsed_options is not None:
                check = not getattr(environment.parsed_options, "pulsar_no_verdict", False)
            if check:
                environment.process_exit_code = 1


def delivery_tracker(environment: Environment) -> DeliveryTracker:
    """The tracker of ``environment`` (made on first use)."""
    tracker: DeliveryTracker | None = getattr(environment, _TRACKER_ATTRIBUTE, None)
    if tracker is None:
        drain = _DEFAULT_DRAIN_SECONDS
        if environment.parsed_options is not None:
            drain = getattr(environment.parsed_options, "pulsar_drain_seconds", drain)
        tracker = install_tracker(environment, DeliveryTracker(drain_seconds=drain))
    return tracker


def install_tracker(environment: Environment, tracker: DeliveryTracker) -> DeliveryTracker:
    """Make ``tracker`` the one :func:`delivery_tracker` returns for ``environment``."""
    setattr(environment, _TRACKER_ATTRIBUTE, tracker)
    environment.events.test_stopping.add_listener(tracker._on_test_stopping)  # type: ignore[no-untyped-call]
    environment.events.quitting.add_listener(tracker._on_quitting)  # type: ignore[no-untyped-call]
    return tracker


def _add_options(parser: Any, **_kwargs: object) -> None:
    group = parser.add_argument_group("brokerlet.locust")
    group.add_argument(
        "--pulsar-drain-seconds",
        type=float,
        default=_DEFAULT_DRAIN_SECONDS,
        help="when the test stops, how long consumers may catch up before the verdict",
    )
    group.add_argument(
        "--pulsar-no-verdict",
        action="store_true",
        default=False,
        help="do not fail the run (exit code 1) on a failed delivery verdict",
    )


events.init_command_line_parser.add_listener(_add_options)  # type: ignore[no-untyped-call]


# -- producers -----------------------------------------------------------------------------


class TrackedProducer:
    """A producer whose every message is numbered, stamped and reported."""

    def __init__(self, user: PulsarUser, topic: str, producer: Producer) -> None:
        self.user = user
        self.topic = topic
        self.producer = producer
        self.number = user.delivery.ledger.new_producer()
        self.sequence = 0

    def send_async(
        self,
        payload: bytes,
        *,
        key: str | None = None,
        properties: dict[str, str] | None = None,
        on_done: SendDone | None = None,
    ) -> None:
        """Send one message; the outcome fires a ``publish`` event, then ``on_done``."""
        user = self.user
        tracker = user.delivery
        sequence = self.sequence
        self.sequence += 1
        sent_ns = time.time_ns()
        stamped = dict(properties) if properties else {}
        stamped[TRACK_PROPERTY] = f"{tracker.run_id}:{self.number}:{sequence}:{sent_ns}"
        tracker.ledger.sending(self.number, sequence)
        started = time.perf_counter_ns()
        size = len(payload)

        def outcome(error: PulsarError | None, message_id: MessageId | None) -> None:
            elapsed_ns = time.perf_counter_ns() - started
            if error is None:
                tracker.ledger.receipted_send(self.number, sequence)
            else:
                tracker.ledger.failed_send(self.number, sequence)
            user.environment.events.request.fire(
                request_type="publish",
                name=self.topic,
                response_time=elapsed_ns / 1e6,
                response_length=size,
                exception=error,
                context={},
            )
            user.on_receipt(self.topic, elapsed_ns, error)
            if on_done is not None:
                on_done(error, message_id)
            if tracker.publishing_over:
                tracker.check_caught_up()

        self.producer.send_async(
            payload,
            outcome,
            partition_key=key,
            properties=stamped,
        )


# -- the user ------------------------------------------------------------------------------


class PulsarUser(User):
    """A Locust user with a brokerlet client of its own, on ``--host pulsar://...``.

    Class attributes:
        client_options: keyword arguments for :class:`brokerlet.Client`.
        producer_options: defaults for :meth:`producer` (``max_pending_messages``, ...).
    """

    abstract = True
    client_options: ClassVar[dict[str, Any]] = {}
    producer_options: ClassVar[dict[str, Any]] = {"block_if_queue_full": True}

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        if not self.host or not str(self.host).startswith(("pulsar://", "pulsar+ssl://")):
            raise LocustError(
                f"{type(self).__name__} needs a broker: --host pulsar://HOST:6650 "
                f"(got {self.host!r})"
            )
        self.delivery = delivery_tracker(environment)
        self.rng = random.Random()
        self.clients: list[Client] = []
        self._client: Client | None = None
        self._producers: dict[str, TrackedProducer] = {}
        self._subscriptions: dict[int, tuple[str, str]] = {}

    # -- clients -----------------------------------------------------------------------

    @property
    def client(self) -> Client:
        """This user's client (connected on first use)."""
        if self._client is None:
            self._client = self.new_client()
        return self._client

    @client.setter
    def client(self, client: Client) -> None:
        self._client = client

    def new_client(self, **options: Any) -> Client:
        """Another client (another connection) of this user, closed with it."""
        settings = {"operation_timeout_seconds": 30, **self.client_options, **options}
        client = Client(str(self.host), **settings)
        self.clients.append(client)
        return client

    def on_stop(self) -> None:
        """Close this user's clients (call it from an ``on_stop`` of your own)."""
        self.close()

    def close(self) -> None:
        """Close every client of this user; idempotent."""
        while self.clients:
            self.clients.pop().close()
        self._client = None
        self._producers.clear()

    # -- producing ---------------------------------------------------------------------

    def producer(self, topic: str, **options: Any) -> TrackedProducer:
        """This user's producer on ``topic`` (made on first use)."""
        producer = self._producers.get(topic)
        if producer is None:
            created = self.client.create_producer(topic, **{**self.producer_options, **options})
            producer = self._producers[topic] = TrackedProducer(self, topic, created)
        return producer

    def send_async(
        self,
        topic: str,
        payload: bytes = b"",
        *,
        key: str | None = None,
        properties: dict[str, str] | None = None,
        on_done: SendDone | None = None,
    ) -> None:
        """Send without waiting; the receipt fires a ``publish`` event."""
        if self.delivery.publishing_over:
            self.delivery.finished.wait()  # idle until Locust stops the users
            return
        self.producer(topic).send_async(payload, key=key, properties=properties, on_done=on_done)

    def send(
        self,
        topic: str,
        payload: bytes = b"",
        *,
        key: str | None = None,
        properties: dict[str, str] | None = None,
    ) -> MessageId | None:
        """Send and wait for the receipt; None when the send failed (the event says why)."""
        done = gevent.event.AsyncResult()
        self.send_async(
            topic,
            payload,
            key=key,
            properties=properties,
            on_done=lambda error, message_id: done.set((error, message_id)),
        )
        if self.delivery.publishing_over and not done.ready():
            return None
        error, message_id = done.get()
        return None if error is not None else message_id

    def on_receipt(self, topic: str, elapsed_ns: int, error: PulsarError | None) -> None:
        """Called after each send's outcome (override to record more)."""

    # -- consuming ---------------------------------------------------------------------

    def subscribe(
        self,
        topic: str,
        subscription: str,
        *,
        consumer_type: ConsumerType | str = ConsumerType.Shared,
        initial_position: InitialPosition = InitialPosition.Earliest,
        client: Client | None = None,
        **options: Any,
    ) -> Consumer:
        """Subscribe (on this user's client unless another is given) and keep delivery
        books for the subscription."""
        kind = ConsumerType[consumer_type] if isinstance(consumer_type, str) else consumer_type
        consumer = (client or self.client).subscribe(
            topic,
            subscription,
            consumer_type=kind,
            initial_position=initial_position,
            **options,
        )
        self.delivery.add_subscription(subscription, kind.name)
        self._subscriptions[id(consumer)] = (topic, subscription)
        return consumer

    def receive(
        self, consumer: Consumer, timeout_ms: int = 200, *, acknowledge: bool = True
    ) -> Message | None:
        """Receive one message (None after ``timeout_ms``), record and acknowledge it."""
        try:
            message = consumer.receive(timeout_millis=timeout_ms)
        except (Timeout, AlreadyClosed):
            return None
        self.delivered(consumer, message)
        if acknowledge:
            consumer.acknowledge(message)
        return message

    def delivered(self, consumer: Consumer, message: Message) -> None:
        """Book one received message and fire its event (``receive`` does this)."""
        now_ns = time.time_ns()
        tracker = self.delivery
        subscription = self._subscriptions.get(id(consumer), ("", consumer.subscription_name))[1]
        fire = self.environment.events.request.fire
        size = len(message.data())
        stamp = message.properties().get(TRACK_PROPERTY)
        parts = stamp.split(":") if stamp else []
        if len(parts) != 4 or parts[0] != tracker.run_id:
            tracker.foreign += 1
            fire(
                request_type="receive",
                name=subscription,
                response_time=0,
                response_length=size,
                exception=None,
                context={},
            )
            return
        producer, sequence, sent_ns = int(parts[1]), int(parts[2]), int(parts[3])
        redelivery_count = message.redelivery_count()
        key = tracker.key_number(message.partition_key() or None)
        first = tracker.ledger.delivered(subscription, producer, key, sequence, redelivery_count)
        elapsed_ns = now_ns - sent_ns
        if first:
            fire(
                request_type="e2e",
                name=subscription,
                response_time=elapsed_ns / 1e6,
                response_length=size,
                exception=None,
                context={},
            )
        elif redelivery_count > 0:
            fire(
                request_type="redelivery",
                name=subscription,
                response_time=0,
                response_length=size,
                exception=None,
                context={},
            )
        else:
            fire(
                request_type="duplicate",
                name=subscription,
                response_time=0,
                response_length=size,
                context={},
                exception=DuplicateDeliveryError(f"p{producer}#{sequence} delivered again"),
            )
        self.on_delivered(subscription, message, first, elapsed_ns)
        if tracker.publishing_over:
            tracker.check_caught_up()

    def on_delivered(
        self, subscription: str, message: Message, first: bool, elapsed_ns: int
    ) -> None:
        """Called after each booked delivery (override to record more)."""


# -- ready-made users -----------------------------------------------------------------------


class PulsarProducerUser(PulsarUser):
    """Publishes ``message_size``-byte messages on ``topic``, ``inflight`` at a time, with
    keys drawn from ``keys`` names."""

    abstract = True
    topic: ClassVar[str] = "brokerlet-locust"
    message_size: ClassVar[int] = 128
    keys: ClassVar[int] = 100
    inflight: ClassVar[int] = 1

    @task
    def publish(self) -> None:
        """Send ``inflight`` messages, then wait for their receipts."""
        outstanding = [self.inflight]
        done = gevent.event.Event()

        def one_done(_error: PulsarError | None, _message_id: MessageId | None) -> None:
            outstanding[0] -= 1
            if outstanding[0] == 0:
                done.set()

        payload = bytes(self.message_size)
        for _ in range(self.inflight):
            key = f"key-{self.rng.randrange(self.keys)}" if self.keys else None
            self.send_async(self.topic, payload, key=key, on_done=one_done)
            if self.delivery.publishing_over:
                return
        done.wait()


class PulsarConsumerUser(PulsarUser):
    """Receives and acknowledges everything on ``subscription`` of ``topic``."""

    abstract = True
    wait_time = constant(0)
    topic: ClassVar[str] = "brokerlet-locust"
    subscription: ClassVar[str] = "brokerlet-locust"
    subscription_type: ClassVar[str] = "Shared"
    drain_per_task: ClassVar[int] = 16

    def on_start(self) -> None:
        self.consumer = self.subscribe(
            self.topic, self.subscription, consumer_type=self.subscription_type
        )

    @task
    def consume(self) -> None:
        """Take the next message (waiting a little), then up to ``drain_per_task`` queued."""
        if self.receive(self.consumer, timeout_ms=200) is None:
            return
        for _ in range(self.drain_per_task):
            if self.receive(self.consumer, timeout_ms=0) is None:
                return
