"""An example service on Pulsar: orders in, running totals per customer out."""

from orders_service.service import Order, OrderService

__all__ = ["Order", "OrderService"]
