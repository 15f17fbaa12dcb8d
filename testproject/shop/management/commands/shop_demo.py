"""``manage.py shop_demo seed|place|report`` — the shop's part of ``make demo``."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.test import Client

from jobs import JobScope
from sagas.models import SagaInstance
from testproject.shop.models import Basket, Notification, Order, Product
from workflows import RunStatus, WorkflowScope
from workflows.models import WorkflowRun

PRODUCTS = [
    ("MUG-1", "Ledon mug", Decimal("12.50"), 10),
    ("TEE-1", "Ledon T-shirt", Decimal("25.00"), 5),
]


class Command(BaseCommand):
    help = "Shop demo steps: seed products, place orders through the view, report."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "step", choices=["seed", "place", "report", "basket", "pay", "basket-report"]
        )

    def handle(self, *args: Any, **options: Any) -> None:
        getattr(self, options["step"].replace("-", "_"))()

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

    def basket(self) -> None:
        response = Client().post(
            "/shop/baskets/", {"email": "cy@example.com", "lines": "MUG-1:2,TEE-1:1"}
        )
        if response.status_code != 302:
            raise CommandError(f"placing a basket failed: HTTP {response.status_code}")
        number = response["Location"].rstrip("/").rsplit("/", 1)[-1]
        self.stdout.write(
            f"POST /shop/baskets/ -> basket {number}: 2 x MUG-1, 1 x TEE-1 (the basket row "
            "and its shop.basket workflow run in one transaction)"
        )

    def pay(self) -> None:
        for basket in Basket.objects.filter(status=Basket.Status.PLACED):
            run = WorkflowScope(basket.scope).get(basket.number)
            waiting = run.waiting_for if run else "-"
            response = Client().post(
                f"/shop/baskets/{basket.number}/pay/", {"card": "4242 4242 4242 4242"}
            )
            if response.status_code != 302:
                raise CommandError(f"paying {basket.number} failed: HTTP {response.status_code}")
            self.stdout.write(
                f"basket {basket.number} was waiting for {waiting}; POST "
                f"/shop/baskets/{basket.number}/pay/ -> payment recorded and signal 'paid' "
                "sent in one transaction"
            )

    def basket_report(self) -> None:
        wrong: list[str] = []
        for basket in Basket.objects.order_by("placed_at"):
            run = WorkflowScope(basket.scope).get(basket.number)
            if run is None:
                wrong.append(f"{basket.number} has no workflow run")
                continue
            steps = ", ".join(f"{step.key} ({step.kind}, {step.status})" for step in run.steps)
            self.stdout.write(f"{basket.number} run {run.status}: {steps}")
            self.stdout.write(f"  output {run.output}")
            price = run.step("price")
            if price is not None and price.items is not None:
                self.stdout.write(
                    f"  map 'price': {price.items.succeeded} of {price.items.total} items succeeded"
                )
            row = WorkflowRun.objects.get(scope_hash=run.scope_hash, run_id=run.run_id)
            self.stdout.write(f"  the picture: /admin/workflows/workflowrun/{row.pk}/change/")
            if run.status != RunStatus.SUCCEEDED or basket.status != Basket.Status.SHIPPED:
                wrong.append(f"{basket.number}: run {run.status}, basket {basket.status}")
        if wrong:
            raise CommandError("; ".join(wrong))
        self.stdout.write(self.style.SUCCESS("basket workflow finished: paid and shipped"))
