"""Helpers shared by the data-rule tests (issue 14): brokers in memory and on disk, the
official client, bounded polls."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest
import requests

from brokerlet import Broker
from brokerlet.testing.waiting import wait_until

MIB = 1024 * 1024


def client_for(broker: Broker) -> pulsar.Client:
    quiet = logging.getLogger("tests.pulsar-client")
    quiet.setLevel(logging.WARNING)
    return pulsar.Client(broker.service_url, operation_timeout_seconds=5, logger=quiet)


def drain(consumer: pulsar.Consumer, wait_ms: int = 300, ack: bool = True) -> list[pulsar.Message]:
    got = []
    while True:
        try:
            message = consumer.receive(wait_ms)
        except pulsar.Timeout:
            return got
        got.append(message)
        if ack:
            consumer.acknowledge(message)


def await_passes(broker: Broker, service: str, count: int) -> None:
    """Wait (bounded) until the broker's ``retention`` or ``expiry`` service ran ``count``
    more complete passes: a check that nothing happened needs passes, not a stretch of time."""
    actor = broker._broker_actor
    assert actor is not None, "broker not started"

    def passes() -> int:
        value: int = getattr(actor.proxy(), service).get(timeout=5).passes
        return value

    target = passes() + count
    wait_until(
        passes,
        predicate=lambda value: value >= target,
        message=f"{count} {service} passes",
    )


def stats(broker: Broker, topic: str) -> dict[str, Any]:
    result = broker.topic_stats(topic)
    assert result is not None, f"topic {topic} is not loaded"
    return result


def admin(broker: Broker, method: str, path: str, body: object = None) -> requests.Response:
    return requests.request(
        method, f"{broker.web_service_url}/admin/v2/{path}", json=body, timeout=10
    )


def broker_factory(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., Broker]]:
    """Yields ``make(**settings)``: a started broker, on disk or in memory per the param."""
    made: list[Broker] = []

    def make(**settings: object) -> Broker:
        if request.param == "disk":
            settings = {"storage": "disk", "data_dir": str(tmp_path / "data"), **settings}
        broker = Broker(port=0, **settings)
        broker.start()
        made.append(broker)
        return broker

    yield make
    for broker in made:
        broker.stop()
