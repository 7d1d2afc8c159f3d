"""Load-test the orders topic on any Pulsar broker:

    locust -f locustfile.py --headless -u 10 -r 10 -t 30s --host pulsar://127.0.0.1:6650
"""

from locust import constant_throughput, task
from orders_service import Order

from brokerlet.locust import PulsarUser

TOPIC = "persistent://public/default/orders"


class Shop(PulsarUser):
    """Places an order per task; the broker's receipt time is the ``publish`` event."""

    wait_time = constant_throughput(20)
    weight = 3

    @task
    def place_order(self):
        customer = f"customer-{self.rng.randrange(100)}"
        order = Order(f"o-{self.rng.getrandbits(48):x}", customer, self.rng.randrange(1, 10_000))
        self.send(TOPIC, order.encode(), key=customer)


class Billing(PulsarUser):
    """Totals orders; each first delivery is an ``e2e`` event, checked by the verdict."""

    weight = 1

    def on_start(self):
        self.consumer = self.subscribe(TOPIC, "billing", consumer_type="KeyShared")
        self.totals = {}

    @task
    def bill(self):
        message = self.receive(self.consumer, timeout_ms=200)
        if message is not None:
            order = Order.decode(message.data())
            self.totals[order.customer] = self.totals.get(order.customer, 0) + order.amount_cents
