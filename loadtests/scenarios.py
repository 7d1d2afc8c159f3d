"""The named load-test scenarios: who publishes, who consumes, how fast, for how long.

A :class:`Scenario` is plain data, so the command line, the README and the summary can all
show exactly what ran. Defaults are sized for a 2-core machine on which the load generator
(one Python process) and the broker share the CPU; every number can be overridden from the
command line (see ``python -m loadtests run --help``).

This module imports neither Locust nor gevent, so it is safe to import anywhere.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = ["SCENARIOS", "SUBSCRIPTION_TYPES", "Scenario", "get_scenario"]

SUBSCRIPTION_TYPES = ("Shared", "KeyShared", "Failover", "Exclusive")

# Subscription types whose contract includes per-key order; a Shared subscription with
# several consumers may deliver one key out of order, so order is not checked there.
ORDERED_TYPES = frozenset({"KeyShared", "Failover", "Exclusive"})


@dataclass(frozen=True)
class Scenario:
    """One load-test configuration.

    Attributes:
        name: the scenario's name on the command line.
        summary: one line on what it shows.
        producers: producer users, each with its own client (connection) and producer.
        subscriptions: subscriptions ("applications") on the one topic.
        consumers_per_subscription: consumer users per subscription, each with its own client.
        subscription_type: Shared, KeyShared, Failover or Exclusive.
        rate: aggregate publish cap in messages per second; 0 publishes as fast as the
            producers' receipts allow (closed loop: saturation).
        inflight: messages each producer sends before waiting for their receipts.
        message_size: payload bytes (brokerlet.locust tracks each message in a property).
        keys: size of the key space that random keys are drawn from.
        duration: seconds of publishing (after every user is connected).
        drain_timeout: seconds consumers get after publishing stops to receive the rest.
        receiver_queue_size: each consumer's receiver queue (its permits).
        pause_at: slow-consumer only: seconds into publishing when consumer 0 pauses.
        pause_seconds: slow-consumer only: how long consumer 0 stops reading its socket.
        churn_interval: churn only: seconds between one consumer leaving and a new one joining.
    """

    name: str
    summary: str
    producers: int
    subscriptions: int
    consumers_per_subscription: int
    subscription_type: str
    rate: float
    inflight: int = 1
    message_size: int = 128
    keys: int = 1000
    duration: float = 60.0
    drain_timeout: float = 20.0
    receiver_queue_size: int = 1000
    pause_at: float = 0.0
    pause_seconds: float = 0.0
    churn_interval: float = 0.0

    @property
    def consumers(self) -> int:
        """Consumer users over all subscriptions."""
        return self.subscriptions * self.consumers_per_subscription

    @property
    def ordered(self) -> bool:
        """Whether the subscription type promises per-key order (so the verdict checks it)."""
        return self.subscription_type in ORDERED_TYPES

    def subscription_names(self) -> list[str]:
        """The subscriptions' names: ``app-0``, ``app-1``, ..."""
        return [f"app-{index}" for index in range(self.subscriptions)]

    def with_overrides(self, **changes: object) -> Scenario:
        """A copy with the given fields changed (None values are ignored).

        A shorter ``duration`` also moves the slow consumer's pause inside the run.
        """
        given = {key: value for key, value in changes.items() if value is not None}
        scenario = dataclasses.replace(self, **given)  # type: ignore[arg-type]
        if scenario.pause_seconds and "pause_at" not in given and "pause_seconds" not in given:
            scenario = scenario._fit_pause()
        return scenario

    def _fit_pause(self) -> Scenario:
        # Keep at least a third of the run after the pause, so the drain starts from a
        # consumer that has caught up; scale both numbers down together otherwise.
        if self.pause_at + self.pause_seconds <= self.duration * 0.7:
            return self
        share = round(self.duration * 0.35, 2)
        return dataclasses.replace(self, pause_at=share, pause_seconds=share)

    def describe(self) -> dict[str, object]:
        """The configuration as a flat dict, for the printed header and summary.json."""
        described = dataclasses.asdict(self)
        described["consumers"] = self.consumers
        described["rate"] = self.rate or "unlimited (closed loop)"
        return described

    def smoke(self) -> Scenario:
        """A few-seconds version with fewer users, for the pytest smoke test."""
        return dataclasses.replace(self, **_SMOKE[self.name])


SCENARIOS: dict[str, Scenario] = {
    scenario.name: scenario
    for scenario in (
        Scenario(
            name="key-shared-500x20",
            summary="500 producers, 20 consumers on one Key_Shared subscription, random keys, "
            "unbatched 128-byte messages under an aggregate rate cap",
            producers=500,
            subscriptions=1,
            consumers_per_subscription=20,
            subscription_type="KeyShared",
            rate=1500,
            duration=60,
        ),
        Scenario(
            name="telemetry-high-rate",
            summary="a fixed publish rate below saturation fanned out to five subscriptions "
            "(applications); publish and end-to-end latency and backlog over time",
            producers=10,
            subscriptions=5,
            consumers_per_subscription=2,
            subscription_type="Shared",
            rate=800,
            duration=60,
        ),
        Scenario(
            name="slow-consumer",
            summary="Key_Shared, ten consumers; consumer 0 stops reading its socket for ten "
            "seconds; the other nine's delivery rate during the pause against before it",
            producers=20,
            subscriptions=1,
            consumers_per_subscription=10,
            subscription_type="KeyShared",
            rate=1000,
            duration=40,
            pause_at=12,
            pause_seconds=10,
        ),
        Scenario(
            name="churn",
            summary="Key_Shared; every second one consumer leaves and a new one joins while "
            "the producers run",
            producers=20,
            subscriptions=1,
            consumers_per_subscription=6,
            subscription_type="KeyShared",
            rate=800,
            duration=30,
            churn_interval=1.0,
        ),
    )
}

# Smoke versions: the same shape, fewer users and lower rates, so all four run in well under
# a minute on two cores. The duration comes from the command line.
_SMOKE: dict[str, dict[str, Any]] = {
    "key-shared-500x20": {"producers": 100, "consumers_per_subscription": 10, "rate": 500,
                          "drain_timeout": 10.0},
    "telemetry-high-rate": {"producers": 5, "rate": 300, "drain_timeout": 10.0},
    "slow-consumer": {"producers": 10, "rate": 300, "pause_at": 1.0, "pause_seconds": 1.5,
                      "drain_timeout": 10.0},
    "churn": {"producers": 10, "rate": 300, "churn_interval": 0.5, "drain_timeout": 10.0},
}


def get_scenario(name: str) -> Scenario:
    """The scenario called ``name``.

    Raises:
        KeyError: no such scenario (the message lists the known ones).
    """
    try:
        return SCENARIOS[name]
    except KeyError:
        raise KeyError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}") from None
