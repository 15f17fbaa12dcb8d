"""The orders demo's one use case, written once for both outbox set-ups."""

from __future__ import annotations

from decimal import Decimal

from outbox import unit_of_work

from .events import OrderCreated, OrderPlaced
from .models import Order


def place_order(number: str, total: Decimal) -> Order:
    """Create an order; after commit, ``OrderCreated`` reaches this process's
    subscribers and ``OrderPlaced`` is on its way to billing."""
    with unit_of_work() as uow:
        order = Order(number=number, total=total)
        order.record_event(OrderCreated(number))
        uow.save(order)
        uow.add_integration_event(
            OrderPlaced(number, order.total, order.placed_at), key=order.number
        )
    return order
