"""``manage.py shop_demo seed|place|report`` — the shop's part of ``make demo``."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.test import Client

from jobs import JobScope
from sagas.models import SagaInstance
from testproject.shop.models import Notification, Order, Product

PRODUCTS = [
    ("MUG-1", "Ledon mug", Decimal("12.50"), 10),
    ("TEE-1", "Ledon T-shirt", Decimal("25.00"), 5),
]


class Command(BaseCommand):
    help = "Shop demo steps: seed products, place orders through the view, report."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("step", choices=["seed", "place", "report"])

    def handle(self, *args: Any, **options: Any) -> None:
        getattr(self, options["step"])()

    def seed(self) -> None:
        for sku, name, price, stock in PRODUCTS:
            Product.objects.update_or_create(
                sku=sku, defaults={"name": name, "price": price, "stock": stock}
            )
        self.stdout.write(f"seeded {len(PRODUCTS)} products")

    def place(self) -> None:
        client = Client()
        for email, sku, quantity, card in [
            ("ada@example.com", "MUG-1", 2, "4242 4242 4242 4242"),
            ("bob@example.com", "TEE-1", 1, "4000 0000 0000 0002"),
        ]:
            response = client.post(
                "/shop/", {"email": email, "sku": sku, "quantity": quantity, "card": card}
            )
            if response.status_code != 302:
                raise CommandError(f"placing an order failed: HTTP {response.status_code}")
            number = response["Location"].rstrip("/").rsplit("/", 1)[-1]
            self.stdout.write(
                f"POST /shop/ -> order {number}: {quantity} x {sku} for {email} "
                "(order row, invoice job, OrderPlaced event and fulfilment saga in one "
                "transaction)"
            )

    def report(self) -> None:
        wrong: list[str] = []
        for order in Order.objects.order_by("placed_at"):
            saga = SagaInstance.objects.get(name="shop.fulfil", idempotency_key=order.number)
            invoice = JobScope(order.scope).get(order.invoice_job_id)
            mails = Notification.objects.filter(order_number=order.number).count()
            self.stdout.write(
                f"{order.number} {order.email:16} {order.get_status_display():9} "
                f"saga {saga.status} (done {saga.completed_steps}, compensated "
                f"{saga.compensated_steps}) invoice "
                f"{invoice.status if invoice else '-'} {order.invoice or ''} mails {mails}"
            )
            declined = order.card.endswith("0002")
            expected = Order.Status.CANCELLED if declined else Order.Status.FULFILLED
            if order.status != expected:
                wrong.append(f"{order.number} is {order.status}, expected {expected}")
            if mails != 1:
                wrong.append(f"{order.number} has {mails} confirmation mails, expected 1")
        for product in Product.objects.all():
            self.stdout.write(f"stock {product.sku}: {product.stock}")
        if wrong:
            raise CommandError("; ".join(wrong))
        self.stdout.write(self.style.SUCCESS("shop demo finished: every order ended as expected"))
