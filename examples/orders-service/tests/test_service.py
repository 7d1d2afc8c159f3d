"""The service against a broker from brokerlet's pytest plugin (no fixtures of our own)."""

import pytest
from orders_service import Order, OrderService

from brokerlet.testing.helpers import assert_payloads, read_all, wait_for_backlog


@pytest.fixture
def service(pulsar_client, pulsar_topic):
    service = OrderService(pulsar_client, pulsar_topic)
    yield service
    service.close()


def test_totals_per_customer(service):
    service.place(Order("o-1", "ada", 1200))
    service.place(Order("o-2", "bob", 500))
    service.place(Order("o-3", "ada", 300))
    assert service.process(3) == 3
    assert service.totals == {"ada": 1500, "bob": 500}


def test_orders_wait_in_the_backlog_until_processed(service, pulsar_client, pulsar_admin_url):
    orders = [Order(f"o-{n}", "carol", n) for n in range(4)]
    for order in orders:
        service.place(order)
    wait_for_backlog(pulsar_admin_url, service.topic, "billing", 4)
    assert_payloads(read_all(pulsar_client, service.topic), [o.encode() for o in orders])
    assert service.process(10, timeout_ms=300) == 4
    wait_for_backlog(pulsar_admin_url, service.topic, "billing", 0)


@pytest.mark.brokerlet(dispatcherMaxReadBatchSize=1)
def test_on_a_broker_of_its_own(service):
    service.place(Order("o-9", "dan", 42))
    assert service.process(1) == 1
    assert service.totals["dan"] == 42
