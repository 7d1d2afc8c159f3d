"""Delivery books for load generators: what was sent, what each subscription got, and the
verdict (lost, duplicated, out of order per key). Pure Python, no Locust, no gevent.
"""

from brokerlet.delivery.ledger import Ledger, SubscriptionVerdict, Verdict

__all__ = ["Ledger", "SubscriptionVerdict", "Verdict"]
