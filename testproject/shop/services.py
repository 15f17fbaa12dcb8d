"""Placing an order: one transaction for the order, its invoice job, its event and
its fulfilment saga — all four commit together or none does."""

from __future__ import annotations

import uuid

from jobs import JobSubmission, stage_job
from outbox import unit_of_work
from sagas import start_saga

from .events import OrderPlaced
from .models import Order, Product


class OrderRejected(Exception):
    pass


def place_order(*, email: str, sku: str, quantity: int, card: str) -> Order:
    if quantity < 1:
        raise OrderRejected("quantity must be at least 1")
    product = Product.objects.filter(sku=sku).first()
    if product is None:
        raise OrderRejected(f"unknown product {sku!r}")
    with unit_of_work() as uow:
        order = Order.objects.create(
            number=f"SO-{uuid.uuid4().hex[:8].upper()}",
            email=email,
            product=product,
            quantity=quantity,
            total=product.price * quantity,
            card=card,
        )
        stage_job(
            order.scope,
            order.invoice_job_id,
            JobSubmission.create("shop.invoice", {"order": order.number}, max_attempts=3),
        )
        uow.add_integration_event(OrderPlaced(order.number, email, order.total), key=order.number)
        start_saga(
            "shop.fulfil",
            {
                "order": order.number,
                "sku": sku,
                "quantity": quantity,
                "total": str(order.total),
                "card": card,
            },
            idempotency_key=order.number,
        )
    return order
