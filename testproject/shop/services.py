"""Placing an order: one transaction for the order, its invoice job, its event and
its fulfilment saga — all four commit together or none does."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import transaction

from jobs import JobSubmission, stage_job
from outbox import unit_of_work
from sagas import start_saga
from workflows import SignalOutcome, send_signal, stage_workflow

from .events import OrderPlaced
from .models import Basket, Order, Product


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


def place_basket(*, email: str, lines: list[dict[str, Any]]) -> Basket:
    """A basket and its workflow run in one transaction: both or neither."""
    if not lines:
        raise OrderRejected("a basket needs at least one line")
    known = set(
        Product.objects.filter(sku__in=[line["sku"] for line in lines]).values_list(
            "sku", flat=True
        )
    )
    for line in lines:
        if line["sku"] not in known:
            raise OrderRejected(f"unknown product {line['sku']!r}")
        if int(line["quantity"]) < 1:
            raise OrderRejected("quantity must be at least 1")
    with transaction.atomic():
        basket = Basket.objects.create(
            number=f"SB-{uuid.uuid4().hex[:8].upper()}", email=email, lines=lines
        )
        stage_workflow(
            basket.scope, basket.number, "shop.basket", {"number": basket.number, "lines": lines}
        )
    return basket


def pay_basket(number: str, *, card: str) -> SignalOutcome:
    """Record the payment and signal the basket's run, in one transaction: the run
    sees the payment if and only if it is recorded."""
    with transaction.atomic():
        basket = Basket.objects.select_for_update().get(number=number)
        Basket.objects.filter(pk=basket.pk).update(status=Basket.Status.PAID, paid_by=card[-4:])
        return send_signal(basket.scope, basket.number, "paid", {"by": f"card …{card[-4:]}"})
