"""State shared by every user of one run: the plan, the books, the clocks and the clients.

One :class:`RunContext` exists per run. The Locust users read the scenario from it, register
with it when connected, record into its ledger and histograms, and the runner and the
controllers (pause, churn) steer the run through its events. Everything lives on the load
generator's one gevent hub.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gevent.event

from brokerlet.client import Client
from brokerlet.client.connection import Connection
from brokerlet.delivery import Ledger
from loadtests.histograms import LatencyHistogram
from loadtests.scenarios import Scenario

if TYPE_CHECKING:
    from loadtests.users import ConsumerUser

__all__ = ["RunContext", "use_process_unique_consumer_ids"]


def use_process_unique_consumer_ids() -> None:
    """Number consumers uniquely across every connection of this process.

    The protocol only asks consumer ids to be unique per connection, and brokerlet's client
    counts from 0 on each connection. pulsar-lite 0.2.0 rejects a second consumer with the
    same id on one subscription even from another connection ("Consumer 0 already exists")
    and drops the connection. Unique ids are valid for every broker, so the load generator
    uses them against both, keeping the client identical for the comparison.
    """
    counter = itertools.count()

    def new_consumer_id(self: Connection) -> int:
        return next(counter)

    Connection.new_consumer_id = new_consumer_id  # type: ignore[method-assign]


class RunContext:
    """The shared state of one run.

    Args:
        scenario: what to run.
        service_url: the broker's ``pulsar://`` URL.
        topic: the topic's short name.
        seed: seeds the producers' key choices.
        fire_request: Locust's ``events.request.fire`` (set once the environment exists).
    """

    def __init__(self, scenario: Scenario, service_url: str, topic: str, seed: int) -> None:
        self.scenario = scenario
        self.service_url = service_url
        self.topic = topic
        self.seed = seed
        self.key_names = [f"key-{index}" for index in range(scenario.keys)]
        self.ledger = Ledger(scenario.subscription_names(), ordered=scenario.ordered)
        self.publish_latency = LatencyHistogram()
        self.e2e_latency = LatencyHistogram()
        self.e2e_by_subscription = {
            name: LatencyHistogram() for name in scenario.subscription_names()
        }
        self.loop_lag = LatencyHistogram()  # how late the generator's hub wakes up
        self.fire_request: Callable[..., Any] = _no_listener
        # The users' delivery books (brokerlet.locust); the runner steers the run itself.
        # Imported here: brokerlet.locust imports Locust, which only a run's process may.
        from brokerlet.locust import DeliveryTracker  # noqa: PLC0415

        self.tracker = DeliveryTracker(self.ledger, auto_verdict=False)
        # Steering: every user connected, publishing on, caught up after publishing.
        self.all_connected = gevent.event.Event()
        self.publishing = gevent.event.Event()
        self.caught_up = self.tracker.caught_up
        self.finished = self.tracker.finished  # the run is over; Locust stops the users next
        self._connected = 0
        self._consumer_slots = iter(range(scenario.consumers))
        self.consumer_users: dict[int, ConsumerUser] = {}
        self.delivered_by_slot = [0] * scenario.consumers
        self.clients: list[Client] = []
        # Clocks (perf_counter seconds); 0 until they happen.
        self.publishing_started = 0.0
        self.publishing_stopped = 0.0
        self.last_receipt = 0.0
        self.last_delivery = 0.0
        self.reports: dict[str, object] = {}

    # -- connecting ----------------------------------------------------------------------

    def claim_consumer_slot(self, user: ConsumerUser) -> tuple[int, str]:
        """A consumer user's slot number and subscription (slots fill subscriptions in turn)."""
        slot = next(self._consumer_slots)
        self.consumer_users[slot] = user
        names = self.scenario.subscription_names()
        return slot, names[slot % len(names)]

    def user_connected(self) -> None:
        """A user has its producer or consumer; the last one opens the run."""
        self._connected += 1
        if self._connected >= self.scenario.producers + self.scenario.consumers:
            self.all_connected.set()

    # -- progress ------------------------------------------------------------------------

    @property
    def publishing_over(self) -> bool:
        """Whether the publishing phase has ended."""
        return self.tracker.publishing_over

    def stop_publishing(self) -> None:
        """End the publishing phase; producers stop after their current send."""
        self.publishing.clear()
        self.publishing_stopped = time.perf_counter()
        self.tracker.stop_publishing()

    def check_caught_up(self) -> None:
        """Set :attr:`caught_up` once publishing is over and every subscription has it all."""
        self.tracker.check_caught_up()


def _no_listener(**_kwargs: object) -> None:
    """Stands in for Locust's request event until the environment exists."""
