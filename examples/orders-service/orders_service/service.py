"""Publishes orders to a topic and keeps each customer's running total from it.

The service takes any Pulsar client with the official client's method names: the official
``pulsar.Client`` in production, brokerlet's ``brokerlet.Client`` in gevent programs, and
whichever the ``pulsar_client`` fixture gives in tests.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Order:
    """One order: who, what, how much (in cents)."""

    order_id: str
    customer: str
    amount_cents: int

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> Order:
        fields = json.loads(data)
        return cls(str(fields["order_id"]), str(fields["customer"]), int(fields["amount_cents"]))


class OrderService:
    """Places orders on ``topic`` (keyed by customer) and totals them from ``subscription``."""

    def __init__(self, client: Any, topic: str, subscription: str = "billing") -> None:
        self.topic = topic
        self._producer = client.create_producer(topic)
        self._consumer = client.subscribe(topic, subscription)
        self.totals: dict[str, int] = defaultdict(int)
        self.processed = 0

    def place(self, order: Order) -> None:
        """Publish one order; returns once the broker stored it."""
        self._producer.send(order.encode(), partition_key=order.customer)

    def process(self, max_orders: int, timeout_ms: int = 1000) -> int:
        """Take up to ``max_orders`` orders (waiting up to ``timeout_ms`` for each) and add
        them to the totals; returns how many were taken."""
        taken = 0
        while taken < max_orders:
            try:
                message = self._consumer.receive(timeout_millis=timeout_ms)
            except Exception as error:  # both clients raise a class named Timeout
                if type(error).__name__ == "Timeout":
                    break
                raise
            order = Order.decode(message.data())
            self.totals[order.customer] += order.amount_cents
            self._consumer.acknowledge(message)
            taken += 1
        self.processed += taken
        return taken

    def close(self) -> None:
        self._producer.close()
        self._consumer.close()
